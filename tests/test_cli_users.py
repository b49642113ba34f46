"""Team mode on the command line: `rag users ...`, `rag audit ...`, `rag serve --team`, and the
users `rag migrate` copies; on SQLite and on PostgreSQL (tests/conftest.py)."""

from __future__ import annotations

import argparse
import csv
import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from argon2 import PasswordHasher

from rag import auth, cli, store
from rag.errors import AuthError

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def db_path(backend_db: Path | str) -> Path | str:
    """Every test here runs on SQLite and on PostgreSQL (tests/conftest.py)."""
    return backend_db


@pytest.fixture(autouse=True)
def fast_hasher(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth, "PASSWORD_HASHER", PasswordHasher(time_cost=1, memory_cost=8, parallelism=1))


class Stdin(io.StringIO):
    def __init__(self, text: str, tty: bool = False) -> None:
        super().__init__(text)
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def run(argv: list[str], monkeypatch: pytest.MonkeyPatch, stdin: str = "") -> int:
    monkeypatch.setattr("sys.stdin", Stdin(stdin))
    return cli.main(argv)


def sign_in(db_path: Path | str, name: str, password: str) -> auth.Session:
    conn = store.open_db(db_path)
    try:
        return auth.authenticate(conn, name, password, T0)
    finally:
        conn.close()


def test_users_add_list_passwd_groups_role_disable_enable_with_the_password_on_stdin(
    db_path: Path | str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = ["--db", str(db_path)]
    assert run(["users", "add", "root", "--role", "admin", *db], monkeypatch, "root-password\n") == 0
    assert run(["users", "add", "alice", "--groups", "hr,eng", *db], monkeypatch, "alice-password\r\n") == 0
    out = capsys.readouterr().out
    assert "added root                 admin   active   groups: all" in out
    assert "added alice                reader  active   groups: eng, hr" in out
    assert sign_in(db_path, "alice", "alice-password").user.groups == ["eng", "hr"]  # the CR LF is not kept

    assert run(["users", "list", "--json", *db], monkeypatch) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(u["name"], u["role"], u["groups"], u["disabled"]) for u in listed] == [
        ("alice", "reader", ["eng", "hr"], False), ("root", "admin", ["all"], False)]
    assert set(listed[0]) == {"id", "name", "role", "groups", "disabled", "created_at", "updated_at"}

    assert run(["users", "passwd", "alice", *db], monkeypatch, "another-password\n") == 0
    assert run(["users", "groups", "alice", "--groups", "finance", *db], monkeypatch) == 0
    assert run(["users", "role", "alice", "editor", *db], monkeypatch) == 0
    capsys.readouterr()
    with pytest.raises(AuthError):
        sign_in(db_path, "alice", "alice-password")
    user = sign_in(db_path, "alice", "another-password").user
    assert (user.groups, user.role) == (["finance"], "editor")

    assert run(["users", "disable", "alice", *db], monkeypatch) == 0
    assert "disabled alice" in capsys.readouterr().out
    with pytest.raises(AuthError, match="disabled"):
        sign_in(db_path, "alice", "another-password")
    assert run(["users", "enable", "alice", *db], monkeypatch) == 0
    assert sign_in(db_path, "alice", "another-password").user.name == "alice"

    assert run(["users", "list", *db], monkeypatch) == 0
    out = capsys.readouterr().out
    assert "alice                editor  active   groups: finance" in out
    for password in ("root-password", "alice-password", "another-password"):
        assert password not in out


