"""Team mode library (rag.auth): hashing, sign-in, lockout, sessions, roles, audit log, and the
copy of users and log between databases; every test that touches a database runs on SQLite and on
PostgreSQL (tests/conftest.py)."""

from __future__ import annotations

import csv
import hashlib
import io
import re
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from argon2 import PasswordHasher

from rag import auth, store
from rag.config import load_settings
from rag.errors import AuthError, LockedOutError, NotFoundError, PermissionDeniedError, RagError
from rag.records import Answer, Citation, Hit

from .conftest import database_error, migration_named

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
PASSWORD = "correct horse battery"
POLICY = auth.SignInPolicy(idle_timeout=timedelta(minutes=60), lockout_failures=5,
                           lockout_window=timedelta(minutes=15))


class SpyHasher(PasswordHasher):
    """argon2 with tiny costs (tests run hundreds of hashes) that counts verify calls."""

    def __init__(self, time_cost: int = 1) -> None:
        super().__init__(time_cost=time_cost, memory_cost=8, parallelism=1)
        self.verified: list[str] = []

    def verify(self, hash: str | bytes, password: str | bytes) -> bool:
        self.verified.append(str(hash))
        return super().verify(hash, password)


@pytest.fixture
def db_path(backend_db: Path | str) -> Path | str:
    """Every test here runs on SQLite and on PostgreSQL (tests/conftest.py)."""
    return backend_db


@pytest.fixture(autouse=True)
def fast_hasher(monkeypatch: pytest.MonkeyPatch) -> SpyHasher:
    hasher = SpyHasher()
    monkeypatch.setattr(auth, "PASSWORD_HASHER", hasher)
    return hasher


@pytest.fixture
def alice(conn: store.Connection) -> auth.User:
    return auth.add_user(conn, "alice", PASSWORD, role="reader", groups=["hr", "eng"])


@pytest.fixture
def admin(conn: store.Connection) -> auth.User:
    return auth.add_user(conn, "root", "admin-password", role="admin")


def columns(conn: store.Connection, table: str) -> list[str]:
    if store.is_postgres(conn):
        return [r[0] for r in conn.execute("SELECT column_name FROM information_schema.columns WHERE "
                                           "table_schema = 'public' AND table_name = ? ORDER BY ordinal_position",
                                           (table,))]
    return [r["name"] for r in conn.execute(f"PRAGMA table_info({table})")]


