"""Team mode: users, roles, sign-in sessions with lockout, and the audit log (issue 20).

Desktop mode (``Settings.auth`` false, the default) uses none of this. In team mode a page asks
``session_user`` who is signed in, searches with ``reader_groups(user)``, checks ``may`` before
each action, and writes what happened with ``record`` / ``record_question``.

Secrets: passwords are hashed by argon2-cffi's ``PasswordHasher`` (argon2id, its default
parameters, re-hashed when those change) and never stored, printed or audited; session tokens
come from ``secrets.token_urlsafe`` and only their SHA-256 is stored. Every time is a
timezone-aware datetime passed in by the caller (``now``), so tests can move the clock.

Both backends run the same statements through ``store.Connection``, with two differences written
out below: how a name is compared (``_name_is``), and the locks PostgreSQL needs where SQLite's
``BEGIN IMMEDIATE`` already makes writers take turns (``_take_turns``). ``copy_team`` moves the
users and the audit log from one database to another (``rag migrate``).
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import json
import math
import re
import secrets
import string
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, cast, get_args

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from rag import store
from rag.config import Settings
from rag.errors import AuthError, LockedOutError, NotFoundError, PermissionDeniedError, RagError
from rag.records import Answer
from rag.text import nfc

# ---------------------------------------------------------------------------------------------
# Roles and permissions

Role = Literal["reader", "editor", "admin"]
ROLES: tuple[Role, ...] = get_args(Role)

Action = Literal[
    "ask", "open_source", "view_chunks",  # reader
    "upload", "ingest",  # editor
    "delete_document", "manage_users", "manage_collections", "manage_settings", "run_eval", "view_audit",
    "view_as",  # admin
]
ACTIONS: tuple[Action, ...] = get_args(Action)

_READER: frozenset[Action] = frozenset({"ask", "open_source", "view_chunks"})
_EDITOR: frozenset[Action] = _READER | {"upload", "ingest"}
# Each role holds the one below it; admin holds every action, including "view_as" (a preview of
# what other groups see). An admin is NOT in every group: their own searches use their own groups.
PERMISSIONS: Mapping[Role, frozenset[Action]] = {
    "reader": _READER,
    "editor": _EDITOR,
    "admin": frozenset(ACTIONS),
}

_ACTION_WORDS: Mapping[str, str] = {
    "ask": "ask questions", "open_source": "open sources", "view_chunks": "view chunks",
    "upload": "upload documents", "ingest": "ingest documents", "delete_document": "delete documents",
    "manage_users": "manage users", "manage_collections": "create collections",
    "manage_settings": "change settings", "run_eval": "run evaluations",
    "view_audit": "view the audit log", "view_as": "view as other groups",
}


@dataclass(frozen=True, slots=True)
class User:
    id: int
    name: str
    role: Role
    groups: list[str]  # normalised as documents' groups; every user also holds "all" implicitly
    disabled: bool = False
    created_at: str = ""
    updated_at: str = ""


@dataclass(frozen=True, slots=True)
class Session:
    """A signed-in session. ``token`` is the secret the browser session keeps (never in a repr)."""

    token: str = field(repr=False)
    user: User
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class SignInPolicy:
    """Idle timeout and lockout of sign-ins (from ``Settings`` with ``from_settings``)."""

    idle_timeout: timedelta = timedelta(minutes=60)
    lockout_failures: int = 5  # failures for one name within lockout_window before back-off
    lockout_window: timedelta = timedelta(minutes=15)  # also the longest back-off

    @classmethod
    def from_settings(cls, settings: Settings) -> SignInPolicy:
        return cls(
            idle_timeout=timedelta(minutes=settings.session_idle_minutes),
            lockout_failures=settings.lockout_failures,
            lockout_window=timedelta(minutes=settings.lockout_minutes),
        )


DEFAULT_POLICY = SignInPolicy()


def may(user: User | None, action: str) -> bool:
    """Whether ``user`` may do ``action`` (nobody signed in, or a disabled user, may do nothing).

    Raises:
        ValueError: for an action that is not one of ``ACTIONS`` (a typo must not deny silently).
    """
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}; valid: {', '.join(ACTIONS)}")
    if user is None or user.disabled:
        return False
    return action in PERMISSIONS[user.role]


def require(user: User | None, action: str) -> None:
    """``may`` or a ``PermissionDeniedError`` whose message can be shown as is."""
    if not may(user, action):
        who = "nobody signed in" if user is None else f"{user.name} ({user.role})"
        raise PermissionDeniedError(f"{who} may not {_ACTION_WORDS[action]}: ask an administrator")


def reader_groups(user: User, viewing_as: Iterable[str] | None = None) -> list[str]:
    """The groups a search, answer, source view or chunk view runs with.

    The user's own groups; ``viewing_as`` (a preview of what those groups see) only for admins.

    Raises:
        PermissionDeniedError: ``viewing_as`` given for a user who is not an admin.
    """
    if viewing_as is None:
        return list(user.groups)
    require(user, "view_as")
    return store.normalize_groups(viewing_as)


# ---------------------------------------------------------------------------------------------
# Passwords and names

MIN_PASSWORD_LENGTH = 8
MAX_PASSWORD_LENGTH = 1024  # argon2 takes any length; this keeps a pasted file from being hashed
NAME_PATTERN = re.compile(r"[\w.@-]{1,64}")  # letters (any script), digits, . _ - @
PASSWORD_HASHER = PasswordHasher()  # argon2id with argon2-cffi's defaults (RFC 9106 low-memory profile)
WRONG_CREDENTIALS = "wrong name or password"
BACKOFF_START = timedelta(minutes=1)  # the first lock; it doubles with each further failure


def check_password(password: str) -> None:
    """Refuse an empty, too short or absurdly long password, with a message saying which."""
    if not password:
        raise AuthError("the password is empty")
    if len(password) < MIN_PASSWORD_LENGTH:
        raise AuthError(f"the password must have at least {MIN_PASSWORD_LENGTH} characters")
    if len(password) > MAX_PASSWORD_LENGTH:
        raise AuthError(f"the password must have at most {MAX_PASSWORD_LENGTH} characters")


def typed_name(name: str) -> str:
    """A name as typed, as names are stored: stripped and composed (NFC), so "Ánh" pasted from a
    macOS file name (decomposed, NFD) is the user typed "Ánh" on a keyboard."""
    return nfc(name.strip())


def check_name(name: str) -> str:
    """The user name, stripped and composed; letters, digits and ``. _ - @``, 1 to 64 characters."""
    cleaned = typed_name(name)
    if not NAME_PATTERN.fullmatch(cleaned):
        raise AuthError(f"invalid user name {name!r}: use 1-64 letters, digits or . _ - @ (no spaces)")
    return cleaned


def _check_role(role: str) -> Role:
    if role not in ROLES:
        raise AuthError(f"unknown role {role!r}; valid: {', '.join(ROLES)}")
    return cast(Role, role)


def _hash_password(password: str) -> str:
    check_password(password)
    return PASSWORD_HASHER.hash(password)


def _verify(password_hash: str, password: str) -> bool:
    try:
        return PASSWORD_HASHER.verify(password_hash, password)
    except (VerificationError, InvalidHashError):  # VerifyMismatchError is a VerificationError
        return False


@functools.cache
def _dummy_hash(hasher: PasswordHasher) -> str:
    """A hash of a random password, verified for unknown names so they cost as much as known ones."""
    return hasher.hash(secrets.token_urlsafe(16))


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _name_hash(name: str) -> str:
    """The key of a name's failed sign-ins: the name as sign-in compares it (``same_name_key``), so
    a lock holds one user's name, never also another's such as "Ánh" for "ánh"."""
    return hashlib.sha256(same_name_key(typed_name(name)).encode("utf-8")).hexdigest()


# ---------------------------------------------------------------------------------------------
# Time: UTC text in the database's own format, so stored times compare as strings.


def utcnow() -> datetime:
    return datetime.now(UTC)


def _iso(moment: datetime) -> str:
    if moment.tzinfo is None:
        raise ValueError("times must be timezone-aware (use rag.auth.utcnow())")
    utc = moment.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def _parse(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


# ---------------------------------------------------------------------------------------------
# The two places the backends differ

# pg_advisory_xact_lock's first key for rag.auth's locks ("ragu"); the second is hashtext(what).
# Two-key locks never meet the one-key lock of the PostgreSQL migration runner (rag.pg).
LOCK_CLASS = 0x7261_6775


def _name_is(conn: store.Connection, column: str = "name") -> str:
    """``column = ?`` ignoring the case of ASCII letters, on either backend.

    SQLite's columns are ``COLLATE NOCASE`` (db/migrations/0005_team.sql). PostgreSQL compares
    ``lower(... COLLATE "C")``, which folds the same 26 letters and nothing else, and is the
    expression its unique index holds (db/migrations_pg/0005_team.sql), so the index serves it.
    """
    if store.is_postgres(conn):
        return f'lower({column} COLLATE "C") = lower(? COLLATE "C")'
    return f"{column} = ?"


def _name_order(conn: store.Connection) -> str:
    """``ORDER BY`` of user names: NOCASE order on SQLite, the same order on PostgreSQL."""
    return 'lower(name COLLATE "C")' if store.is_postgres(conn) else "name"


def _take_turns(conn: store.Connection, what: str) -> None:
    """Inside a transaction: transactions about ``what`` (one name's sign-ins, the users table) run
    one after the other on PostgreSQL too.

    SQLite's ``BEGIN IMMEDIATE`` (``store.transaction``) lets one writer in at a time. PostgreSQL's
    default READ COMMITTED does not: two sign-ins could each count four failures and both try a
    fifth password, or two admins could each demote the other, each seeing one admin left. A
    transaction-scoped advisory lock restores the turn-taking for just those transactions.
    """
    if store.is_postgres(conn):
        conn.execute("SELECT pg_advisory_xact_lock(?, hashtext(?))", (LOCK_CLASS, what))


# ---------------------------------------------------------------------------------------------
# Users

_USER_COLUMNS = "id, name, role, groups, disabled, created_at, updated_at"


def _user(row: Any) -> User:
    return User(
        id=int(row["id"]), name=row["name"], role=row["role"], groups=json.loads(row["groups"]),
        disabled=bool(row["disabled"]), created_at=row["created_at"], updated_at=row["updated_at"],
    )


def get_user(conn: store.Connection, name: str) -> User | None:
    """The user of this name (case-insensitive), or None."""
    row = conn.execute(f"SELECT {_USER_COLUMNS} FROM users WHERE {_name_is(conn)}", (typed_name(name),)).fetchone()
    return _user(row) if row else None


def require_user(conn: store.Connection, name: str) -> User:
    found = get_user(conn, name)
    if found is None:
        raise NotFoundError(f"no user named {name!r}; `rag users list` shows them")
    return found


def list_users(conn: store.Connection) -> list[User]:
    return [_user(r) for r in conn.execute(f"SELECT {_USER_COLUMNS} FROM users ORDER BY {_name_order(conn)}")]


def has_admin(conn: store.Connection) -> bool:
    """Whether an enabled admin exists (team mode refuses to start without one)."""
    return conn.execute("SELECT 1 FROM users WHERE role = 'admin' AND disabled = 0 LIMIT 1").fetchone() is not None


def add_user(
    conn: store.Connection, name: str, password: str, *, role: str = "reader", groups: Iterable[str] = (),
    actor: User | None = None,
) -> User:
    """Create a user with a hashed password.

    Args:
        groups: the groups whose documents the user may read (``all`` is implicit).
        actor: the admin doing it, checked and audited; None means the command line (whoever
            may write the database file).

    Raises:
        AuthError: an invalid name, role or password, or a name already taken.
        PermissionDeniedError: ``actor`` may not manage users.
    """
    _require_manager(actor)
    name, checked_role = check_name(name), _check_role(role)
    groups = store.normalize_groups(groups)
    password_hash = _hash_password(password)  # before the transaction: argon2 takes ~0.1 s
    with store.transaction(conn):
        _take_turns(conn, "users")
        if get_user(conn, name) is not None:
            raise AuthError(f"a user named {name!r} already exists (change it with `rag users passwd|groups|role`)")
        conn.execute(
            "INSERT INTO users (name, password_hash, role, groups) VALUES (?, ?, ?, ?)",
            (name, password_hash, checked_role, json.dumps(groups)),
        )
        record(conn, actor, "user_add", {"name": name, "role": checked_role, "groups": groups})
    return require_user(conn, name)


def set_password(conn: store.Connection, name: str, password: str, *, actor: User | None = None) -> None:
    """Replace a user's password; every session of that user ends."""
    _require_manager(actor)
    user = require_user(conn, name)
    password_hash = _hash_password(password)
    with store.transaction(conn):
        _update_user(conn, user.id, "password_hash", password_hash)
        conn.execute("DELETE FROM sessions WHERE user_id = ?", (user.id,))
        record(conn, actor, "user_passwd", {"name": user.name})


def set_groups(conn: store.Connection, name: str, groups: Iterable[str], *, actor: User | None = None) -> User:
    """Replace a user's groups; signed-in sessions search with the new ones from their next use."""
    _require_manager(actor)
    user = require_user(conn, name)
    cleaned = store.normalize_groups(groups)
    with store.transaction(conn):
        _update_user(conn, user.id, "groups", json.dumps(cleaned))
        record(conn, actor, "user_groups", {"name": user.name, "groups": cleaned, "before": user.groups})
    return require_user(conn, name)


def set_role(conn: store.Connection, name: str, role: str, *, actor: User | None = None) -> User:
    """Change a user's role; the last enabled admin cannot be demoted."""
    _require_manager(actor)
    user, checked_role = require_user(conn, name), _check_role(role)
    with store.transaction(conn):
        _take_turns(conn, "users")
        if checked_role != "admin":
            _refuse_last_admin(conn, user, "demote")
        _update_user(conn, user.id, "role", checked_role)
        record(conn, actor, "user_role", {"name": user.name, "role": checked_role, "before": user.role})
    return require_user(conn, name)


def disable_user(conn: store.Connection, name: str, *, actor: User | None = None) -> User:
    """Stop a user from signing in and end their sessions (the last enabled admin is refused)."""
    _require_manager(actor)
    user = require_user(conn, name)
    with store.transaction(conn):
        _take_turns(conn, "users")
        _refuse_last_admin(conn, user, "disable")
        _update_user(conn, user.id, "disabled", 1)
        conn.execute("DELETE FROM sessions WHERE user_id = ?", (user.id,))
        record(conn, actor, "user_disable", {"name": user.name})
    return require_user(conn, name)


def enable_user(conn: store.Connection, name: str, *, actor: User | None = None) -> User:
    """Let a user sign in again; this also lifts a lockout of their name."""
    _require_manager(actor)
    user = require_user(conn, name)
    with store.transaction(conn):
        _update_user(conn, user.id, "disabled", 0)
        conn.execute("DELETE FROM sign_in_failures WHERE name_hash = ?", (_name_hash(user.name),))
        record(conn, actor, "user_enable", {"name": user.name})
    return require_user(conn, name)


def _require_manager(actor: User | None) -> None:
    if actor is not None:
        require(actor, "manage_users")


# Column names are chosen in code (rule 7), never taken from input.
_UPDATABLE = frozenset({"password_hash", "groups", "role", "disabled"})


def _update_user(conn: store.Connection, user_id: int, column: str, value: Any) -> None:
    if column not in _UPDATABLE:
        raise ValueError(f"not an updatable user column: {column!r}")
    conn.execute(
        f"UPDATE users SET {column} = ?, updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE id = ?",
        (value, user_id),
    )


def _refuse_last_admin(conn: store.Connection, user: User, verb: str) -> None:
    if user.role != "admin" or user.disabled:
        return
    others = conn.execute(
        "SELECT count(*) FROM users WHERE role = 'admin' AND disabled = 0 AND id != ?", (user.id,)
    ).fetchone()[0]
    if not others:
        raise AuthError(f"{user.name} is the only enabled admin: add or promote another admin before you {verb} "
                        "them (`rag users add NAME --role admin`)")


# ---------------------------------------------------------------------------------------------
# Sign-in, sessions, sign-out


def authenticate(
    conn: store.Connection, name: str, password: str, now: datetime, policy: SignInPolicy = DEFAULT_POLICY,
) -> Session:
    """Check a name and password and open a session.

    A wrong name and a wrong password give the same message and cost the same (an unknown name
    is checked against a dummy hash). After ``policy.lockout_failures`` failures in a row for one
    name, each within ``policy.lockout_window`` of the one before, the name is locked for 1
    minute, doubling with each further failure up to the window. A window without failures, or
    a success, forgets them. Attempts while locked are refused without checking the password
    and are not counted. Names are tracked as typed, whether or not such a user exists.

    Raises:
        LockedOutError: the name is locked; the message and ``retry_at`` say until when.
        AuthError: a wrong name or password, or a disabled account.
    """
    key = _name_hash(name)
    dummy = _dummy_hash(PASSWORD_HASHER)  # made on the first call whatever the name, so its cost tells nothing
    error: AuthError
    # One transaction: concurrent attempts on one name are counted one after the other.
    with store.transaction(conn):
        _take_turns(conn, key)
        conn.execute(  # names whose last failure is older than the window are forgotten
            "DELETE FROM sign_in_failures WHERE name_hash IN (SELECT name_hash FROM sign_in_failures "
            "GROUP BY name_hash HAVING max(at) < ?)",
            (_iso(now - policy.lockout_window),),
        )
        row = conn.execute(f"SELECT {_USER_COLUMNS}, password_hash FROM users WHERE {_name_is(conn)}",
                           (typed_name(name),)).fetchone()
        user = _user(row) if row else None
        retry_at = _locked_until(conn, key, now, policy)
        if retry_at is not None:
            record(conn, user, "sign_in_locked", {"until": _iso(retry_at)}, at=now)
            error = LockedOutError(_locked_message(retry_at, now), retry_at)
        elif not _verify(row["password_hash"] if row else dummy, password) or user is None:
            conn.execute("INSERT INTO sign_in_failures (name_hash, at) VALUES (?, ?)", (key, _iso(now)))
            # An unknown name is not copied: it may be a password typed into the name box.
            record(conn, user, "sign_in_failed", {"reason": "wrong password" if user else "unknown name"}, at=now)
            retry_at = _locked_until(conn, key, now, policy)
            error = (LockedOutError(f"{WRONG_CREDENTIALS}; {_locked_message(retry_at, now)}", retry_at)
                     if retry_at is not None else AuthError(WRONG_CREDENTIALS))
        elif user.disabled:
            record(conn, user, "sign_in_refused", {"reason": "disabled"}, at=now)
            error = AuthError("this account is disabled: ask an administrator")
        else:
            if PASSWORD_HASHER.check_needs_rehash(row["password_hash"]):
                _update_user(conn, user.id, "password_hash", PASSWORD_HASHER.hash(password))
            conn.execute("DELETE FROM sign_in_failures WHERE name_hash = ?", (key,))
            conn.execute("DELETE FROM sessions WHERE expires_at < ?", (_iso(now),))
            token = secrets.token_urlsafe(32)
            expires = now + policy.idle_timeout
            conn.execute(
                "INSERT INTO sessions (token_hash, user_id, created_at, last_seen, expires_at) VALUES (?, ?, ?, ?, ?)",
                (_token_hash(token), user.id, _iso(now), _iso(now), _iso(expires)),
            )
            record(conn, user, "sign_in", {}, at=now)
            return Session(token=token, user=user, created_at=now, expires_at=expires)  # commits
    raise error  # after the commit, so the failure and its audit row are kept


def _locked_until(conn: store.Connection, key: str, now: datetime, policy: SignInPolicy) -> datetime | None:
    """When the lock on this name ends, or None when it is not locked at ``now``.

    The failures that count are the streak: the newest one, and each earlier one within the
    window of the next (a gap longer than the window, or a success, ends a streak). Steady
    guessing then gets one try per window at most, not ``lockout_failures`` per window.
    """
    streak: list[datetime] = []
    later = now
    for (text,) in conn.execute("SELECT at FROM sign_in_failures WHERE name_hash = ? ORDER BY at DESC", (key,)):
        moment = _parse(text)
        if later - moment > policy.lockout_window:
            conn.execute("DELETE FROM sign_in_failures WHERE name_hash = ? AND at <= ?", (key, text))
            break
        streak.append(moment)
        later = moment
    extra = len(streak) - policy.lockout_failures
    if extra < 0:
        return None
    until = streak[0] + min(policy.lockout_window, BACKOFF_START * 2 ** min(extra, 20))
    return until if now < until else None


def _locked_message(retry_at: datetime, now: datetime) -> str:
    minutes = max(1, math.ceil((retry_at - now).total_seconds() / 60))
    return (f"too many failed sign-ins for this name: try again in {minutes} minute{'s' if minutes > 1 else ''} "
            f"(after {retry_at.astimezone(UTC):%H:%M} UTC)")


def session_user(conn: store.Connection, token: str | None, now: datetime, idle_timeout: timedelta) -> User | None:
    """The signed-in user of a session token, or None (unknown, idle too long, or disabled user).

    Each use moves the expiry forward (sliding expiry); an ended session's row is deleted. The
    user is read afresh, so changed groups or role apply from the next page run.
    """
    if not token:
        return None
    digest = _token_hash(token)
    row = conn.execute(
        f"SELECT s.last_seen, {', '.join('u.' + c for c in _USER_COLUMNS.split(', '))} "
        "FROM sessions s JOIN users u ON u.id = s.user_id WHERE s.token_hash = ?",
        (digest,),
    ).fetchone()
    if row is None:
        return None
    user = _user(row)
    if user.disabled or now >= _parse(row["last_seen"]) + idle_timeout:
        conn.execute("DELETE FROM sessions WHERE token_hash = ?", (digest,))
        return None
    conn.execute("UPDATE sessions SET last_seen = ?, expires_at = ? WHERE token_hash = ?",
                 (_iso(now), _iso(now + idle_timeout), digest))
    return user


def sign_out(conn: store.Connection, token: str | None, now: datetime | None = None) -> None:
    """End a session (a token that is unknown or already ended is fine)."""
    if not token:
        return
    digest = _token_hash(token)
    row = conn.execute(
        f"SELECT {', '.join('u.' + c for c in _USER_COLUMNS.split(', '))} "
        "FROM sessions s JOIN users u ON u.id = s.user_id WHERE s.token_hash = ?",
        (digest,),
    ).fetchone()
    with store.transaction(conn):
        conn.execute("DELETE FROM sessions WHERE token_hash = ?", (digest,))
        if row is not None:
            record(conn, _user(row), "sign_out", {}, at=now)


# ---------------------------------------------------------------------------------------------
# Audit log

# Keys that must never reach the log: a caller passing one has a bug, so record() refuses it.
SECRET_KEYS = frozenset({"password", "password_hash", "token", "token_hash", "secret"})


@dataclass(frozen=True, slots=True)
class AuditRow:
    id: int
    at: str  # UTC, '%Y-%m-%dT%H:%M:%fZ'
    user: str | None  # None: the command line, or an unknown name
    action: str
    detail: dict[str, Any] = field(default_factory=dict)


def record(
    conn: store.Connection, user: User | None, action: str, detail: Mapping[str, Any] | None = None, *,
    at: datetime | None = None,
) -> int:
    """Append one audit row; returns its id. Runs inside the caller's transaction, if any.

    Raises:
        ValueError: ``detail`` holds a key of ``SECRET_KEYS`` (at any depth).
    """
    payload = dict(detail or {})
    _check_no_secrets(payload)
    cursor = conn.execute(
        "INSERT INTO audit_log (at, user_id, user_name, action, detail) "
        "VALUES (coalesce(?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now')), ?, ?, ?, ?)",
        (_iso(at) if at else None, user.id if user else None, user.name if user else None, action,
         json.dumps(payload, ensure_ascii=False, sort_keys=True)),
    )
    return int(cursor.lastrowid)


def _check_no_secrets(value: Any) -> None:
    if isinstance(value, Mapping):
        for key, inner in value.items():
            if str(key).lower() in SECRET_KEYS:
                raise ValueError(f"the audit log never holds a {key!r}")
            _check_no_secrets(inner)
    elif isinstance(value, list | tuple):
        for inner in value:
            _check_no_secrets(inner)


def record_question(
    conn: store.Connection, user: User | None, answer: Answer, *, groups: Iterable[str], collection: str,
    preview: bool = False, at: datetime | None = None,
) -> int:
    """Audit one question: its text, the outcome, the documents cited, the groups it ran with.

    ``preview`` marks an admin's "viewing as" question (``groups`` are then the previewed ones).
    """
    document_of = {h.chunk_id: h.document_id for h in answer.hits}
    detail = {
        "question": answer.question,
        "collection": collection,
        "status": answer.status,
        "refused": answer.status == "no_answer",
        "groups": store.normalize_groups(groups),
        "preview": preview,
        "cited": [
            {"n": c.n, "source": c.source, "document_id": document_of.get(c.chunk_id), "chunk_id": c.chunk_id}
            for c in answer.citations
        ],
    }
    return record(conn, user, "ask", detail, at=at)


def _audit_row(row: Any) -> AuditRow:
    return AuditRow(id=int(row["id"]), at=row["at"], user=row["user_name"], action=row["action"],
                    detail=json.loads(row["detail"]))


def audit_rows(
    conn: store.Connection, since: datetime | None = None, user: str | None = None, *, action: str | None = None,
    until: datetime | None = None,
) -> list[AuditRow]:
    """Audit rows in time order, optionally from ``since`` (inclusive), for one user or action."""
    where, params = [], []
    for clause, value in (("at >= ?", since and _iso(since)), ("at < ?", until and _iso(until)),
                          (_name_is(conn, "user_name"), user and typed_name(user)), ("action = ?", action)):
        if value is not None:
            where.append(clause)
            params.append(value)
    sql = ("SELECT id, at, user_name, action, detail FROM audit_log"
           + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY at, id")
    return [_audit_row(r) for r in conn.execute(sql, params)]


def question_history(conn: store.Connection, user: User, limit: int = 200) -> list[AuditRow]:
    """One user's own questions, newest first."""
    rows = conn.execute(
        "SELECT id, at, user_name, action, detail FROM audit_log WHERE user_id = ? AND action = 'ask' "
        "ORDER BY at DESC, id DESC LIMIT ?",
        (user.id, limit),
    )
    return [_audit_row(r) for r in rows]


CSV_COLUMNS = ("id", "at", "user", "action", "question", "status", "cited", "detail")


def export_csv(rows: Iterable[AuditRow]) -> str:
    """The rows as CSV (RFC 4180 via the csv module), with the question and cited sources in columns.

    A cell starting with ``= + - @`` or a tab/CR gets a leading ``'`` so a spreadsheet shows it as
    text instead of running it as a formula (a question is user input; OWASP "CSV injection").
    """
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        cited = "; ".join(str(c.get("source", "")) for c in row.detail.get("cited", []) if isinstance(c, dict))
        values = [row.id, row.at, row.user or "", row.action, row.detail.get("question", ""),
                  row.detail.get("status", row.detail.get("reason", "")), cited,
                  json.dumps(row.detail, ensure_ascii=False, sort_keys=True)]
        writer.writerow([_csv_cell(v) for v in values])
    return out.getvalue()


def _csv_cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def prune_audit(
    conn: store.Connection, retention_days: int, now: datetime | None = None, *, actor: User | None = None,
) -> int:
    """Delete audit rows older than ``retention_days`` (0 keeps everything); returns how many.

    The prune itself is recorded, so the log shows when its history was shortened. ``actor``:
    the admin doing it from the app, checked and named in that row; None means the command line.

    Raises:
        PermissionDeniedError: ``actor`` may not view (and so manage) the audit log.
    """
    if actor is not None:
        require(actor, "view_audit")
    if retention_days < 0:
        raise ValueError(f"retention_days must be 0 or more (got {retention_days})")
    if retention_days == 0:
        return 0
    now = now or utcnow()
    with store.transaction(conn):
        deleted = conn.execute("DELETE FROM audit_log WHERE at < ?",
                               (_iso(now - timedelta(days=retention_days)),)).rowcount
        record(conn, actor, "audit_prune", {"deleted": deleted, "retention_days": retention_days}, at=now)
    return int(deleted)


def parse_since(text: str) -> datetime:
    """A ``--since`` value: ``YYYY-MM-DD`` (midnight UTC) or an ISO date-time (UTC unless it says)."""
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise RagError(f"not a date: {text!r} (use YYYY-MM-DD or YYYY-MM-DDTHH:MM)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


# ---------------------------------------------------------------------------------------------
# Moving a desk to another database (``rag migrate SRC DEST``)


@dataclass(frozen=True, slots=True)
class TeamCopy:
    """What ``copy_team`` did. ``differing``: names DEST already held with another password, role,
    groups or state; those users are left as DEST has them, and the copy is not verified."""

    users_copied: int
    users_skipped: int  # already in DEST, identical
    differing: list[str] = field(default_factory=list)
    audit_copied: int = 0
    audit_skipped: int = 0  # rows DEST already held (a copy run again)
    audit_missing: int = 0  # rows of SRC still not in DEST afterwards (0 unless something went wrong)

    @property
    def verified(self) -> bool:
        return not self.differing and not self.audit_missing


_COPY_COLUMNS = "name, password_hash, role, groups, disabled, created_at, updated_at"
_SAME_USER = ("password_hash", "role", "groups", "disabled")
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def same_name_key(name: str) -> str:
    """A name as the databases compare it: ASCII letters folded, nothing else (as NOCASE)."""
    return name.translate(_ASCII_LOWER)


AUDIT_PAGE = 5000  # audit rows read per statement (the log of a busy year is millions of rows)
AUDIT_BATCH = 100  # rows per INSERT: 500 parameters, under SQLite's oldest limit of 999


def _audit_pages(conn: store.Connection) -> Iterator[list[Any]]:
    """The audit log in id order, one page at a time (keyset pagination), so memory stays flat."""
    last = 0
    while True:
        rows = conn.execute("SELECT id, at, user_name, action, detail FROM audit_log WHERE id > ? ORDER BY id "
                            "LIMIT ?", (last, AUDIT_PAGE)).fetchall()
        if not rows:
            return
        yield rows
        last = int(rows[-1]["id"])


def _audit_digest(row: Any) -> bytes:
    """What makes two audit rows the same row (time, name, action, detail), in 16 bytes."""
    key = json.dumps([row["at"], row["user_name"], row["action"], row["detail"]], ensure_ascii=False)
    return hashlib.blake2b(key.encode("utf-8"), digest_size=16).digest()


def _audit_digests(conn: store.Connection) -> Counter[bytes]:
    return Counter(_audit_digest(r) for page in _audit_pages(conn) for r in page)


def _insert_audit_rows(dest: store.Connection, rows: list[tuple[Any, ...]]) -> None:
    for i in range(0, len(rows), AUDIT_BATCH):
        batch = rows[i:i + AUDIT_BATCH]
        values = ", ".join(["(?, ?, ?, ?, ?)"] * len(batch))  # placeholders only; the values are bound
        dest.execute(f"INSERT INTO audit_log (at, user_id, user_name, action, detail) VALUES {values}",
                     [v for row in batch for v in row])


def copy_team(src: store.Connection, dest: store.Connection, *, audit: bool = True) -> TeamCopy:
    """Copy every user (password hash, role, groups, disabled, times) and, with ``audit``, the
    audit log from ``src`` to ``dest``, on either backend; safe to run again.

    Users are matched by name (ignoring case, as sign-in does) and get DEST's own ids; their
    argon2 hashes are copied as they are (a PHC string holds its salt and parameters), so every
    password keeps working. A name DEST already holds is never overwritten. Sessions and failed
    sign-ins are not copied: everyone signs in again on the new database. Audit rows keep their
    time, name, action and detail; their user is the DEST user of that name. A row DEST already
    holds (same time, name, action and detail) is not copied twice, so a second run adds nothing.
    Each part is ONE transaction on DEST: an interrupted copy leaves all or none of it.
    """
    copied = skipped = 0
    differing: list[str] = []
    with store.transaction(dest):
        _take_turns(dest, "users")
        for row in src.execute(f"SELECT {_COPY_COLUMNS} FROM users ORDER BY id").fetchall():
            there = dest.execute(f"SELECT {_COPY_COLUMNS} FROM users WHERE {_name_is(dest)}",
                                 (row["name"],)).fetchone()
            if there is None:
                dest.execute(f"INSERT INTO users ({_COPY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                             tuple(row[c] for c in _COPY_COLUMNS.split(", ")))
                copied += 1
            elif all(there[c] == row[c] for c in _SAME_USER):
                skipped += 1
            else:
                differing.append(str(row["name"]))
    if not audit:
        _record_copy(dest, copied, 0)
        return TeamCopy(copied, skipped, differing)
    ids = {same_name_key(u.name): u.id for u in list_users(dest)}
    present = _audit_digests(dest)
    total = audit_copied = 0
    with store.transaction(dest):
        for page in _audit_pages(src):
            new: list[tuple[Any, ...]] = []
            for row in page:
                digest = _audit_digest(row)
                if present[digest] > 0:  # already there (one copy per identical row)
                    present[digest] -= 1
                    continue
                name = row["user_name"]
                new.append((row["at"], ids.get(same_name_key(name)) if name else None, name, row["action"],
                            row["detail"]))
            _insert_audit_rows(dest, new)
            total += len(page)
            audit_copied += len(new)
    missing = sum((_audit_digests(src) - _audit_digests(dest)).values())
    _record_copy(dest, copied, audit_copied)
    return TeamCopy(copied, skipped, differing, audit_copied, total - audit_copied, missing)


def _record_copy(dest: store.Connection, users: int, audit_rows: int) -> None:
    """The copy in DEST's own log (after the copied rows, so a second run finds nothing new)."""
    if users or audit_rows:
        record(dest, None, "team_copy", {"users_copied": users, "audit_rows_copied": audit_rows})
