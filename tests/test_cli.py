"""CLI commands over a temp database (argparse main(argv))."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rag import cli


def test_ingest_status_chunks_delete_roundtrip(
    tmp_path: Path, db_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from .fakes import FakeEmbedder

    monkeypatch.setattr("rag.embedding.load_embedder", lambda spec="minilm", threads=0: FakeEmbedder())
    corpus = tmp_path / "c"
    corpus.mkdir()
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


def test_known_errors_are_one_line_messages(db_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rag import store

    store.open_db(db_path).close()
    assert cli.main(["chunks", "--db", str(db_path), "--document", "x.md", "--collection", "nope"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no collection named 'nope'") and "Traceback" not in err
