"""Index integrity: does every passage of a collection still cite, and can both branches find it?

The ingest writes a document, its chunks, their vectors and their keyword rows in one transaction,
so a crash never leaves half of one. What can still break the promise is outside that
transaction: a database written by an older version after an upgrade (a downgrade writes chunks
without the vectors the newer tables hold), a file copied while it was written, a disk error, a
hand edit. ``check_index`` reads the invariants the rest of the code relies on, for one
collection, on SQLite and PostgreSQL:

- every chunk's ``content`` is its document's ``canonical_text[char_from:char_to]`` (a citation
  opens the exact passage);
- a document marked ``ok`` has the ``chunk_count`` chunks it says;
- every chunk has its vector (``chunk_vectors``; on SQLite also the vec0 table), so the dense
  branch can find it, and no vector is left without its chunk;
- on SQLite, FTS5's own ``integrity-check`` of the keyword index against the chunks, and
  ``PRAGMA quick_check`` of the file (PostgreSQL keeps the keyword index in the chunk's row and
  checks its own pages).

``repair_index`` mends what it found: the keyword index is rebuilt from the chunks (FTS5
``rebuild``), and every document with a broken passage is processed again from its stored text
(``rag.ingest.reindex`` of those documents).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rag import store

if TYPE_CHECKING:
    from rag.config import Settings
    from rag.embedding import Embedder
    from rag.ingest import IngestReport


@dataclass(frozen=True, slots=True)
class IndexCheck:
    """What ``check_index`` found in one collection (``problems`` empty: sound)."""

    collection: str
    documents: int
    chunks: int
    problems: list[str] = field(default_factory=list)  # one line each, for a reader
    damaged: list[str] = field(default_factory=list)  # sources to process again
    keyword_index: bool = True  # False: the FTS5 index disagrees with the chunks

    @property
    def sound(self) -> bool:
        return not self.problems


def _ids(conn: store.Connection, sql: str, params: tuple[object, ...]) -> set[int]:
    return {int(row[0]) for row in conn.execute(sql, params)}


def check_index(conn: store.Connection, collection: str) -> IndexCheck:
    """Check one collection's passages, vectors and keyword index (module docstring)."""
    coll = store.require_collection(conn, collection)
    problems: list[str] = []
    damaged: dict[str, None] = {}
    documents = store.document_rows(conn, collection)
    source_of = {int(row["id"]): str(row["source"]) for row in documents}
    chunks = store.chunk_rows(conn, collection=collection)
    by_document: dict[int, list[Any]] = {}
    for chunk in chunks:
        by_document.setdefault(int(chunk["document_id"]), []).append(chunk)
    for row in documents:
        own = by_document.get(int(row["id"]), [])
        text = row["canonical_text"] or ""
        wrong = [c for c in own if text[c["char_from"]:c["char_to"]] != c["content"]]
        if wrong:
            problems.append(f"{row['source']}: {len(wrong)} of {len(own)} passages are not the text at their "
                            "offsets (a citation would open the wrong words)")
            damaged[row["source"]] = None
        if row["status"] == "ok" and len(own) != row["chunk_count"]:
            problems.append(f"{row['source']}: {len(own)} passages stored, {row['chunk_count']} recorded")
            damaged[row["source"]] = None
    chunk_of = {int(c["id"]): int(c["document_id"]) for c in chunks}
    with_vector = _ids(conn, "SELECT chunk_id FROM chunk_vectors WHERE collection_id = ?", (coll.id,))
    missing = set(chunk_of) - with_vector
    if not store.is_postgres(conn) and chunk_of:
        table = store.vector_table(coll.dimension)
        exists = conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone()
        in_vec0 = _ids(conn, f"SELECT chunk_id FROM {table}", ()) if exists else set()
        missing |= set(chunk_of) - in_vec0
    if missing:
        sources = sorted({source_of[chunk_of[i]] for i in missing})
        problems.append(f"{len(missing)} passages have no vector, so the dense search cannot find them "
                        f"({', '.join(sources[:5])}{' …' if len(sources) > 5 else ''})")
        damaged.update(dict.fromkeys(sources))
    orphans = with_vector - set(chunk_of)
    if orphans:
        problems.append(f"{len(orphans)} vectors belong to no passage")
    keyword_index = True
    if not store.is_postgres(conn):
        try:  # rank 1: also compare the index with the chunks it was built from (external content)
            conn.execute("INSERT INTO chunks_fts (chunks_fts, rank) VALUES ('integrity-check', 1)")
        except store.database_errors() as e:
            keyword_index = False
            problems.append(f"the keyword index does not match the passages ({e})")
        verdict = [str(row[0]) for row in conn.execute("PRAGMA quick_check")]
        if verdict != ["ok"]:
            problems.append("the database file is damaged: " + "; ".join(verdict[:3]))
    return IndexCheck(collection, len(documents), len(chunks), problems, list(damaged), keyword_index)


def repair_index(
    conn: store.Connection, check: IndexCheck, *, settings: Settings, embedder: Embedder
) -> IngestReport | None:
    """Rebuild the keyword index when it disagrees, and process the damaged documents again from
    their stored text; the reindex report, or None when no document needed it."""
    from rag.ingest import reindex

    if not check.keyword_index:
        with store.transaction(conn):
            conn.execute("INSERT INTO chunks_fts (chunks_fts) VALUES ('rebuild')")
    if not check.damaged:
        return None
    return reindex(conn, settings=settings, embedder=embedder, collection=check.collection, everything=True,
                   sources=set(check.damaged))
