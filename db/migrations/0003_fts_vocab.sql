-- 0003_fts_vocab: per-term document counts of the FTS5 index (no storage of its own), used to
-- weight query keywords by IDF when the lexical branch decides which hits may vote in fusion.
CREATE VIRTUAL TABLE chunks_fts_vocab USING fts5vocab(chunks_fts, 'row');
