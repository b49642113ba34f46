-- 0006_nfc_sources (PostgreSQL): document names are stored in NFC, as db/migrations/0008_nfc_sources.py
-- does on SQLite (why: there). A name whose NFC form another document of its collection already
-- holds is left as it is (and of several non-NFC spellings of one name, all but the first). A
-- server whose encoding is not UTF8 refuses normalize(); its names are left as they are.

DO $$
BEGIN
    IF current_setting('server_encoding') = 'UTF8' THEN
        UPDATE documents d SET source = normalize(d.source, NFC)
        WHERE d.source IS NOT NFC NORMALIZED
          AND NOT EXISTS (SELECT 1 FROM documents o
                          WHERE o.collection_id = d.collection_id AND o.source = normalize(d.source, NFC))
          AND d.id = (SELECT min(t.id) FROM documents t
                      WHERE t.collection_id = d.collection_id
                        AND normalize(t.source, NFC) = normalize(d.source, NFC));
    END IF;
END
$$;
