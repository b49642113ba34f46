-- 0004_window_vectors: the sentence-window vectors of db/migrations/0007 (issue 16), with the
-- chunk's access key so that row-level security guards them like chunk_vectors. Only the dense
-- branch's own (access-filtered) candidates are looked up in it (rag.pg_retrieval.window_distances).

CREATE TABLE window_vectors (
    chunk_id  bigint NOT NULL REFERENCES chunks(id) ON DELETE CASCADE,
    ordinal   integer NOT NULL,
    acl       bigint NOT NULL,
    embedding vector NOT NULL,
    PRIMARY KEY (chunk_id, ordinal)
);

GRANT SELECT ON window_vectors TO rag_reader;
ALTER TABLE window_vectors ENABLE ROW LEVEL SECURITY;
CREATE POLICY window_vectors_reader ON window_vectors FOR SELECT TO rag_reader
    USING (acl = ANY (rag_access_keys()));