def test_users_errors_are_one_line(db_path: Path | str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    db = ["--db", str(db_path)]
    assert run(["users", "add", "bob", *db], monkeypatch, "short\n") == 1
    assert capsys.readouterr().err == "error: the password must have at least 8 characters\n"
    assert run(["users", "add", "bob", *db], monkeypatch, "") == 1
    assert "no password on standard input" in capsys.readouterr().err
    assert run(["users", "add", "two words", *db], monkeypatch, "long-enough\n") == 1
    assert "invalid user name" in capsys.readouterr().err
    assert run(["users", "add", "bob", *db], monkeypatch, "long-enough\n") == 0
    assert run(["users", "add", "BOB", *db], monkeypatch, "") == 1  # refused before the password is read
    assert "already exists" in capsys.readouterr().err
    assert run(["users", "passwd", "nobody", *db], monkeypatch, "long-enough\n") == 1
    assert "no user named 'nobody'" in capsys.readouterr().err
    assert run(["users", "list", "--db", str(tmp_path / "missing.db")], monkeypatch) == 1
    assert "no database" in capsys.readouterr().err


def test_a_terminal_is_asked_twice_with_getpass(db_path: Path | str, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    typed = iter(["typed-password", "typed-password", "first-typing", "second-typing"])
    prompts: list[str] = []
    monkeypatch.setattr("getpass.getpass", lambda prompt="": prompts.append(prompt) or next(typed))
    monkeypatch.setattr("sys.stdin", Stdin("", tty=True))
    assert cli.main(["users", "add", "carol", "--db", str(db_path)]) == 0
    assert prompts == ["Password: ", "Again: "]
    assert sign_in(db_path, "carol", "typed-password").user.name == "carol"
    assert cli.main(["users", "passwd", "carol", "--db", str(db_path)]) == 1
    assert "the two passwords differ" in capsys.readouterr().err
    assert sign_in(db_path, "carol", "typed-password").user.name == "carol"  # unchanged


def test_no_password_can_be_given_on_the_command_line(db_path: Path | str, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["users", "add", "dave", "--password", "in-argv-password"],
                 ["users", "passwd", "dave", "--password=in-argv-password"],
                 ["users", "add", "dave", "in-argv-password"]):
        with pytest.raises(SystemExit) as caught:
            run([*argv, "--db", str(db_path)], monkeypatch, "stdin-password\n")
        assert caught.value.code == 2
        assert "unrecognized arguments" in capsys.readouterr().err
    parser, _ = cli.build_parser()
    users = next(a for a in parser._subparsers._group_actions[0].choices["users"]._actions
                 if isinstance(a, argparse._SubParsersAction))
    options = [o for sub in users.choices.values() for a in sub._actions for o in a.option_strings]
    assert "--db" in options and not [o for o in options if "pass" in o or "secret" in o]


def test_audit_log_since_user_csv_and_prune(db_path: Path | str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    db = ["--db", str(db_path)]
    assert run(["users", "add", "alice", *db], monkeypatch, "alice-password\n") == 0
    conn = store.open_db(db_path)
    alice = auth.require_user(conn, "alice")
    auth.record(conn, alice, "ask", {"question": "old one", "status": "answered", "cited": []},
                at=T0 - timedelta(days=400))
    auth.record(conn, alice, "ask", {"question": "Leave days?", "status": "answered",
                                     "cited": [{"source": "hr/leave.md"}]}, at=T0)
    with pytest.raises(AuthError):
        auth.authenticate(conn, "alice", "wrong-password", T0 + timedelta(minutes=1))
    conn.close()
    capsys.readouterr()

    assert run(["audit", "--since", "2026-03-01", "--user", "alice", *db], monkeypatch) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "2026-03-01T09:00:00.000Z  alice            ask             'Leave days?' -> answered; cited hr/leave.md",
        '2026-03-01T09:01:00.000Z  alice            sign_in_failed  {"reason": "wrong password"}',
    ]
    target = tmp_path / "out" / "audit.csv"
    assert run(["audit", "--user", "alice", "--action", "ask", "--csv", str(target), *db], monkeypatch) == 0
    assert "wrote 2 audit rows" in capsys.readouterr().err
    table = list(csv.reader(io.StringIO(target.read_text(encoding="utf-8"))))
    assert [r[4] for r in table] == ["question", "old one", "Leave days?"]
    assert run(["audit", "--csv", str(target.parent), *db], monkeypatch) == 1
    assert capsys.readouterr().err == (f"error: cannot write the report to {target.parent}: it is a folder; give a "
                                       "file name\n")
    assert run(["audit", "--json", "--since", "2026-03-01T09:00:30Z", "--user", "alice", *db], monkeypatch) == 0
    assert [r["action"] for r in json.loads(capsys.readouterr().out)] == ["sign_in_failed"]
    assert run(["audit", "--since", "yesterday", *db], monkeypatch) == 1
    assert "not a date" in capsys.readouterr().err

    # The retention comes from the settings; it is chosen so that T0 - 400 days goes, whatever today is.
    days = (auth.utcnow() - (T0 - timedelta(days=200))).days
    monkeypatch.setenv("RAG_AUDIT_RETENTION_DAYS", str(days))
    assert run(["audit", "prune", *db], monkeypatch) == 0
    assert capsys.readouterr().out == f"audit log: deleted 1 rows older than {days} days\n"
    assert run(["audit", *db, "prune", "--days", "0"], monkeypatch) == 0  # --db before the subcommand counts
    assert "kept everything" in capsys.readouterr().out
    conn = store.open_db(db_path)
    assert [r.detail.get("question") for r in auth.audit_rows(conn, action="ask")] == ["Leave days?"]
    conn.close()


def serve(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], dict[str, str]]]:
    launched: list[tuple[list[str], dict[str, str]]] = []

    def launch(command: list[str], env: dict[str, str]) -> int:
        launched.append((command, env))
        return 0

    monkeypatch.setattr(cli, "launch_streamlit", launch)
    assert cli.main(["serve", *argv]) in (0, 1)
    return launched


