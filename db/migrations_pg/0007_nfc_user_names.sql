-- 0007_nfc_user_names (PostgreSQL): user names are stored in NFC, as db/migrations/0009_nfc_user_names.py
-- does on SQLite (why: there). A name whose NFC form another user already holds (compared as the
-- unique index users_name does, lower(name COLLATE "C")) is left as it is, and of several non-NFC
-- spellings of one name all but the first. A server whose encoding is not UTF8 refuses normalize();
-- its names are left as they are.

DO $$
BEGIN
    IF current_setting('server_encoding') = 'UTF8' THEN
        UPDATE users u SET name = normalize(u.name, NFC)
        WHERE u.name IS NOT NFC NORMALIZED
          AND NOT EXISTS (SELECT 1 FROM users o
                          WHERE lower(o.name COLLATE "C") = lower(normalize(u.name, NFC) COLLATE "C"))
          AND u.id = (SELECT min(t.id) FROM users t
                      WHERE lower(normalize(t.name, NFC) COLLATE "C") = lower(normalize(u.name, NFC) COLLATE "C"));
    END IF;
END
$$;
