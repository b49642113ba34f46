"""Who may read what: the one place that decides whether a reader may open a document, a chunk
or a character range of a document.

A reader is a list of groups; every reader also holds the public group ``all``. A document (and
each of its chunks) carries the access key of its own group set, and a reader may see it when
the two sets meet (``store.visible_access_keys``). Retrieval applies the same keys inside its
SQL; this module answers the question for one thing at a time, for the Source and Chunks pages
and the ``rag source`` / ``rag chunks`` commands.

``groups=None`` is the operator (the Documents and Chunks pages, ``rag chunks`` without
``--groups``): every document, whatever its groups. It is never a default: a caller must say so.

The refusal does not tell "missing" from "not yours", so a link cannot probe for documents.
Its message is shown as is by the Source page and printed by the CLI.

Kept out of ``rag.store``: the store owns the schema, writes and plain reads; the decisions
built on them (and the parsing of ids and ranges that arrive as text) are a stage of their own.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rag import store
from rag.errors import NotFoundError, QueryError
from rag.records import DocumentInfo

Groups = Sequence[str] | None  # a reader's groups; None: the operator, who sees every document
OPERATOR: Groups = None  # spelled out where a caller reads as the operator
MAX_ID = 2**63 - 1  # SQLite's largest INTEGER (https://sqlite.org/datatype3.html); larger ids cannot exist


@dataclass(frozen=True, slots=True)
class Passage:
    """Characters ``char_from``–``char_to`` of a document its reader may open."""

    document_id: int
    collection: str
    source: str
    title: str
    groups: list[str]  # who may read the document
    char_from: int
    char_to: int
    text: str  # canonical_text[char_from:char_to]


# ---------------------------------------------------------------------------------------------
# Readers


def reader_text(groups: Sequence[str]) -> str:
    """How a refusal names the reader: ``admin, all``."""
    return ", ".join(groups)


def known_groups(infos: Sequence[DocumentInfo]) -> list[str]:
    """Every group some document names, plus the public group, sorted."""
    return sorted({g for d in infos for g in d.groups} | {store.PUBLIC_GROUP})


def groups_from_param(raw: str | None, known: Sequence[str]) -> list[str]:
    """``?groups=a,b`` (as carried by citation links) restricted to groups the database knows."""
    wanted = [g.strip() for g in (raw or "").split(",") if g.strip()]
    return [g for g in wanted if g in known] or [store.PUBLIC_GROUP]


def document_groups(row: Any) -> list[str]:
    """The groups that may read a stored document (its ``groups`` JSON column)."""
    value = json.loads(row["groups"] or "[]")
    return [str(v) for v in value] if isinstance(value, list) else []


def _may_read(conn: store.Connection, row: Any, groups: Groups) -> bool:
    return groups is None or row["access_key"] in store.visible_access_keys(conn, groups)


# ---------------------------------------------------------------------------------------------
# Parsing what arrives as text (query parameters, command-line arguments)


def parse_document_id(raw: Any) -> int:
    """A document id given as text (``?document=12``)."""
    try:
        return int(str(raw))
    except ValueError as e:
        raise QueryError(f"the document parameter must be a number (got {raw!r})") from e


def parse_range(raw_from: Any, raw_to: Any, length: int) -> tuple[int, int] | None:
    """``from``/``to`` given as text, as a valid range inside a text of ``length``; None when both are absent."""
    if raw_from is None and raw_to is None:
        return None
    try:
        start, end = int(str(raw_from)), int(str(raw_to))
    except ValueError as e:
        raise QueryError(
            f"the passage range must be two whole numbers (got from={raw_from!r}, to={raw_to!r})"
        ) from e
    return check_range(start, end, length)


def check_range(start: int, end: int, length: int) -> tuple[int, int]:
    """``(start, end)`` if it is a non-empty range inside a text of ``length``, else QueryError."""
    if not 0 <= start < end <= length:
        raise QueryError(f"the passage range {start}–{end} lies outside this document (0–{length})")
    return start, end


# ---------------------------------------------------------------------------------------------
# One thing at a time: a document, a chunk, a range


def readable_document(conn: store.Connection, document_id: int, groups: Groups) -> Any:
    """The document row (with its collection name) if the reader may open it.

    Raises:
        NotFoundError: no such document, or not visible to ``groups`` (one message for both).
    """
    row = _get_document(conn, document_id)
    if groups is None:
        if row is None:
            raise NotFoundError(f"no document with id {document_id}")
        return row
    if row is None or not _may_read(conn, row, groups):
        raise NotFoundError(f"no document {document_id} is visible to {reader_text(groups)}")
    return row


def _get_document(conn: store.Connection, document_id: int) -> Any | None:
    if not 0 < document_id <= MAX_ID:
        return None
    try:
        return store.get_document(conn, document_id)
    except NotFoundError:
        return None


def readable_source(conn: store.Connection, collection: str, source: str, groups: Groups) -> Any:
    """A document named by its source path in ``collection``, if the reader may open it.

    Raises:
        NotFoundError: no such collection; no such document, or not visible to ``groups``.
    """
    coll = store.require_collection(conn, collection)
    found = store.find_named_document(conn, coll.id, source)
    if groups is None:
        if found is None:
            raise NotFoundError(f"no document {source!r} in collection {coll.name!r}")
        return store.get_document(conn, int(found["id"]))
    if found is None or not _may_read(conn, found, groups):
        raise NotFoundError(f"no document {source!r} is visible to {reader_text(groups)}")
    return store.get_document(conn, int(found["id"]))


def readable_chunk(conn: store.Connection, chunk_id: int, groups: Groups) -> Any:
    """The chunk row (with its document's source and title) if the reader may open it.

    Raises:
        NotFoundError: no such chunk, or not visible to ``groups`` (one message for both).
    """
    row = store.get_chunk(conn, chunk_id) if 0 < chunk_id <= MAX_ID else None
    if row is None or not _may_read(conn, row, groups):
        reader = f" is visible to {reader_text(groups)}" if groups is not None else ""
        raise NotFoundError(f"no chunk {chunk_id}{reader}")
    return row


def passage_of(row: Any, char_from: int | None = None, char_to: int | None = None) -> Passage:
    """A readable document's text from ``char_from`` to ``char_to`` (both None: all of it).

    Raises:
        QueryError: only one end given, or the range lies outside the document.
    """
    text = row["canonical_text"] or ""
    if char_from is None and char_to is None:
        start, end = 0, len(text)
    elif char_from is None or char_to is None:
        raise QueryError(f"a passage range needs both ends (got from={char_from}, to={char_to})")
    else:
        start, end = check_range(char_from, char_to, len(text))
    return Passage(
        document_id=int(row["id"]), collection=row["collection"], source=row["source"], title=row["title"] or "",
        groups=document_groups(row), char_from=start, char_to=end, text=text[start:end],
    )


def readable_passage(
    conn: store.Connection, document_id: int, char_from: int | None, char_to: int | None, groups: Groups
) -> Passage:
    """Characters ``char_from``–``char_to`` of a document, if the reader may open the document.

    Raises:
        NotFoundError: the document is missing or not visible to ``groups``.
        QueryError: the range lies outside the document.
    """
    return passage_of(readable_document(conn, document_id, groups), char_from, char_to)


# ---------------------------------------------------------------------------------------------
# Listings: what a reader may pick from


def readable_documents(conn: store.Connection, collection: str, groups: Groups) -> list[Any]:
    """Indexed (status ok) documents of a collection that the reader may open, in source order."""
    keys = None if groups is None else set(store.visible_access_keys(conn, groups))
    return [
        r for r in store.document_rows(conn, collection)
        if r["status"] == "ok" and (keys is None or r["access_key"] in keys)
    ]


def readable_chunks(
    conn: store.Connection, groups: Groups, *, document_id: int | None = None, collection: str | None = None
) -> list[Any]:
    """Chunks the reader may open (of one document, or of a collection), in document order."""
    rows = store.chunk_rows(conn, document_id, collection)
    if groups is None:
        return rows
    keys = set(store.visible_access_keys(conn, groups))
    return [r for r in rows if r["access_key"] in keys]


def readable_infos(conn: store.Connection, infos: Sequence[DocumentInfo], groups: Groups) -> list[DocumentInfo]:
    """The documents of ``infos`` (any status) that the reader may see, in their order.

    The Documents page lists these in team mode: an editor sees the status of the documents their
    groups may read, not the names of the others.
    """
    if groups is None:
        return list(infos)
    keys = set(store.visible_access_keys(conn, groups))
    allowed = {
        int(r["id"]) for name in {i.collection for i in infos} for r in store.document_rows(conn, name)
        if r["access_key"] in keys
    }
    return [i for i in infos if i.id in allowed]
