-- 0002_row_level_security: the second net under the application's access filter.
-- Every reader query runs in a transaction that does SET LOCAL ROLE rag_reader and
-- set_config('rag.access_keys', '{...}', true) (rag.pg.reader). rag_reader may only SELECT, and
-- on documents, chunks and chunk_vectors only the rows whose access key was set: no setting, no
-- rows (fail closed). The owner (ingest, status, migrations) is not subject to these policies.
-- Creating the role needs CREATEROLE once; without it, a DBA runs the two statements of the DO
-- block by hand (docs/architecture.md, "PostgreSQL").

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'rag_reader') THEN
        CREATE ROLE rag_reader NOLOGIN NOSUPERUSER NOBYPASSRLS;
    END IF;
    IF NOT pg_has_role(current_user, 'rag_reader', 'MEMBER') THEN
        EXECUTE format('GRANT rag_reader TO %I', current_user);
    END IF;
END $$;

-- The reader's allowed access keys, from the transaction's setting; '' or unset means none.
CREATE FUNCTION rag_access_keys() RETURNS bigint[] LANGUAGE sql STABLE
    RETURN coalesce(nullif(current_setting('rag.access_keys', true), ''), '{}')::bigint[];

GRANT USAGE ON SCHEMA public TO rag_reader;
GRANT SELECT ON meta, collections, access_keys, documents, chunks, chunk_vectors, fts_postings, fts_terms, fts_totals,
    vector_counts
    TO rag_reader;
GRANT EXECUTE ON FUNCTION rag_access_keys() TO rag_reader;

-- BM25's document count of a phrase over EVERY chunk, as FTS5's bm25() counts it whoever asks
-- (rag.pg_retrieval): a count, never a row, so readers rank by the same statistics on both backends.
CREATE FUNCTION rag_phrase_docs(phrase tsquery) RETURNS bigint LANGUAGE sql STABLE
    SECURITY DEFINER SET search_path = public
    RETURN (SELECT count(*) FROM chunks WHERE fts @@ phrase);
REVOKE EXECUTE ON FUNCTION rag_phrase_docs(tsquery) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION rag_phrase_docs(tsquery) TO rag_reader;

ALTER TABLE documents ENABLE ROW LEVEL SECURITY;
ALTER TABLE chunks ENABLE ROW LEVEL SECURITY;
ALTER TABLE chunk_vectors ENABLE ROW LEVEL SECURITY;
ALTER TABLE fts_postings ENABLE ROW LEVEL SECURITY;

CREATE POLICY documents_reader ON documents FOR SELECT TO rag_reader
    USING (access_key = ANY (rag_access_keys()));
CREATE POLICY chunks_reader ON chunks FOR SELECT TO rag_reader
    USING (access_key = ANY (rag_access_keys()));
CREATE POLICY chunk_vectors_reader ON chunk_vectors FOR SELECT TO rag_reader
    USING (acl = ANY (rag_access_keys()));
CREATE POLICY fts_postings_reader ON fts_postings FOR SELECT TO rag_reader
    USING (acl = ANY (rag_access_keys()));
