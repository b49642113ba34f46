-- 0007_window_vectors: one float vector per sentence window of a chunk (issue 16). A chunk longer
-- than one window (rag.chunking.sentence_windows, settings.window_chars) also gets the vectors of
-- its windows, each embedding the chunk's header and a few whole sentences. The dense branch
-- rescores its own candidates with them (rag.retrieval.rescore_by_windows): a chunk whose best
-- window is nearer than the chunk itself moves up. They never select a chunk on their own, so the
-- access filter of the dense branch stays the only one that decides what a reader can see.
-- Deleting a chunk deletes its windows (foreign key, as chunk_vectors).

CREATE TABLE window_vectors (
    chunk_id  INTEGER NOT NULL REFERENCES chunks(id) ON DELETE CASCADE,
    ordinal   INTEGER NOT NULL,               -- 0-based, in content order
    embedding BLOB NOT NULL,                  -- float32 little-endian, L2-normalised (as chunk_vectors)
    PRIMARY KEY (chunk_id, ordinal)
) WITHOUT ROWID;
