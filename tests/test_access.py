"""rag.access: who may open a document, a chunk, a character range (the Source page, the Chunks
page and `rag source` / `rag chunks` all ask it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rag import access, store
from rag.config import Settings
from rag.errors import NotFoundError, QueryError
from rag.ingest import ingest

from .fakes import FakeEmbedder


@pytest.fixture
def db_path(backend_db: Path | str) -> Path | str:
    """Every test here runs on SQLite and on PostgreSQL (tests/conftest.py), but the SQLITE_ONLY ones."""
    return backend_db

PUBLIC = "# Ports\n\nThe app listens on port 8501. Run make run PORT=8502 to use another one.\n"
ADMIN = "---\ntitle: Backups\ngroups: [admin]\n---\n\n# Backups\n\nCopy rag.db while the app is stopped.\n"


@pytest.fixture
def corpus_conn(conn: store.Connection, settings: Settings, tmp_path: Path) -> store.Connection:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "ports.md").write_text(PUBLIC, encoding="utf-8")
    (corpus / "backups.md").write_text(ADMIN, encoding="utf-8")
    ingest(conn, [corpus], settings=settings, embedder=FakeEmbedder())
    return conn


def _document(conn: store.Connection, source: str) -> Any:
    return next(r for r in store.document_rows(conn) if r["source"] == source)


def _chunk(conn: store.Connection, source: str) -> Any:
    return next(r for r in store.chunk_rows(conn) if r["source"] == source)


def test_an_admin_only_document_is_invisible_to_all(corpus_conn: store.Connection) -> None:
    admin = _document(corpus_conn, "backups.md")
    with pytest.raises(NotFoundError, match=rf"^no document {admin['id']} is visible to all$"):
        access.readable_document(corpus_conn, admin["id"], ["all"])
    assert [r["source"] for r in access.readable_documents(corpus_conn, "default", ["all"])] == ["ports.md"]
    assert access.readable_document(corpus_conn, admin["id"], ["admin"])["source"] == "backups.md"
    assert [r["source"] for r in access.readable_documents(corpus_conn, "default", ["admin"])] == [
        "backups.md", "ports.md"]


def test_missing_and_forbidden_documents_get_the_same_refusal(corpus_conn: store.Connection) -> None:
    admin = _document(corpus_conn, "backups.md")
    with pytest.raises(NotFoundError) as forbidden:
        access.readable_document(corpus_conn, admin["id"], ["sales"])
    with pytest.raises(NotFoundError) as missing:
        access.readable_document(corpus_conn, 424242, ["sales"])
    assert str(forbidden.value).replace(str(admin["id"]), "N") == str(missing.value).replace("424242", "N")
    with pytest.raises(NotFoundError, match=r"^no document 'backups.md' is visible to sales$"):
        access.readable_source(corpus_conn, "default", "backups.md", ["sales"])
    with pytest.raises(NotFoundError, match=r"^no document 'nope.md' is visible to sales$"):
        access.readable_source(corpus_conn, "default", "nope.md", ["sales"])


def test_a_reader_without_the_group_is_refused_a_chunk(corpus_conn: store.Connection) -> None:
    chunk = _chunk(corpus_conn, "backups.md")
    with pytest.raises(NotFoundError, match=rf"^no chunk {chunk['id']} is visible to all$"):
        access.readable_chunk(corpus_conn, chunk["id"], ["all"])
    assert access.readable_chunk(corpus_conn, chunk["id"], ["admin"])["content"] == chunk["content"]
    public = _chunk(corpus_conn, "ports.md")
    assert access.readable_chunk(corpus_conn, public["id"], ["all"])["source"] == "ports.md"
    visible = access.readable_chunks(corpus_conn, ["all"], collection="default")
    assert {r["source"] for r in visible} == {"ports.md"}
    everything = access.readable_chunks(corpus_conn, access.OPERATOR, collection="default")
    assert {r["source"] for r in everything} == {"ports.md", "backups.md"}


def test_a_reader_without_the_group_is_refused_a_range(corpus_conn: store.Connection) -> None:
    chunk = _chunk(corpus_conn, "backups.md")
    with pytest.raises(NotFoundError, match="is visible to all"):
        access.readable_passage(corpus_conn, chunk["document_id"], chunk["char_from"], chunk["char_to"], ["all"])
    passage = access.readable_passage(
        corpus_conn, chunk["document_id"], chunk["char_from"], chunk["char_to"], ["admin", "all"])
    assert passage.text == chunk["content"]
    assert (passage.source, passage.groups, passage.char_from) == ("backups.md", ["admin"], chunk["char_from"])


def test_the_operator_sees_every_document(corpus_conn: store.Connection) -> None:
    admin = _document(corpus_conn, "backups.md")
    assert access.readable_document(corpus_conn, admin["id"], access.OPERATOR)["source"] == "backups.md"
    assert len(access.readable_documents(corpus_conn, "default", access.OPERATOR)) == 2
    with pytest.raises(NotFoundError, match=r"^no document with id 424242$"):
        access.readable_document(corpus_conn, 424242, access.OPERATOR)
    with pytest.raises(NotFoundError, match=r"^no document 'nope.md' in collection 'default'$"):
        access.readable_source(corpus_conn, "default", "nope.md", access.OPERATOR)


def test_ids_beyond_sqlite_integers_are_refused_not_crashed(corpus_conn: store.Connection) -> None:
    # Regression: ?document=99999999999999999999 raised OverflowError when bound to the query.
    huge = access.parse_document_id("99999999999999999999")
    with pytest.raises(NotFoundError, match=r"^no document 99999999999999999999 is visible to all$"):
        access.readable_document(corpus_conn, huge, ["all"])
    with pytest.raises(NotFoundError, match=r"^no document with id 99999999999999999999$"):
        access.readable_document(corpus_conn, huge, access.OPERATOR)
    with pytest.raises(NotFoundError, match="no chunk"):
        access.readable_chunk(corpus_conn, 2**70, ["all"])
    with pytest.raises(NotFoundError):
        access.readable_document(corpus_conn, -1, ["all"])


@pytest.mark.parametrize("raw", ["abc", "", "1.5", "7; DROP TABLE documents"])
def test_a_document_id_that_is_not_a_number_is_a_clear_error(raw: str) -> None:
    with pytest.raises(QueryError, match="the document parameter must be a number"):
        access.parse_document_id(raw)


def test_ranges_are_checked_against_the_document() -> None:
    assert access.parse_range(None, None, 10) is None
    assert access.parse_range("2", "7", 10) == (2, 7)
    assert access.check_range(0, 10, 10) == (0, 10)
    with pytest.raises(QueryError, match=r"^the passage range 50–999999 lies outside this document \(0–10\)$"):
        access.parse_range("50", "999999", 10)
    for start, end in [(5, 5), (7, 2), (-1, 3), (0, 11)]:
        with pytest.raises(QueryError, match="lies outside this document"):
            access.check_range(start, end, 10)
    with pytest.raises(QueryError, match="must be two whole numbers"):
        access.parse_range("3", None, 10)
    with pytest.raises(QueryError, match="must be two whole numbers"):
        access.parse_range("a", "b", 10)


def test_passage_of_needs_both_ends(corpus_conn: store.Connection) -> None:
    row = _document(corpus_conn, "ports.md")
    whole = access.passage_of(store.get_document(corpus_conn, row["id"]))
    assert (whole.char_from, whole.char_to, whole.text) == (0, len(PUBLIC), PUBLIC)
    with pytest.raises(QueryError, match="needs both ends"):
        access.passage_of(store.get_document(corpus_conn, row["id"]), 3, None)


def test_groups_from_a_link_are_limited_to_known_groups() -> None:
    assert access.groups_from_param("admin, ghost", ["admin", "all"]) == ["admin"]
    assert access.groups_from_param(None, ["admin", "all"]) == ["all"]
    assert access.groups_from_param("ghost", ["admin", "all"]) == ["all"]
