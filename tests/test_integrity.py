"""Index integrity (rag audit index): broken passages, missing vectors and a keyword index that
disagrees are found, and --repair mends them."""

from __future__ import annotations

from pathlib import Path

import pytest

from rag import store
from rag.config import Settings
from rag.ingest import ingest
from rag.integrity import check_index, repair_index

from .conftest import SQLITE_ONLY
from .fakes import FakeEmbedder


@pytest.fixture
def db_path(backend_db: Path | str) -> Path | str:
    """Every test here runs on SQLite and on PostgreSQL (tests/conftest.py), but the SQLITE_ONLY ones."""
    return backend_db


@pytest.fixture
def indexed(conn: store.Connection, settings: Settings, tmp_path: Path) -> store.Connection:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "leave.md").write_text("# Leave\n\n## Annual\n\nEvery employee has 25 days of annual leave.\n\n"
                                     "## Sick\n\nSick leave needs a note after three days.\n", encoding="utf-8")
    (folder / "vpn.md").write_text("# VPN\n\nThe VPN gateway is vpn-gw-7.\n", encoding="utf-8")
    ingest(conn, [folder], settings=settings, embedder=FakeEmbedder())
    return conn


def first_chunk(conn: store.Connection, source: str) -> int:
    return int(next(c["id"] for c in store.chunk_rows(conn, collection="default") if c["source"] == source))


def test_a_fresh_index_is_sound(indexed: store.Connection, settings: Settings) -> None:
    check = check_index(indexed, settings.collection)
    assert check.sound and check.problems == [] and check.damaged == []
    assert (check.documents, check.chunks) == (2, len(store.chunk_rows(indexed, collection="default")))


def test_moved_offsets_and_missing_vectors_are_found_and_repaired(
    indexed: store.Connection, settings: Settings
) -> None:
    with store.transaction(indexed):
        indexed.execute("UPDATE chunks SET char_from = char_from + 1 WHERE id = ?", (first_chunk(indexed, "leave.md"),))
        indexed.execute("DELETE FROM chunk_vectors WHERE chunk_id = ?", (first_chunk(indexed, "vpn.md"),))
    check = check_index(indexed, settings.collection)
    assert not check.sound and sorted(check.damaged) == ["leave.md", "vpn.md"]
    assert any("leave.md: 1 of" in p and "not the text at their offsets" in p for p in check.problems)
    assert any("1 passages have no vector" in p and "vpn.md" in p for p in check.problems)
    report = repair_index(indexed, check, settings=settings, embedder=FakeEmbedder())
    assert report is not None and report.count("ok") == 2
    assert check_index(indexed, settings.collection).sound


@SQLITE_ONLY
def test_a_keyword_index_out_of_step_and_a_missing_vec0_row_are_found_and_repaired(
    indexed: store.Connection, settings: Settings
) -> None:
    chunk = first_chunk(indexed, "vpn.md")
    coll = store.require_collection(indexed, settings.collection)
    with store.transaction(indexed):
        # an external-content FTS5 row deleted with other words than it holds: the index goes out of step
        indexed.execute("INSERT INTO chunks_fts (chunks_fts, rowid, fts_heading, fts_body) "
                        "VALUES ('delete', ?, 'nothing', 'like it')", (chunk,))
        indexed.execute(f"DELETE FROM {store.vector_table(coll.dimension)} WHERE chunk_id = ?",
                        (first_chunk(indexed, "leave.md"),))
    check = check_index(indexed, settings.collection)
    assert not check.keyword_index and check.damaged == ["leave.md"]
    assert any(p.startswith("the keyword index does not match the passages") for p in check.problems)
    repair_index(indexed, check, settings=settings, embedder=FakeEmbedder())
    assert check_index(indexed, settings.collection).sound


def test_audit_index_on_the_command_line(
    indexed: store.Connection, settings: Settings, db_path: Path | str, capsys: pytest.CaptureFixture[str]
) -> None:
    from rag.cli import main

    assert main(["audit", "index", "--db", str(db_path)]) == 0
    assert "2 documents" in capsys.readouterr().out
    with store.transaction(indexed):
        indexed.execute("DELETE FROM chunk_vectors WHERE chunk_id = ?", (first_chunk(indexed, "vpn.md"),))
    assert main(["audit", "index", "--db", str(db_path)]) == 1
    out = capsys.readouterr().out
    assert "1 problem(s)" in out and "rag audit index --repair" in out
