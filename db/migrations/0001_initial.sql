-- 0001_initial: documents, chunks, FTS5 over chunks, collections and access keys.
-- Vector tables (vec0) depend on the embedding dimension and are created by
-- rag.store.ensure_vector_table() when a collection with a new dimension appears.

CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- One embedding model per collection, stamped at creation and never mixed.
CREATE TABLE collections (
    id           INTEGER PRIMARY KEY,
    name         TEXT NOT NULL UNIQUE,
    embedder     TEXT NOT NULL,              -- embedding model id
    dimension    INTEGER NOT NULL,
    metric       TEXT NOT NULL DEFAULT 'cosine',
    strategy     TEXT NOT NULL DEFAULT 'E',  -- chunking strategy used for new documents
    max_distance REAL,                       -- calibrated gate threshold; NULL = settings default
    created_at   TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

-- A distinct set of groups; documents carry one key so that one integer filter
-- (`acl IN (...)`) can run inside the vec0 KNN query and the FTS5 query alike.
CREATE TABLE access_keys (
    id     INTEGER PRIMARY KEY,
    groups TEXT NOT NULL UNIQUE              -- JSON array, sorted and deduplicated
);

CREATE TABLE documents (
    id                INTEGER PRIMARY KEY,
    collection_id     INTEGER NOT NULL REFERENCES collections(id) ON DELETE CASCADE,
    source            TEXT NOT NULL,         -- path relative to the ingest root
    path              TEXT NOT NULL,         -- absolute path when ingested (for re-extraction)
    title             TEXT NOT NULL DEFAULT '',
    groups            TEXT NOT NULL DEFAULT '["all"]',
    access_key        INTEGER NOT NULL REFERENCES access_keys(id),
    content_hash      TEXT,                  -- sha256 over bytes + embedder id + pipeline version
    bytes_hash        TEXT,                  -- sha256 of the file bytes alone
    canonical_text    TEXT,                  -- NFC, LF; every offset refers to this
    extractor         TEXT,
    extractor_version TEXT,
    status            TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'ok', 'failed')),
    error             TEXT,
    chunk_count       INTEGER NOT NULL DEFAULT 0,
    embedder          TEXT,
    dimension         INTEGER,
    pipeline_version  TEXT,
    created_at        TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    updated_at        TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    UNIQUE (collection_id, source)
);

CREATE TABLE chunks (
    id            INTEGER PRIMARY KEY,
    document_id   INTEGER NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
    collection_id INTEGER NOT NULL,          -- copied from the document: filters need no join
    access_key    INTEGER NOT NULL,          -- copied from the document, see access_keys
    ordinal       INTEGER NOT NULL,
    section       TEXT NOT NULL,             -- "Title > H1 > H2"
    text          TEXT NOT NULL,             -- what is embedded: contextual header + content
    content       TEXT NOT NULL,             -- canonical_text[char_from:char_to], shown to users
    char_from     INTEGER NOT NULL,
    char_to       INTEGER NOT NULL,
    page          INTEGER,
    token_count   INTEGER NOT NULL,
    truncated     INTEGER NOT NULL DEFAULT 0,
    kind          TEXT NOT NULL DEFAULT 'text',
    fts_heading   TEXT NOT NULL,             -- folded title + section path (FTS5 column 1)
    fts_body      TEXT NOT NULL,             -- folded content (FTS5 column 2)
    UNIQUE (document_id, ordinal)
);
CREATE INDEX chunks_collection_access ON chunks (collection_id, access_key);

-- External-content FTS5 index over chunks, kept in sync by triggers.
-- Text is folded in Python (rag.text.fold: NFC, casefold, tones and đ removed) because
-- unicode61's own diacritic folding is inconsistent for Vietnamese letters with two marks.
-- Repair path: INSERT INTO chunks_fts(chunks_fts) VALUES('rebuild');
CREATE VIRTUAL TABLE chunks_fts USING fts5(
    fts_heading,
    fts_body,
    content = 'chunks',
    content_rowid = 'id',
    tokenize = 'unicode61 remove_diacritics 0'
);

CREATE TRIGGER chunks_ai AFTER INSERT ON chunks BEGIN
    INSERT INTO chunks_fts (rowid, fts_heading, fts_body)
    VALUES (new.id, new.fts_heading, new.fts_body);
END;

CREATE TRIGGER chunks_ad AFTER DELETE ON chunks BEGIN
    INSERT INTO chunks_fts (chunks_fts, rowid, fts_heading, fts_body)
    VALUES ('delete', old.id, old.fts_heading, old.fts_body);
END;

CREATE TRIGGER chunks_au AFTER UPDATE ON chunks BEGIN
    INSERT INTO chunks_fts (chunks_fts, rowid, fts_heading, fts_body)
    VALUES ('delete', old.id, old.fts_heading, old.fts_body);
    INSERT INTO chunks_fts (rowid, fts_heading, fts_body)
    VALUES (new.id, new.fts_heading, new.fts_body);
END;