def indexes(conn: store.Connection) -> set[str]:
    if store.is_postgres(conn):
        return {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = 'public'")}
    return {r["name"] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}


def dump(conn: store.Connection) -> str:
    """Every row of every table as text (pysqlite3 has no iterdump)."""
    if store.is_postgres(conn):
        tables = [r[0] for r in conn.execute("SELECT table_name FROM information_schema.tables WHERE "
                                             "table_schema = 'public' AND table_type = 'BASE TABLE'")]
    else:
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND sql NOT LIKE 'CREATE VIRTUAL%'")]
    return "\n".join(dump_table(conn, table) for table in tables)


# ---------------------------------------------------------------------------------------------
# Migration and settings


def test_migration_0005_creates_the_team_tables_with_exact_columns_and_indexes(conn: store.Connection) -> None:
    # db/migrations/0005_team.sql, and on PostgreSQL db/migrations_pg/0005_team.sql, column for column
    if store.is_postgres(conn):
        from rag import pg

        assert "0005_team" in pg.applied_migrations(conn)
    else:
        assert "0005_team" in store.applied_migrations(conn)
    assert columns(conn, "users") == ["id", "name", "password_hash", "role", "groups", "disabled", "created_at",
                                      "updated_at"]
    assert columns(conn, "sessions") == ["token_hash", "user_id", "created_at", "last_seen", "expires_at"]
    assert columns(conn, "sign_in_failures") == ["id", "name_hash", "at"]
    assert columns(conn, "audit_log") == ["id", "at", "user_id", "user_name", "action", "detail"]
    assert {"users_role", "sessions_user", "sessions_expires", "sign_in_failures_name", "audit_log_at",
            "audit_log_user", "audit_log_action"} <= indexes(conn)
    with pytest.raises(database_error(conn)):
        conn.execute("INSERT INTO users (name, password_hash, role) VALUES ('x', 'h', 'superuser')")
    with pytest.raises(database_error(conn)):
        conn.execute("INSERT INTO users (name, password_hash, disabled) VALUES ('x', 'h', 2)")
    row = conn.execute("SELECT * FROM users WHERE id = ?", (auth.add_user(conn, "x", PASSWORD).id,)).fetchone()
    assert (row["role"], row["groups"], row["disabled"]) == ("reader", '["all"]', 0)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", row["created_at"])  # the UTC text of every table


def test_names_are_unique_ignoring_ascii_case_in_the_database_itself(conn: store.Connection) -> None:
    """The schema refuses a second "Alice" even past rag.auth (SQLite: COLLATE NOCASE; PostgreSQL:
    the unique index on lower(name COLLATE "C")), and folds exactly what NOCASE folds."""
    insert = "INSERT INTO users (name, password_hash) VALUES (?, 'h')"
    conn.execute(insert, ("Alice",))
    for clash in ("alice", "ALICE", "aLiCe"):
        with pytest.raises(database_error(conn)):
            conn.execute(insert, (clash,))
    conn.execute(insert, ("Ánh",))
    conn.execute(insert, ("ánh",))  # NOCASE folds the 26 ASCII letters only: two names on both backends
    assert [u.name for u in auth.list_users(conn)] == ["Alice", "Ánh", "ánh"]  # NOCASE order on both
    assert auth.get_user(conn, "ALICE").name == "Alice"
    assert auth.get_user(conn, "ÁNH").name == "Ánh" and auth.get_user(conn, "áNH").name == "ánh"


def test_team_settings_have_defaults_validate_and_read_rag_auth(monkeypatch: pytest.MonkeyPatch) -> None:
    s = load_settings()
    assert (s.auth, s.session_idle_minutes, s.audit_retention_days, s.lockout_failures, s.lockout_minutes) == (
        False, 60, 365, 5, 15)
    for name in ("session_idle_minutes", "lockout_failures", "lockout_minutes"):
        with pytest.raises(RagError, match=f"{name} must be at least 1"):
            load_settings(**{name: 0})
    with pytest.raises(RagError, match="audit_retention_days must be 0"):
        load_settings(audit_retention_days=-1)
    assert load_settings(audit_retention_days=0).audit_retention_days == 0
    monkeypatch.setenv("RAG_AUTH", "1")
    assert load_settings().auth is True
    policy = auth.SignInPolicy.from_settings(load_settings(session_idle_minutes=5, lockout_minutes=3))
    assert policy == auth.SignInPolicy(timedelta(minutes=5), 5, timedelta(minutes=3))


# ---------------------------------------------------------------------------------------------
# Users and passwords


def test_password_is_stored_as_an_argon2id_hash_only(conn: store.Connection, alice: auth.User) -> None:
    row = conn.execute("SELECT * FROM users WHERE name = 'alice'").fetchone()
    assert row["password_hash"].startswith("$argon2id$") and PASSWORD not in row["password_hash"]
    assert PasswordHasher().verify(row["password_hash"], PASSWORD)
    assert PASSWORD not in dump(conn)
    assert alice.groups == ["eng", "hr"] and alice.role == "reader" and not alice.disabled


@pytest.mark.parametrize(("password", "message"), [
    ("", "the password is empty"),
    ("seven77", "at least 8 characters"),
    ("x" * (auth.MAX_PASSWORD_LENGTH + 1), "at most 1024 characters"),
])
def test_password_rules_refuse_before_anything_is_written(conn: store.Connection, password: str,
                                                          message: str) -> None:
    with pytest.raises(AuthError, match=message):
        auth.add_user(conn, "bob", password)
    assert auth.list_users(conn) == []


def test_names_are_checked_and_unique_ignoring_case(conn: store.Connection, alice: auth.User) -> None:
    for bad in ("", "two words", "x" * 65, "semi;colon"):
        with pytest.raises(AuthError, match="invalid user name"):
            auth.add_user(conn, bad, PASSWORD)
    with pytest.raises(AuthError, match="already exists"):
        auth.add_user(conn, "ALICE", PASSWORD)
    assert auth.get_user(conn, " Alice ") == alice
    assert auth.add_user(conn, "trần.văn-an@x", PASSWORD).name == "trần.văn-an@x"
    with pytest.raises(AuthError, match="unknown role"):
        auth.add_user(conn, "carol", PASSWORD, role="owner")
    with pytest.raises(NotFoundError, match="no user named 'nobody'"):
        auth.set_role(conn, "nobody", "admin")


def test_last_enabled_admin_cannot_be_disabled_or_demoted(conn: store.Connection, admin: auth.User) -> None:
    assert auth.has_admin(conn)
    with pytest.raises(AuthError, match="only enabled admin"):
        auth.disable_user(conn, "root")
    with pytest.raises(AuthError, match="only enabled admin"):
        auth.set_role(conn, "root", "editor")
    auth.add_user(conn, "second", PASSWORD, role="admin")
    assert auth.disable_user(conn, "root").disabled
    assert auth.has_admin(conn)
    with pytest.raises(AuthError, match="only enabled admin"):
        auth.set_role(conn, "second", "reader")


def test_an_actor_is_checked_and_named_in_the_audit(conn: store.Connection, admin: auth.User,
                                                     alice: auth.User) -> None:
    with pytest.raises(PermissionDeniedError, match=r"alice \(reader\) may not manage users"):
        auth.add_user(conn, "mallory", PASSWORD, role="admin", actor=alice)
    auth.set_groups(conn, "alice", ["finance"], actor=admin)
    rows = auth.audit_rows(conn, action="user_groups")
    assert [(r.user, r.detail) for r in rows] == [
        ("root", {"name": "alice", "groups": ["finance"], "before": ["eng", "hr"]})]
    assert [r.user for r in auth.audit_rows(conn, action="user_add")] == [None, None]  # the command line


def test_rehash_when_the_hasher_parameters_change(conn: store.Connection, alice: auth.User,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    old = conn.execute("SELECT password_hash FROM users").fetchone()[0]
    monkeypatch.setattr(auth, "PASSWORD_HASHER", SpyHasher(time_cost=2))
    auth.authenticate(conn, "alice", PASSWORD, T0, POLICY)
    new = conn.execute("SELECT password_hash FROM users").fetchone()[0]
    assert new != old and ",t=2," in new and ",t=1," in old
    auth.authenticate(conn, "alice", PASSWORD, T0, POLICY)
    assert conn.execute("SELECT password_hash FROM users").fetchone()[0] == new  # no needless rehash


# ---------------------------------------------------------------------------------------------
# Sign-in


def test_authenticate_opens_a_session_whose_token_is_stored_hashed(conn: store.Connection,
                                                                   alice: auth.User) -> None:
    session = auth.authenticate(conn, "Alice", PASSWORD, T0, POLICY)
    assert session.user == alice and session.expires_at == T0 + timedelta(minutes=60)
    assert len(session.token) >= 40 and session.token not in repr(session)
    rows = conn.execute("SELECT * FROM sessions").fetchall()
    assert [r["token_hash"] for r in rows] == [hashlib.sha256(session.token.encode()).hexdigest()]
    assert session.token not in dump(conn)
    assert auth.session_user(conn, session.token, T0, POLICY.idle_timeout) == alice
    assert [r.action for r in auth.audit_rows(conn, user="alice")] == ["sign_in"]


def test_unknown_name_and_wrong_password_give_the_same_message_and_both_run_argon2(
    conn: store.Connection, alice: auth.User, fast_hasher: SpyHasher
) -> None:
    messages = []
    for name, password in (("alice", "wrong password!"), ("nobody", PASSWORD)):
        fast_hasher.verified.clear()
        with pytest.raises(AuthError) as caught:
            auth.authenticate(conn, name, password, T0, POLICY)
        messages.append(str(caught.value))
        assert len(fast_hasher.verified) == 1  # a dummy hash is verified for the unknown name
    assert messages == [auth.WRONG_CREDENTIALS] * 2
    failed = auth.audit_rows(conn, action="sign_in_failed")
    assert [(r.user, r.detail["reason"]) for r in failed] == [("alice", "wrong password"), (None, "unknown name")]
    assert "nobody" not in dump(conn)  # an unknown name may be a password typed in the wrong box


def fail(conn: store.Connection, name: str, at: datetime, times: int = 1) -> list[AuthError]:
    errors = []
    for _ in range(times):
        with pytest.raises(AuthError) as caught:
            auth.authenticate(conn, name, "not the password", at, POLICY)
        errors.append(caught.value)
    return errors


def test_lockout_after_n_failures_refuses_even_the_right_password_until_it_ends(
    conn: store.Connection, alice: auth.User, fast_hasher: SpyHasher
) -> None:
    errors = fail(conn, "alice", T0, times=5)
    assert [type(e) for e in errors] == [AuthError] * 4 + [LockedOutError]
    locked = errors[-1]
    assert isinstance(locked, LockedOutError) and locked.retry_at == T0 + timedelta(minutes=1)
    assert str(locked).startswith(auth.WRONG_CREDENTIALS) and "try again in 1 minute (after 09:01 UTC)" in str(locked)
    fast_hasher.verified.clear()
    with pytest.raises(LockedOutError, match="try again in 1 minute"):
        auth.authenticate(conn, "alice", PASSWORD, T0 + timedelta(seconds=30), POLICY)
    assert fast_hasher.verified == []  # while locked the password is not even checked
    assert auth.authenticate(conn, "alice", PASSWORD, T0 + timedelta(seconds=61), POLICY).user == alice
    # a success forgets the failures: four new ones do not lock
    assert [type(e) for e in fail(conn, "alice", T0 + timedelta(minutes=2), times=4)] == [AuthError] * 4
    # an admin lifts a lock with enable_user (`rag users enable NAME`)
    assert isinstance(fail(conn, "alice", T0 + timedelta(minutes=3))[0], LockedOutError)
    auth.enable_user(conn, "alice")
    assert auth.authenticate(conn, "alice", PASSWORD, T0 + timedelta(minutes=3), POLICY).user.name == "alice"
    actions = [r.action for r in auth.audit_rows(conn, user="alice")]
    assert actions.count("sign_in_failed") == 10 and actions.count("sign_in_locked") == 1


def test_back_off_doubles_with_each_further_failure_up_to_the_window(conn: store.Connection,
                                                                     alice: auth.User) -> None:
    fail(conn, "alice", T0, times=5)  # locked 1 minute
    delays = []
    at = T0
    for _ in range(4):
        at += timedelta(minutes=1, seconds=1) if not delays else delays[-1] + timedelta(seconds=1)
        error = fail(conn, "alice", at)[0]
        assert isinstance(error, LockedOutError)
        delays.append(error.retry_at - at)
    assert delays == [timedelta(minutes=2), timedelta(minutes=4), timedelta(minutes=8), timedelta(minutes=15)]


def test_failures_older_than_the_window_are_forgotten(conn: store.Connection, alice: auth.User) -> None:
    fail(conn, "alice", T0, times=4)
    assert type(fail(conn, "alice", T0 + timedelta(minutes=16))[0]) is AuthError  # the 4 expired: 1 of 5
    fail(conn, "alice", T0 + timedelta(minutes=17), times=4)  # 5 within 15 minutes
    with pytest.raises(LockedOutError):
        auth.authenticate(conn, "alice", PASSWORD, T0 + timedelta(minutes=17, seconds=30), POLICY)
    # after the window everything is forgotten and the right password works
    assert auth.authenticate(conn, "alice", PASSWORD, T0 + timedelta(minutes=33), POLICY).user == alice
    assert conn.execute("SELECT count(*) FROM sign_in_failures").fetchone()[0] == 0


def test_unknown_names_lock_like_known_ones(conn: store.Connection, alice: auth.User) -> None:
    known, unknown = fail(conn, "alice", T0, times=5), fail(conn, "ghost", T0, times=5)
    assert [str(e) for e in known] == [str(e) for e in unknown]
    assert str(fail(conn, "ALICE ", T0)[0]) == str(fail(conn, "Ghost", T0)[0])  # case and spaces are one name


def test_a_lock_holds_one_name_as_sign_in_compares_names(conn: store.Connection) -> None:
    # "Ánh" and "ánh" are two users (only A-Z ignore case); the lock folded every letter, so wrong
    # passwords typed for one locked the other out, and enabling one lifted the other's lock.
    accent, plain = auth.add_user(conn, "Ánh", PASSWORD), auth.add_user(conn, "ánh", PASSWORD)
    assert isinstance(fail(conn, "ánh", T0, times=5)[-1], LockedOutError)
    assert auth.authenticate(conn, "Ánh", PASSWORD, T0 + timedelta(seconds=10), POLICY).user.id == accent.id
    with pytest.raises(LockedOutError):
        auth.authenticate(conn, "áNH", PASSWORD, T0 + timedelta(seconds=10), POLICY)  # áNH is ánh's name
    auth.enable_user(conn, "Ánh")  # lifts Ánh's lock, not ánh's
    with pytest.raises(LockedOutError):
        auth.authenticate(conn, "ánh", PASSWORD, T0 + timedelta(seconds=20), POLICY)
    auth.enable_user(conn, "ánh")
    assert auth.authenticate(conn, "ánh", PASSWORD, T0 + timedelta(seconds=20), POLICY).user.id == plain.id


def test_a_name_typed_decomposed_is_the_user_typed_composed(conn: store.Connection) -> None:
    # "Ánh" pasted from a macOS file name is decomposed (NFD): the same letters, another string.
    import unicodedata

    nfd = unicodedata.normalize("NFD", "Ánh")
    made = auth.add_user(conn, nfd, PASSWORD, role="admin")
    assert made.name == "Ánh"
    with pytest.raises(AuthError, match="already"):
        auth.add_user(conn, "Ánh", PASSWORD)
    assert auth.authenticate(conn, "Ánh", PASSWORD, T0, POLICY).user.id == made.id
    assert auth.authenticate(conn, nfd, PASSWORD, T0, POLICY).user.id == made.id
    assert auth.require_user(conn, nfd).id == made.id
    assert isinstance(fail(conn, nfd, T0, times=5)[-1], LockedOutError)
    with pytest.raises(LockedOutError):  # one lock, whichever form was typed
        auth.authenticate(conn, "Ánh", PASSWORD, T0 + timedelta(seconds=10), POLICY)
    assert [r.user for r in auth.audit_rows(conn, user=nfd)][:1] == ["Ánh"]


def test_migration_composes_the_user_names_older_versions_stored_decomposed(conn: store.Connection) -> None:
    import unicodedata

    nfd, twin = unicodedata.normalize("NFD", "Ánh"), unicodedata.normalize("NFD", "Đức")
    for name in (nfd, twin, "Đức", "bob"):  # stored as older versions did: as typed
        conn.execute("INSERT INTO users (name, password_hash) VALUES (?, ?)", (name, "x"))
    name = migration_named(conn, "_nfc_user_names")
    assert store.migrate(conn) == [name]
    names = {r[0] for r in conn.execute("SELECT name FROM users")}
    assert names == {"Ánh", twin, "Đức", "bob"}  # Đức's decomposed twin is another user: left as it was
    assert auth.require_user(conn, nfd).name == "Ánh"  # found again, typed either way


def test_disabled_user_cannot_sign_in_and_their_sessions_end(conn: store.Connection, alice: auth.User,
                                                             admin: auth.User) -> None:
    session = auth.authenticate(conn, "alice", PASSWORD, T0, POLICY)
    auth.disable_user(conn, "alice", actor=admin)
    assert auth.session_user(conn, session.token, T0, POLICY.idle_timeout) is None
    assert conn.execute("SELECT count(*) FROM sessions").fetchone()[0] == 0
    with pytest.raises(AuthError, match="disabled"):
        auth.authenticate(conn, "alice", PASSWORD, T0, POLICY)
    with pytest.raises(AuthError, match=f"^{auth.WRONG_CREDENTIALS}$"):  # the state is told only to the password
        auth.authenticate(conn, "alice", "wrong password!", T0, POLICY)
    assert not auth.may(auth.require_user(conn, "alice"), "ask")
    auth.enable_user(conn, "alice", actor=admin)
    assert auth.authenticate(conn, "alice", PASSWORD, T0, POLICY).user.name == "alice"


def in_another_connection(db_path: Path | str, work: Any) -> tuple[threading.Thread, list[Any]]:
    """Run ``work(conn)`` on a connection of its own in a thread (another app process, in effect);
    the list receives its result or its exception."""
    out: list[Any] = []

    def run() -> None:
        conn = store.open_db(db_path)
        try:
            out.append(work(conn))
        except Exception as e:  # the outcome under test
            out.append(e)
        finally:
            conn.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def test_sign_ins_of_one_name_take_turns(db_path: Path | str, conn: store.Connection, alice: auth.User) -> None:
    """A sign-in waits for another one of the same name, so it counts that one's failures (SQLite:
    BEGIN IMMEDIATE; PostgreSQL: an advisory lock, else READ COMMITTED would let both count four)."""
    key = auth._name_hash("alice")
    with store.transaction(conn):
        auth._take_turns(conn, key)
        thread, out = in_another_connection(
            db_path, lambda c: auth.authenticate(c, "alice", PASSWORD, T0 + timedelta(seconds=1), POLICY))
        time.sleep(0.5)
        assert not out  # still waiting for this transaction
        for _ in range(POLICY.lockout_failures):  # the failures of a sign-in running at the same time
            conn.execute("INSERT INTO sign_in_failures (name_hash, at) VALUES (?, ?)", (key, auth._iso(T0)))
    thread.join(30)
    assert len(out) == 1 and isinstance(out[0], LockedOutError), out


def test_two_admins_cannot_remove_each_other_at_once(db_path: Path | str, conn: store.Connection,
                                                     admin: auth.User) -> None:
    auth.add_user(conn, "second", PASSWORD, role="admin")
    with store.transaction(conn):
        auth._take_turns(conn, "users")  # what set_role("root", ...) holds while it demotes root
        conn.execute("UPDATE users SET role = 'reader' WHERE name = 'root'")
        thread, out = in_another_connection(db_path, lambda c: auth.disable_user(c, "second"))
        time.sleep(0.5)
        assert not out
    thread.join(30)
    assert len(out) == 1 and isinstance(out[0], AuthError) and "only enabled admin" in str(out[0]), out
    assert auth.has_admin(conn)


def test_naive_times_are_refused(conn: store.Connection, alice: auth.User) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        auth.authenticate(conn, "alice", PASSWORD, datetime(2026, 3, 1, 9, 0), POLICY)


# ---------------------------------------------------------------------------------------------
# Sessions


def test_session_expires_after_idle_time_and_each_use_slides_it(conn: store.Connection, alice: auth.User) -> None:
    token = auth.authenticate(conn, "alice", PASSWORD, T0, POLICY).token
    idle = timedelta(minutes=60)
    assert auth.session_user(conn, token, T0 + timedelta(minutes=59), idle) == alice
    assert auth.session_user(conn, token, T0 + timedelta(minutes=118), idle) == alice  # 59 since the last use
    row = conn.execute("SELECT last_seen, expires_at FROM sessions").fetchone()
    assert (row["last_seen"], row["expires_at"]) == ("2026-03-01T10:58:00.000Z", "2026-03-01T11:58:00.000Z")
    assert auth.session_user(conn, token, T0 + timedelta(minutes=178), idle) is None  # idle 60 minutes
    assert conn.execute("SELECT count(*) FROM sessions").fetchone()[0] == 0
    assert auth.session_user(conn, token, T0 + timedelta(minutes=179), idle) is None
    assert auth.session_user(conn, "made-up", T0, idle) is None and auth.session_user(conn, None, T0, idle) is None


def test_sign_out_ends_the_session_and_is_audited(conn: store.Connection, alice: auth.User) -> None:
    first = auth.authenticate(conn, "alice", PASSWORD, T0, POLICY)
    second = auth.authenticate(conn, "alice", PASSWORD, T0, POLICY)
    auth.sign_out(conn, first.token, T0)
    auth.sign_out(conn, first.token, T0)  # twice is fine
    assert auth.session_user(conn, first.token, T0, POLICY.idle_timeout) is None
    assert auth.session_user(conn, second.token, T0, POLICY.idle_timeout) == alice  # other browsers stay
    assert [r.action for r in auth.audit_rows(conn, user="alice")] == ["sign_in", "sign_in", "sign_out"]


def test_new_password_ends_sessions_and_new_groups_apply_at_once(conn: store.Connection, alice: auth.User) -> None:
    session = auth.authenticate(conn, "alice", PASSWORD, T0, POLICY)
    auth.set_groups(conn, "alice", ["finance"])
    assert auth.session_user(conn, session.token, T0, POLICY.idle_timeout).groups == ["finance"]
    auth.set_password(conn, "alice", "a brand new one")
    assert auth.session_user(conn, session.token, T0, POLICY.idle_timeout) is None
    with pytest.raises(AuthError):
        auth.authenticate(conn, "alice", PASSWORD, T0, POLICY)
    assert auth.authenticate(conn, "alice", "a brand new one", T0, POLICY).user.groups == ["finance"]


# ---------------------------------------------------------------------------------------------
# Roles

ALLOWED = {  # written out by hand from issue 20, not derived from auth.PERMISSIONS
    "reader": {"ask", "open_source", "view_chunks"},
    "editor": {"ask", "open_source", "view_chunks", "upload", "ingest"},
    "admin": {"ask", "open_source", "view_chunks", "upload", "ingest", "delete_document", "manage_users",
              "manage_collections", "manage_settings", "run_eval", "view_audit", "view_as"},
}


@pytest.mark.parametrize("role", ["reader", "editor", "admin"])
@pytest.mark.parametrize("action", sorted(ALLOWED["admin"]))
def test_role_permission_matrix(role: auth.Role, action: str) -> None:
    user = auth.User(id=1, name="u", role=role, groups=["all"])
    assert auth.may(user, action) is (action in ALLOWED[role])
    assert auth.may(auth.User(id=1, name="u", role=role, groups=["all"], disabled=True), action) is False
    assert auth.may(None, action) is False


def test_unknown_action_is_an_error_not_a_silent_no() -> None:
    with pytest.raises(ValueError, match="unknown action 'delete'; valid: ask, open_source"):
        auth.may(auth.User(id=1, name="u", role="admin", groups=[]), "delete")
    with pytest.raises(PermissionDeniedError, match=r"u \(editor\) may not view the audit log"):
        auth.require(auth.User(id=1, name="u", role="editor", groups=[]), "view_audit")
    with pytest.raises(PermissionDeniedError, match="nobody signed in may not ask"):
        auth.require(None, "ask")


def test_searches_use_the_users_groups_and_viewing_as_is_for_admins_only() -> None:
    reader = auth.User(id=1, name="r", role="reader", groups=["hr"])
    admin = auth.User(id=2, name="a", role="admin", groups=["all"])
    assert auth.reader_groups(reader) == ["hr"]
    assert auth.reader_groups(admin) == ["all"]  # an admin is not in every group
    assert auth.reader_groups(admin, viewing_as=[" hr", "finance", "hr"]) == ["finance", "hr"]
    with pytest.raises(PermissionDeniedError, match="may not view as other groups"):
        auth.reader_groups(reader, viewing_as=["finance"])


# ---------------------------------------------------------------------------------------------
# Audit log


def answer(question: str, status: str = "answered") -> Answer:
    hit = Hit(chunk_id=7, document_id=3, source="hr/leave.md", title="Leave", section="Leave", content="x",
              char_from=0, char_to=1, page=None, distance=0.2)
    citation = Citation(n=1, chunk_id=7, title="Leave", source="hr/leave.md", section="Leave", locator="#char=0,1",
                        char_from=0, char_to=1, page=None, quote="x", distance=0.2)
    cited = status != "no_answer"
    return Answer(status=status, question=question, text="", citations=[citation] if cited else [],
                  hits=[hit] if cited else [])


def test_record_question_and_each_users_history(conn: store.Connection, alice: auth.User, admin: auth.User) -> None:
    auth.record_question(conn, alice, answer("How many leave days?"), groups=alice.groups, collection="default",
                         at=T0)
    auth.record_question(conn, admin, answer("Salary bands?", "no_answer"), groups=["hr"], collection="default",
                         preview=True, at=T0 + timedelta(minutes=1))
    auth.record_question(conn, alice, answer("And sick leave?"), groups=alice.groups, collection="default",
                         at=T0 + timedelta(minutes=2))
    history = auth.question_history(conn, alice)
    assert [r.detail["question"] for r in history] == ["And sick leave?", "How many leave days?"]
    first = history[-1].detail
    assert first == {"question": "How many leave days?", "collection": "default", "status": "answered",
                     "refused": False, "groups": ["eng", "hr"], "preview": False,
                     "cited": [{"n": 1, "source": "hr/leave.md", "document_id": 3, "chunk_id": 7}]}
    root = auth.question_history(conn, admin)
    assert len(root) == 1 and root[0].detail["refused"] and root[0].detail["preview"] and root[0].detail["cited"] == []


def test_audit_rows_filter_by_time_user_and_action(conn: store.Connection, alice: auth.User) -> None:
    auth.record(conn, alice, "ask", {"question": "a"}, at=T0)
    auth.record(conn, None, "user_add", {"name": "x"}, at=T0 + timedelta(days=1))
    auth.record(conn, alice, "ask", {"question": "b"}, at=T0 + timedelta(days=2))
    until = T0 + timedelta(days=3)  # leaves out the fixture's own user_add, stamped with the real clock
    assert [(r.user, r.action) for r in auth.audit_rows(conn, until=until)] == [
        ("alice", "ask"), (None, "user_add"), ("alice", "ask")]
    since = [r.detail for r in auth.audit_rows(conn, T0 + timedelta(days=1), user="ALICE")]
    assert since == [{"question": "b"}]
    assert [r.detail for r in auth.audit_rows(conn, T0, action="ask", until=until)] == [
        {"question": "a"}, {"question": "b"}]
    assert auth.audit_rows(conn, user="nobody") == []


def test_record_refuses_secrets_at_any_depth(conn: store.Connection) -> None:
    for detail in ({"password": "x"}, {"nested": {"Token": "x"}}, {"list": [{"password_hash": "x"}]}):
        with pytest.raises(ValueError, match="never holds"):
            auth.record(conn, None, "oops", detail)
    assert auth.audit_rows(conn) == []


def test_export_csv_has_columns_and_neutralises_formulas(conn: store.Connection, alice: auth.User) -> None:
    auth.record_question(conn, alice, answer("=HYPERLINK(\"http://x\")"), groups=["hr"], collection="c", at=T0)
    auth.record_question(conn, alice, answer("Nghỉ phép, \"bao nhiêu\"?\nngày"), groups=["hr"], collection="c",
                         at=T0 + timedelta(seconds=1))
    rows = auth.audit_rows(conn, T0, action="ask")
    table = list(csv.reader(io.StringIO(auth.export_csv(rows))))
    assert table[0] == list(auth.CSV_COLUMNS)
    assert table[1][1:7] == ["2026-03-01T09:00:00.000Z", "alice", "ask", "'=HYPERLINK(\"http://x\")", "answered",
                             "hr/leave.md"]
    assert table[2][4] == "Nghỉ phép, \"bao nhiêu\"?\nngày"  # quoting keeps commas, quotes and newlines
    assert '"cited": [{"chunk_id": 7' in table[2][7]
    assert len(table) == 3
    assert auth.export_csv([]) == ",".join(auth.CSV_COLUMNS) + "\r\n"


def test_prune_deletes_rows_past_the_retention_and_records_itself(conn: store.Connection) -> None:
    for days_ago in (400, 366, 364, 1):
        auth.record(conn, None, "ask", {"question": str(days_ago)}, at=T0 - timedelta(days=days_ago))
    assert auth.prune_audit(conn, 0, now=T0) == 0 and len(auth.audit_rows(conn)) == 4  # 0 keeps everything
    assert auth.prune_audit(conn, 365, now=T0) == 2
    rows = auth.audit_rows(conn)
    assert [r.detail.get("question") for r in rows] == ["364", "1", None]
    assert rows[-1].action == "audit_prune" and rows[-1].detail == {"deleted": 2, "retention_days": 365}
    with pytest.raises(ValueError):
        auth.prune_audit(conn, -1, now=T0)


def test_no_password_hash_or_token_in_the_audit_log_the_database_or_any_output(
    db_path: Path | str, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    conn = store.open_db(db_path)
    root = auth.add_user(conn, "root", "admin-password", role="admin")
    auth.add_user(conn, "alice", PASSWORD, groups=["hr"], actor=root)
    tokens = [auth.authenticate(conn, "alice", PASSWORD, T0, POLICY).token]
    with pytest.raises(AuthError) as caught:
        auth.authenticate(conn, "alice", "wrong-but-long", T0, POLICY)
    auth.set_password(conn, "alice", "second password", actor=root)
    tokens.append(auth.authenticate(conn, "alice", "second password", T0, POLICY).token)
    auth.session_user(conn, tokens[-1], T0, POLICY.idle_timeout)
    auth.sign_out(conn, tokens[-1], T0)
    hashes = [r[0] for r in conn.execute("SELECT password_hash FROM users")]
    secrets: list[Any] = [PASSWORD, "admin-password", "wrong-but-long", "second password", *tokens, *hashes]
    audit_text = auth.export_csv(auth.audit_rows(conn)) + dump_table(conn, "audit_log")
    everything = dump(conn)
    if not store.is_postgres(conn):
        conn.execute("PRAGMA wal_checkpoint(FULL)")
    conn.close()
    # The SQLite file's own bytes (WAL included); PostgreSQL's: every row of every table.
    raw = (everything.encode() if isinstance(db_path, str) else
           b"".join(p.read_bytes() for p in db_path.parent.glob(db_path.name + "*")))
    printed = capsys.readouterr()
    outputs = [printed.out, printed.err, caplog.text, str(caught.value)]
    for secret in secrets:
        assert secret not in audit_text
        assert all(secret not in text for text in outputs)
        if secret not in hashes:  # the hashes are in the users table, and only there
            assert secret.encode() not in raw
    assert "$argon2" not in audit_text


def dump_table(conn: store.Connection, table: str) -> str:
    return "\n".join(str(tuple(r)) for r in conn.execute(f"SELECT * FROM {table}"))


def test_parse_since_accepts_dates_and_times() -> None:
    assert auth.parse_since("2026-03-01") == datetime(2026, 3, 1, tzinfo=UTC)
    assert auth.parse_since("2026-03-01T09:30Z") == datetime(2026, 3, 1, 9, 30, tzinfo=UTC)
    assert auth.parse_since("2026-03-01T11:30+02:00") == datetime(2026, 3, 1, 9, 30, tzinfo=UTC)
    with pytest.raises(RagError, match="not a date"):
        auth.parse_since("last week")


def test_team_mode_doc_covers_every_setting_command_and_the_threat_model() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "team-mode.md").read_text(encoding="utf-8")
    for name in ("auth", "session_idle_minutes", "lockout_failures", "lockout_minutes", "audit_retention_days"):
        assert f"`{name}`" in doc, name
    for command in ("rag users add", "rag users passwd", "rag users groups", "rag users role", "rag users disable",
                    "rag users enable", "rag users list", "rag audit --since", "rag audit prune", "rag serve --team"):
        assert command in doc, command
    assert "## What team mode protects against" in doc and "It does not protect against:" in doc
    assert "docs/team-mode.md" in (Path(__file__).resolve().parent.parent / "docs" / "guide" /
                                   "permissions.md").read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# rag migrate: users and the audit log move with the desk (SQLite -> PostgreSQL -> SQLite)


def audit_view(conn: store.Connection) -> list[tuple[str, str | None, str, dict[str, Any]]]:
    return [(r.at, r.user, r.action, r.detail) for r in auth.audit_rows(conn) if r.action != "team_copy"]


def users_view(conn: store.Connection) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in conn.execute(
        "SELECT name, password_hash, role, groups, disabled, created_at, updated_at FROM users ORDER BY name")]


def test_copy_team_moves_users_with_their_passwords_and_the_log_and_runs_again_for_nothing(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(auth, "AUDIT_PAGE", 2)  # several pages and batches, on a small log
    monkeypatch.setattr(auth, "AUDIT_BATCH", 3)
    src = store.open_db(tmp_path / "team.db")
    root = auth.add_user(src, "root", "admin-password", role="admin")
    alice = auth.add_user(src, "Alice", PASSWORD, groups=["hr", "eng"], actor=root)
    auth.add_user(src, "bob", "bob's password", role="editor")
    auth.disable_user(src, "bob", actor=root)
    session = auth.authenticate(src, "alice", PASSWORD, T0, POLICY)
    with pytest.raises(AuthError):
        auth.authenticate(src, "root", "wrong password", T0, POLICY)
    auth.record_question(src, alice, answer("How many leave days?"), groups=alice.groups, collection="default",
                         at=T0 + timedelta(minutes=1))
    dest = store.open_db(pg_url)
    carol = auth.add_user(dest, "carol", "carol's password")  # DEST's own user: ids differ from SRC's

    carols = audit_view(dest)  # DEST's own row: carol's user_add
    first = auth.copy_team(src, dest)
    assert (first.users_copied, first.users_skipped, first.differing, first.verified) == (3, 0, [], True)
    assert first.audit_copied == len(auth.audit_rows(src)) > 5 and first.audit_skipped == 0
    assert sorted(map(repr, audit_view(dest))) == sorted(map(repr, audit_view(src) + carols))  # time, name, detail
    assert [u for u in users_view(dest) if u[0] != "carol"] == users_view(src)  # hashes, roles, groups, times
    assert [u.name for u in auth.list_users(dest)] == ["Alice", "bob", "carol", "root"]
    moved = auth.authenticate(dest, "ALICE", PASSWORD, T0 + timedelta(hours=1), POLICY).user  # the same password
    assert (moved.groups, moved.role) == (["eng", "hr"], "reader") and moved.id != alice.id
    with pytest.raises(AuthError, match="disabled"):
        auth.authenticate(dest, "bob", "bob's password", T0, POLICY)
    assert auth.session_user(dest, session.token, T0, POLICY.idle_timeout) is None  # everyone signs in again
    # the history is the moved user's: audit rows point at DEST's id of that name
    assert [r.detail["question"] for r in auth.question_history(dest, moved)] == ["How many leave days?"]
    assert auth.question_history(dest, carol) == []
    assert [r.detail for r in auth.audit_rows(dest, action="team_copy")] == [
        {"users_copied": 3, "audit_rows_copied": first.audit_copied}]

    again = auth.copy_team(src, dest)
    assert (again.users_copied, again.users_skipped, again.audit_copied, again.verified) == (0, 3, 0, True)
    assert again.audit_skipped == len(auth.audit_rows(src))
    assert len(auth.audit_rows(dest, action="team_copy")) == 1  # a run that copies nothing records nothing

    back = store.open_db(tmp_path / "back.db")  # and back to SQLite, without the log this time
    assert auth.copy_team(dest, back, audit=False).users_copied == 4
    assert users_view(back) == users_view(dest)
    assert [r.action for r in auth.audit_rows(back)] == ["team_copy"]
    assert auth.authenticate(back, "root", "admin-password", T0 + timedelta(hours=1), POLICY).user.role == "admin"
    for conn in (src, dest, back):
        conn.close()


def test_copy_team_never_overwrites_a_user_the_destination_has(tmp_path: Path, pg_url: str) -> None:
    src = store.open_db(tmp_path / "team.db")
    auth.add_user(src, "alice", PASSWORD, role="admin")
    dest = store.open_db(pg_url)
    auth.add_user(dest, "ALICE", "another password")  # the same name, ignoring case
    copy = auth.copy_team(src, dest)
    assert (copy.users_copied, copy.differing, copy.verified) == (0, ["alice"], False)
    user = auth.authenticate(dest, "alice", "another password", T0, POLICY).user
    assert (user.name, user.role) == ("ALICE", "reader")
    with pytest.raises(AuthError):
        auth.authenticate(dest, "alice", PASSWORD, T0, POLICY)
    src.close()
    dest.close()
