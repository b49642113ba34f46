"""CLI commands over a temp database (argparse main(argv))."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rag import cli, store
from rag.errors import RagError


@pytest.fixture
def corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty folder to ingest, with the CLI's embedder the deterministic fake."""
    from .fakes import FakeEmbedder

    monkeypatch.setattr("rag.registry.load_embedder", lambda spec="minilm", threads=0: FakeEmbedder())
    folder = tmp_path / "c"
    folder.mkdir()
    return folder


def test_ingest_status_chunks_delete_roundtrip(
    corpus: Path, db_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (corpus / "a.md").write_text("# A\n\nAlpha text here.\n", encoding="utf-8")
    (corpus / "b.txt").write_bytes(b"\xff\xfe\x00")
    assert cli.main(["ingest", str(corpus), "--db", str(db_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {r["source"]: r["status"] for r in report["results"]} == {"a.md": "ok", "b.txt": "failed"}
    assert cli.main(["status", "--db", str(db_path)]) == 0
    out = capsys.readouterr().out
    assert "failed" in out and "b.txt" in out and "2 documents: 1 ok, 1 failed" in out
    assert cli.main(["chunks", "--db", str(db_path), "--document", "a.md", "--json"]) == 0
    chunks = json.loads(capsys.readouterr().out)
    assert chunks and set(chunks[0]) == {
        "id", "source", "section", "from", "to", "page", "token_count", "truncated", "content", "text"}
    assert chunks[0]["content"] in "# A\n\nAlpha text here.\n"
    assert cli.main(["delete", "a.md", "--db", str(db_path)]) == 0
    capsys.readouterr()
    assert cli.main(["delete", "a.md", "--db", str(db_path)]) == 1
    assert "no document" in capsys.readouterr().err


def test_status_says_what_stale_documents_need(corpus: Path, db_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # After an upgrade every document an earlier version chunked is stale: the listing said so
    # with a flag and a count, and nothing about what to do.
    (corpus / "a.md").write_text("# A\n\nAlpha text here.\n", encoding="utf-8")
    assert cli.main(["ingest", str(corpus), "--db", str(db_path)]) == 0
    assert cli.main(["status", "--db", str(db_path)]) == 0
    assert "rag reindex" not in capsys.readouterr().out
    conn = store.open_db(db_path)
    conn.execute("UPDATE documents SET pipeline_version = 'from an earlier version'")
    conn.close()
    assert cli.main(["status", "--db", str(db_path)]) == 0
    out = capsys.readouterr().out
    assert "1 documents: 1 ok, 0 failed, 0 pending, 1 stale" in out
    assert "`rag reindex`" in out.splitlines()[-1]
    assert cli.main(["reindex", "--db", str(db_path)]) == 0
    assert cli.main(["status", "--db", str(db_path)]) == 0
    assert "0 stale" in capsys.readouterr().out


def test_a_file_name_with_a_line_break_stays_one_line_of_a_listing(
    corpus: Path, db_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (corpus / "two\nlines.md").write_text("# Two\n\nThe beacon sits on port 9.\n", encoding="utf-8")
    (corpus / "bad\tname.txt").write_bytes(b"\xff\xfe\x00")
    assert cli.main(["ingest", str(corpus), "--db", str(db_path)]) == 0
    assert "FAILED bad\\tname.txt: " in capsys.readouterr().err
    assert cli.main(["status", "--db", str(db_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[-1].startswith("2 documents")
    assert any(line.endswith("default/two\\nlines.md") for line in lines)
    assert cli.main(["chunks", "--db", str(db_path), "--document", "two\nlines.md"]) == 0
    assert capsys.readouterr().out.count("\n") == 1  # one chunk, one line
    assert cli.main(["search", "beacon port", "--db", str(db_path)]) == 0
    assert "two\\nlines.md [" in capsys.readouterr().out
    assert cli.main(["status", "--db", str(db_path), "--json"]) == 0  # JSON keeps the name as it is
    assert "two\nlines.md" in {d["source"] for d in json.loads(capsys.readouterr().out)}


def test_a_document_is_found_by_its_name_in_nfc_or_nfd(
    tmp_path: Path, db_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import unicodedata

    from .fakes import FakeEmbedder

    monkeypatch.setattr("rag.registry.load_embedder", lambda spec="minilm", threads=0: FakeEmbedder())
    nfc = unicodedata.normalize("NFC", "Hướng dẫn VPN.txt")
    nfd = unicodedata.normalize("NFD", nfc)
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / nfd).write_text("Hướng dẫn VPN\n\nKhi gặp lỗi VPN-403, hãy đăng nhập lại.\n", encoding="utf-8")
    assert cli.main(["ingest", str(corpus), "--db", str(db_path)]) == 0
    capsys.readouterr()
    for name in (nfc, nfd):
        assert cli.main(["source", name, "--db", str(db_path)]) == 0
        assert capsys.readouterr().out.startswith("Hướng dẫn VPN\n")
        assert cli.main(["chunks", "--db", str(db_path), "--document", name]) == 0
        assert capsys.readouterr().out.startswith(f"#1 {nfc} [0:")
    assert cli.main(["delete", nfd, "--db", str(db_path)]) == 0
    assert cli.main(["status", "--db", str(db_path)]) == 0
    assert "no documents" in capsys.readouterr().out


def test_known_errors_are_one_line_messages(db_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rag import store

    store.open_db(db_path).close()
    assert cli.main(["chunks", "--db", str(db_path), "--document", "x.md", "--collection", "nope"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no collection named 'nope'") and "Traceback" not in err


@pytest.fixture
def two_readers_db(tmp_path: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A database with one public document and one for admins only."""
    from .fakes import FakeEmbedder

    monkeypatch.setattr("rag.registry.load_embedder", lambda spec="minilm", threads=0: FakeEmbedder())
    corpus = tmp_path / "readers"
    corpus.mkdir()
    (corpus / "ports.md").write_text("# Ports\n\nThe app listens on port 8501.\n", encoding="utf-8")
    (corpus / "backups.md").write_text("---\ngroups: [admin]\n---\n\n# Backups\n\nCopy rag.db while stopped.\n",
                                       encoding="utf-8")
    assert cli.main(["ingest", str(corpus), "--db", str(db_path), "--json"]) == 0
    return db_path


def _ids(db_path: Path) -> dict[str, int]:
    from rag import store

    conn = store.open_db(db_path)
    try:
        return {r["source"]: int(r["id"]) for r in store.document_rows(conn)}
    finally:
        conn.close()


def test_source_prints_a_document_or_a_passage_the_reader_may_see(
    two_readers_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    ids = _ids(two_readers_db)
    assert cli.main(["source", str(ids["ports.md"]), "--db", str(two_readers_db)]) == 0
    assert capsys.readouterr().out == "# Ports\n\nThe app listens on port 8501.\n\n"
    assert cli.main(["source", "ports.md", "--db", str(two_readers_db), "--from", "9", "--to", "16"]) == 0
    assert capsys.readouterr().out == "The app\n"
    assert cli.main(["source", "backups.md", "--db", str(two_readers_db), "--groups", "admin", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["source"] == "backups.md" and shown["groups"] == ["admin"] and shown["document_id"] == ids[
        "backups.md"]
    assert shown["text"].startswith("---\ngroups: [admin]") and shown["char_from"] == 0
    assert set(shown) == {"document_id", "collection", "source", "title", "groups", "char_from", "char_to", "text"}


def test_source_refuses_what_the_reader_may_not_see_with_the_source_pages_words(
    two_readers_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    admin = _ids(two_readers_db)["backups.md"]
    assert cli.main(["source", str(admin), "--db", str(two_readers_db)]) == 1
    captured = capsys.readouterr()
    assert captured.err == f"error: no document {admin} is visible to all\n" and captured.out == ""
    assert cli.main(["source", str(admin), "--db", str(two_readers_db), "--from", "0", "--to", "5"]) == 1
    assert capsys.readouterr().err == f"error: no document {admin} is visible to all\n"
    assert cli.main(["source", "backups.md", "--db", str(two_readers_db), "--groups", "sales"]) == 1
    assert capsys.readouterr().err == "error: no document 'backups.md' is visible to sales\n"
    assert cli.main(["source", "99999999999999999999", "--db", str(two_readers_db)]) == 1
    assert capsys.readouterr().err == "error: no document 99999999999999999999 is visible to all\n"
    assert cli.main(["source", "ports.md", "--db", str(two_readers_db), "--from", "5", "--to", "999"]) == 1
    assert "lies outside this document" in capsys.readouterr().err
    assert cli.main(["source", "ports.md", "--db", str(two_readers_db), "--from", "5"]) == 1
    assert "needs both ends" in capsys.readouterr().err
    missing = two_readers_db.parent / "none.db"
    assert cli.main(["source", "1", "--db", str(missing)]) == 1
    assert "no database at" in capsys.readouterr().err and not missing.exists()  # a read never creates one


def test_chunks_honours_groups(two_readers_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert cli.main(["chunks", "--db", str(two_readers_db), "--json"]) == 0
    assert {c["source"] for c in json.loads(capsys.readouterr().out)} == {"ports.md", "backups.md"}
    assert cli.main(["chunks", "--db", str(two_readers_db), "--groups", "all", "--json"]) == 0
    assert {c["source"] for c in json.loads(capsys.readouterr().out)} == {"ports.md"}
    assert cli.main(["chunks", "--db", str(two_readers_db), "--groups", "admin", "--document", "backups.md"]) == 0
    assert "backups.md" in capsys.readouterr().out
    assert cli.main(["chunks", "--db", str(two_readers_db), "--groups", "all", "--document", "backups.md"]) == 1
    assert capsys.readouterr().err == "error: no document 'backups.md' is visible to all\n"


def test_status_and_chunks_name_a_collection_that_is_not_there(
    two_readers_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    for command in ("status", "chunks", "search"):  # search has always said so; status and chunks now do too
        argv = [command, *(["vpn"] if command == "search" else []), "--db", str(two_readers_db)]
        assert cli.main([*argv, "--collection", "nocoll"]) == 1, command
        captured = capsys.readouterr()
        assert captured.err == "error: no collection named 'nocoll'. Collections here: default.\n", command
        assert captured.out == "", command
    assert cli.main(["status", "--db", str(two_readers_db), "--collection", "default"]) == 0
    assert "2 documents: 2 ok" in capsys.readouterr().out
    assert cli.main(["status", "--db", str(two_readers_db)]) == 0  # no --collection: every collection
    assert "2 documents: 2 ok" in capsys.readouterr().out


def test_search_says_how_it_mended_the_spelling_for_this_reader(
    two_readers_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert cli.main(["search", "which prot does the app listen on", "--db", str(two_readers_db)]) == 0
    out = capsys.readouterr().out
    assert "spelling: prot -> port" not in out  # "prot" is four letters: too short to guess
    assert cli.main(["search", "where do the bakcups go", "--db", str(two_readers_db), "--groups", "admin"]) == 0
    out = capsys.readouterr().out
    assert "spelling: bakcups -> backups" in out and "backups.md" in out
    assert cli.main(["search", "where do the bakcups go", "--db", str(two_readers_db)]) == 0
    assert "spelling:" not in capsys.readouterr().out  # "backups" is only in the admins' document


def test_models_lists_the_directory_and_prunes_what_nothing_loads(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from rag.assets import QWEN_CODER_05B

    from .fakes import old_install_models

    assert cli.main(["models"]) == 0
    assert "empty: models are assembled or exported here on first use" in capsys.readouterr().out
    source, copy = old_install_models()
    assert cli.main(["models"]) == 0
    out = capsys.readouterr().out
    assert f"{copy.name}  {QWEN_CODER_05B.name} as q4_0: the file the app loads" in out
    assert "3 MB  in all; `rag models prune` frees 2 MB" in out

    for setting in ("RAG_LLM_PATH", "RAG_ANSWER_EXAMINER"):  # a user pointed a model setting at it: kept
        monkeypatch.setenv(setting, str(source))
        assert cli.main(["models", "prune"]) == 0
        assert "deleted 0 file(s), 0 MB" in capsys.readouterr().out and source.exists()
        monkeypatch.delenv(setting)
    assert cli.main(["models", "prune", "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith(f"would delete {source.name} (2 MB): input of the q4_0 copy")
    assert source.exists()
    assert cli.main(["models", "prune"]) == 0
    assert "deleted 1 file(s), 2 MB" in capsys.readouterr().out
    assert not source.exists() and copy.exists()
    assert cli.main(["models", "--json"]) == 0
    assert [entry["path"] for entry in json.loads(capsys.readouterr().out)] == [str(copy)]


def test_prepare_report_creates_folders_and_refuses_a_folder_or_a_file_in_the_way(tmp_path: Path) -> None:
    new = tmp_path / "deep" / "er" / "report.json"
    cli.prepare_report(str(new))
    assert new.parent.is_dir() and not new.exists()  # folders made, no empty report left behind
    kept = tmp_path / "old.json"
    kept.write_text("previous run\n", encoding="utf-8")
    cli.prepare_report(str(kept))
    assert kept.read_text(encoding="utf-8") == "previous run\n"  # checked, not truncated
    with pytest.raises(RagError) as folder:
        cli.prepare_report(str(tmp_path))
    assert str(folder.value) == f"cannot write the report to {tmp_path}: it is a folder; give a file name"
    with pytest.raises(RagError) as under_file:
        cli.prepare_report(str(kept / "x.json"))
    assert str(under_file.value) == f"cannot write the report to {kept / 'x.json'}: {kept} is a file, not a folder"
    cli.prepare_report("-")
    cli.prepare_report(None)


def test_a_report_that_cannot_be_written_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*_a: object, **_k: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(RagError) as error:
        cli.write_report("{}", str(tmp_path / "r.json"))
    assert str(error.value) == f"cannot write the report to {tmp_path / 'r.json'}: No space left on device"


def test_the_permissions_guide_says_which_commands_run_as_all_and_which_are_operator_views() -> None:
    import argparse

    from .conftest import GUIDE

    parser, _ = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    groups_default = {name: next((a.default for a in commands[name]._actions if a.dest == "groups"), "no option")
                      for name in ("ask", "search", "source", "chunks", "status")}
    assert groups_default == {"ask": "all", "search": "all", "source": "all", "chunks": None, "status": "no option"}
    for page, sentences in {
        "permissions.md": ["Without `--groups`, `rag ask`, `rag search` and `rag source` run as a reader holding "
                           "only `all`.", "`rag chunks` and `rag status` are operator views"],
        "vi/quyen-truy-cap.md": ["Không có `--groups`, các lệnh `rag ask`, `rag search` và `rag source` chạy như "
                                 "một người đọc chỉ có nhóm `all`.", "`rag chunks` và `rag status` là các chế độ "
                                 "xem của người vận hành"],
    }.items():
        text = " ".join((GUIDE / page).read_text(encoding="utf-8").split())
        assert "Without `--groups` a command runs as a reader holding only `all`" not in text
        for sentence in sentences:
            assert sentence in text, (page, sentence)


class FakeTerminal:
    """A stdout that says it is a terminal and keeps what was written."""

    def __init__(self) -> None:
        self.written: list[str] = []

    def write(self, text: str) -> int:
        self.written.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


def test_a_documents_control_characters_are_shown_not_obeyed_on_a_terminal(
    tmp_path: Path, db_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from .fakes import FakeEmbedder

    monkeypatch.setattr("rag.registry.load_embedder", lambda spec="minilm", threads=0: FakeEmbedder())
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "t.txt").write_text("Title\n\nThe beacon \x1b]2;pwned\x07 sits \x1b[31mred\x1b[0m on port 9.\n",
                                  encoding="utf-8")
    assert cli.main(["ingest", str(corpus), "--db", str(db_path)]) == 0
    capsys.readouterr()
    terminal, piped = FakeTerminal(), sys.stdout
    monkeypatch.setattr(sys, "stdout", terminal)
    assert cli.main(["search", "beacon port", "--db", str(db_path), "--stage", "fts"]) == 0
    shown = "".join(terminal.written)
    assert "\\x1b]2;pwned\\x07" in shown and "\\x1b[31mred" in shown
    assert "\x1b" not in shown and "\x07" not in shown and "\n" in shown
    assert sys.stdout is terminal  # put back after the command
    monkeypatch.setattr(sys, "stdout", piped)
    assert cli.main(["search", "beacon port", "--db", str(db_path), "--stage", "fts"]) == 0
    assert "\x1b[31mred" in capsys.readouterr().out  # a pipe or a file gets the text as it is


def test_document_changes_from_the_command_line_are_audited_on_a_team_desk(
    corpus: Path, db_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rag import auth, store

    (corpus / "a.md").write_text("# A\n\nAlpha text here.\n", encoding="utf-8")
    (corpus / "b.md").write_text("# B\n\nBeta text here.\n", encoding="utf-8")
    assert cli.main(["ingest", str(corpus), "--db", str(db_path)]) == 0  # a desktop desk keeps no log
    conn = store.open_db(db_path)
    assert auth.audit_rows(conn) == []
    auth.add_user(conn, "root", "root-password-1", role="admin")
    assert cli.main(["ingest", str(corpus), "--db", str(db_path)]) == 0
    assert cli.main(["delete", "b.md", "--db", str(db_path)]) == 0
    assert cli.main(["reindex", "--db", str(db_path)]) == 0
    capsys.readouterr()
    rows = [r for r in auth.audit_rows(conn) if r.action != "user_add"]
    assert [(r.user, r.action) for r in rows] == [(None, "ingest"), (None, "delete_documents"), (None, "ingest")]
    assert rows[0].detail["from"] == "command line" and "2 files" in rows[0].detail["summary"]
    assert rows[1].detail["sources"] == ["b.md"] and rows[2].detail["reindex"] is True
    conn.close()