def test_serve_team_refuses_without_an_admin_and_prints_the_command(
    db_path: Path | str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = ["--db", str(db_path)]
    assert serve(["--team", *db], monkeypatch) == []  # no database at all
    err = capsys.readouterr().err
    assert "team mode needs an admin" in err
    assert f"    rag users add NAME --role admin --db {store.display_location(str(db_path))}" in err
    assert run(["users", "add", "root", "--role", "admin", *db], monkeypatch, "root-password\n") == 0
    assert run(["users", "add", "other", "--role", "admin", *db], monkeypatch, "root-password\n") == 0
    assert run(["users", "disable", "root", *db], monkeypatch) == 0
    assert run(["users", "role", "other", "reader", *db], monkeypatch) == 1  # the last admin stays
    conn = store.open_db(db_path)
    conn.execute("UPDATE users SET disabled = 1")  # a disabled admin is no admin
    conn.close()
    capsys.readouterr()
    assert serve(["--team", *db], monkeypatch) == []
    assert "rag users add NAME --role admin" in capsys.readouterr().err


def test_serve_team_starts_streamlit_with_auth_on(db_path: Path | str, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    db = ["--db", str(db_path)]
    assert run(["users", "add", "root", "--role", "admin", *db], monkeypatch, "root-password\n") == 0
    [(command, env)] = serve(["--team", "--port", "8600", *db], monkeypatch)
    assert command[1:4] == ["-m", "streamlit", "run"] and command[4] == str(cli.app_script())
    assert command[5:] == ["--server.fileWatcherType", "none", "--server.port", "8600"]
    # a file is made absolute (Streamlit runs elsewhere); a PostgreSQL URL is passed on as it is
    assert env["RAG_AUTH"] == "1" and env["RAG_DB"] == (db_path if isinstance(db_path, str) else str(db_path.resolve()))
    assert "team mode (sign-in required)" in capsys.readouterr().err


def test_serve_desktop_needs_no_admin_and_auth_true_in_rag_toml_means_team(
    db_path: Path | str, data_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    [(_, env)] = serve(["--db", str(db_path)], monkeypatch)
    assert "RAG_AUTH" not in env and "desktop mode" in capsys.readouterr().err
    data_dir.mkdir(parents=True)
    (data_dir / "rag.toml").write_text("auth = true\n", encoding="utf-8")
    assert serve(["--db", str(db_path)], monkeypatch) == []
    assert "team mode needs an admin" in capsys.readouterr().err


def test_cmd_serve_takes_an_injected_launcher(db_path: Path | str) -> None:
    from rag.resources import Resources

    calls: list[Any] = []
    args = argparse.Namespace(team=False, db=None, port=None)
    resources = Resources(cli.load_settings(db_path=db_path))
    assert cli.cmd_serve(args, resources, launch=lambda command, env: calls.append(command) or 7) == 7
    assert calls and calls[0][-2:] == ["--server.fileWatcherType", "none"]


def test_migrate_copies_the_users_and_the_audit_log_to_postgresql(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "team.db"
    db = ["--db", str(source)]
    assert run(["users", "add", "root", "--role", "admin", *db], monkeypatch, "root-password\n") == 0
    assert run(["users", "add", "alice", "--groups", "hr", *db], monkeypatch, "alice-password\n") == 0
    with pytest.raises(AuthError):
        sign_in(source, "alice", "wrong-password")
    capsys.readouterr()

    assert cli.main(["migrate", str(source), pg_url]) == 0  # no collection: only the desk's users and log
    assert capsys.readouterr().out == "users: 2 copied, 0 already there; audit log: 3 rows copied, 0 already there\n"
    assert sign_in(pg_url, "alice", "alice-password").user.groups == ["hr"]
    assert run(["users", "list", "--db", pg_url], monkeypatch) == 0
    assert "alice                reader  active   groups: hr" in capsys.readouterr().out
    assert run(["audit", "--user", "alice", "--db", pg_url], monkeypatch) == 0
    assert [line.split()[2] for line in capsys.readouterr().out.splitlines()] == [
        "sign_in_failed", "sign_in"]  # the copied failure, then the sign-in on the new database
    [(_, env)] = serve(["--team", "--db", pg_url], monkeypatch)  # the copied admin lets team mode start
    assert env["RAG_DB"] == pg_url and env["RAG_AUTH"] == "1"
    capsys.readouterr()

    assert cli.main(["migrate", str(source), pg_url]) == 0  # again: nothing new
    assert capsys.readouterr().out.endswith("users: 0 copied, 2 already there; audit log: 0 rows copied, "
                                            "3 already there\n")

    assert cli.main(["migrate", str(source), str(tmp_path / "empty.db"), "--no-users"]) == 0
    assert "users:" not in capsys.readouterr().out
    assert run(["users", "list", "--db", str(tmp_path / "empty.db")], monkeypatch) == 0
    assert "no users" in capsys.readouterr().out
    assert cli.main(["migrate", str(tmp_path / "empty.db"), str(tmp_path / "copy.db")]) == 0
    assert "users:" not in capsys.readouterr().out  # a desktop desk: no users, no log, no line about them

    other = tmp_path / "other.db"
    assert run(["users", "add", "ALICE", "--db", str(other)], monkeypatch, "a different one\n") == 0
    capsys.readouterr()
    assert cli.main(["migrate", str(source), str(other), "--no-audit"]) == 1
    out = capsys.readouterr().out
    assert "users: 1 copied, 0 already there, 1 differ: NOT VERIFIED" in out and "audit log" not in out
    assert "user 'alice' exists in the destination with another password, role, groups or state" in out
    assert sign_in(other, "alice", "a different one").user.name == "ALICE"  # left as it was there
