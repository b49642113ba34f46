-- 0005_team: team mode (issue 20): users with a role and groups, sign-in sessions, failed
-- sign-ins for lockout, and the audit log. Unused in desktop mode (auth = false).
-- Times are UTC text in the format of every other table ('%Y-%m-%dT%H:%M:%fZ'), so they
-- compare correctly as strings. Users are disabled, never deleted: the audit log keeps naming them.

CREATE TABLE users (
    id            INTEGER PRIMARY KEY,
    name          TEXT NOT NULL UNIQUE COLLATE NOCASE,  -- "Alice" and "alice" are one user
    password_hash TEXT NOT NULL,             -- argon2id PHC string (salt and parameters inside); never the password
    role          TEXT NOT NULL DEFAULT 'reader' CHECK (role IN ('reader', 'editor', 'admin')),
    groups        TEXT NOT NULL DEFAULT '["all"]',  -- JSON array, as documents.groups (rag.store.normalize_groups)
    disabled      INTEGER NOT NULL DEFAULT 0 CHECK (disabled IN (0, 1)),
    created_at    TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    updated_at    TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX users_role ON users (role, disabled);

-- One row per signed-in browser session. The token itself lives only in that session; the
-- database keeps its SHA-256, so a copy of this file cannot be used to take over a session.
CREATE TABLE sessions (
    token_hash TEXT PRIMARY KEY,             -- sha256 hex of the secrets.token_urlsafe token
    user_id    INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    created_at TEXT NOT NULL,
    last_seen  TEXT NOT NULL,                -- moved forward on every use (sliding expiry)
    expires_at TEXT NOT NULL                 -- last_seen + the idle timeout in force then
);
CREATE INDEX sessions_user ON sessions (user_id);
CREATE INDEX sessions_expires ON sessions (expires_at);

-- Failed sign-ins, per name typed, for lockout and back-off. The name is kept as the SHA-256 of
-- its case-folded form: people type their password into the name box, and an unknown name must
-- count like a known one (so lockout does not tell which names exist).
CREATE TABLE sign_in_failures (
    id        INTEGER PRIMARY KEY,
    name_hash TEXT NOT NULL,
    at        TEXT NOT NULL
);
CREATE INDEX sign_in_failures_name ON sign_in_failures (name_hash, at);

-- Who did what, when. `user_name` is copied (NULL: the command line, or a name that does not
-- exist); `detail` is a JSON object, e.g. {"question": ..., "status": ..., "cited": [...]}.
-- Never a password, a password hash or a session token (rag.auth.record refuses such keys).
CREATE TABLE audit_log (
    id        INTEGER PRIMARY KEY,
    at        TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    user_id   INTEGER REFERENCES users(id) ON DELETE SET NULL,
    user_name TEXT COLLATE NOCASE,
    action    TEXT NOT NULL,                 -- ask | sign_in | sign_in_failed | user_add | ... (rag.auth)
    detail    TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_log_at ON audit_log (at);
CREATE INDEX audit_log_user ON audit_log (user_name, at);
CREATE INDEX audit_log_action ON audit_log (action, at);
