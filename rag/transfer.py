"""``rag migrate SRC DEST``: copy collections between databases of either backend.

Documents are copied with their chunks, folded FTS texts and stored vectors (nothing is
re-embedded), each through ``store.replace_document``, so each lands in ONE transaction on the
destination and an interrupted copy leaves whole documents only. Run it again to resume: a
document already in DEST with the same content hash, status, chunk count, groups, path and title
is skipped (one whose folder moved or whose title changed is copied again, in place).
Into an empty PostgreSQL database the copy is a bulk load (``rag.pg.bulk_load``): the search
indexes are built once at the end, as an ops team restores a dump, instead of row by row.
Afterwards the copy is verified by counts (documents, chunks per collection) and by the SHA-256
of a sample of vectors, matched by (source, ordinal).

Permissions travel as they are: a document's groups, and a withheld document (failed, its
permissions unknown) stays withheld. Team mode's users and audit log are copied by
``rag.auth.copy_team`` (``rag migrate`` runs it after the collections), then ``copy_history``
brings what the desk learnt and said about those collections: each collection's fitted
answer-or-refuse decision, its evaluation history (runs with every per-query result) and its
chats, each turn kept with its reader (matched by user name). Sessions are not copied: everyone
signs in again.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rag import decide, store
from rag.auth import same_name_key
from rag.errors import IndexMismatchError
from rag.records import Chunk, Collection

VERIFY_SAMPLE = 200  # vectors whose checksums are compared per collection


@dataclass(frozen=True, slots=True)
class CollectionCopy:
    name: str
    copied: int  # documents written to DEST this run
    skipped: int  # documents DEST already held unchanged (a resumed copy)
    documents: tuple[int, int]  # (SRC, DEST) document counts after the copy
    chunks: tuple[int, int]  # (SRC, DEST) chunk counts
    vectors_checked: int
    vectors_differing: list[str] = field(default_factory=list)  # "source#ordinal" whose checksums differ

    @property
    def verified(self) -> bool:
        return (self.documents[0] == self.documents[1] and self.chunks[0] == self.chunks[1]
                and not self.vectors_differing)


def vector_checksum(vector: np.ndarray) -> str:
    """SHA-256 of a vector's float32 little-endian bytes (``store.serialize_vector``)."""
    return hashlib.sha256(store.serialize_vector(vector)).hexdigest()


def _target_collection(dest: store.Connection, source: Collection) -> Collection:
    found = store.get_collection(dest, source.name)
    if found is None:
        return store.create_collection(dest, source.name, source.embedder, source.dimension, source.strategy,
                                       source.metric, source.max_distance)
    if (found.embedder, found.dimension) != (source.embedder, source.dimension):
        raise IndexMismatchError(
            f"collection {source.name!r} exists in the destination with embedding model {found.embedder!r} "
            f"({found.dimension}-d), the source's is {source.embedder!r} ({source.dimension}-d): copy it under "
            "another name or into another database"
        )
    return found


def _unchanged(row: Any, existing: Any | None) -> bool:
    """DEST holds this document as the source does: same content, state, permissions, and the same
    path and title (a folder moved, or a title edited, with the bytes unchanged, is copied again,
    so that DEST's prune and citations follow the source's)."""
    return existing is not None and all(existing[k] == row[k] for k in ("content_hash", "status", "chunk_count",
                                                                         "groups", "path", "title"))


def _copy_document(src: store.Connection, dest: store.Connection, source: Collection, target: Collection,
                   row: Any) -> None:
    groups = json.loads(row["groups"])
    if not groups:
        # Withheld (failed, its permissions unknown): no reader may see its old chunks, so they are
        # not copied (the next ingest of a readable file rebuilds them); the failure record is.
        store.record_failure(dest, target, row["source"], row["path"], None, row["bytes_hash"] or "",
                             row["content_hash"] or "", row["error"] or "failed in the source database")
        return
    chunk_rows = store.chunk_rows(src, int(row["id"]))
    if chunk_rows:
        vectors = store.chunk_vectors(src, source.dimension, [int(c["id"]) for c in chunk_rows])
        windows = store.window_vectors(src, [int(c["id"]) for c in chunk_rows])
        version = store.DocumentVersion(
            source=row["source"], path=row["path"], title=row["title"], groups=groups,
            content_hash=row["content_hash"] or "", bytes_hash=row["bytes_hash"] or "",
            canonical_text=row["canonical_text"] or "", extractor=row["extractor"] or "",
            extractor_version=row["extractor_version"] or "", embedder=target.embedder,
            dimension=target.dimension, pipeline_version=row["pipeline_version"] or "",
        )
        stored = [
            store.StoredChunk(
                Chunk(ordinal=c["ordinal"], section=c["section"], content=c["content"], text=c["text"],
                      char_from=c["char_from"], char_to=c["char_to"], page=c["page"], token_count=c["token_count"],
                      truncated=bool(c["truncated"]), kind=c["kind"]),
                vectors[int(c["id"])], c["fts_heading"], c["fts_body"], windows.get(int(c["id"])),
            )
            for c in chunk_rows
        ]
        store.replace_document(dest, target, version, stored)
    if row["status"] == "failed":  # its last good version stays searchable, as in the source
        store.record_failure(dest, target, row["source"], row["path"], groups, row["bytes_hash"] or "",
                             row["content_hash"] or "", row["error"] or "failed in the source database")


# Chunks of withheld documents are not copied (see _copy_document), so neither side counts them.
COUNTS_SQL = """
SELECT (SELECT count(*) FROM documents WHERE collection_id = :collection),
       (SELECT count(*) FROM chunks k JOIN documents d ON d.id = k.document_id
        WHERE k.collection_id = :collection AND d.groups <> '[]')
"""


def _counts(conn: store.Connection, collection_id: int) -> tuple[int, int]:
    docs, chunks = conn.execute(COUNTS_SQL, {"collection": collection_id}).fetchone()
    return int(docs), int(chunks)


# The identity of every chunk of a collection, without its text (a million chunks' texts would
# take gigabytes of memory for the verification sample).
CHUNK_KEYS_SQL = """
SELECT d.source, k.ordinal, k.id, k.access_key FROM chunks k JOIN documents d ON d.id = k.document_id
WHERE k.collection_id = :collection
"""


def _chunk_keys(conn: store.Connection, collection: Collection) -> dict[tuple[str, int], tuple[int, int]]:
    """(source, ordinal) -> (chunk id, access key) of every chunk of the collection."""
    rows = conn.execute(CHUNK_KEYS_SQL, {"collection": collection.id})
    return {(r[0], int(r[1])): (int(r[2]), int(r[3])) for r in rows}


def _sample_vectors(conn: store.Connection, collection: Collection, keys: Sequence[tuple[str, int]]) -> dict[
        tuple[str, int], str]:
    rows = _chunk_keys(conn, collection)
    by_id = {rows[k][0]: k for k in keys if k in rows}
    vectors = store.chunk_vectors(conn, collection.dimension, list(by_id))
    return {by_id[i]: vector_checksum(v) for i, v in vectors.items()}


def bulk_wanted(dest: store.Connection, dimensions: Sequence[int]) -> bool:
    """Whether to copy into ``dest`` as a bulk load (``rag.pg.bulk_load``): a PostgreSQL database
    holding no chunks yet, or one whose bulk-load indexes an interrupted copy left unbuilt. A
    database already in use keeps its indexes and takes the documents one by one."""
    if not store.is_postgres(dest):
        return False
    from rag import pg

    empty = dest.execute("SELECT NOT EXISTS (SELECT 1 FROM chunks)").fetchone()[0]
    return bool(empty) or bool(pg.missing_bulk_indexes(dest, dimensions))


def copy_collections(
    src: store.Connection, dest: store.Connection, collections: Sequence[str] | None = None, *,
    sample: int = VERIFY_SAMPLE, seed: int = 1337, progress: Callable[[str, int, int], None] | None = None,
    bulk: bool | None = None,
) -> list[CollectionCopy]:
    """Copy ``collections`` (default: all) from ``src`` to ``dest`` and verify the copy.

    ``bulk`` (default: ``bulk_wanted``) loads a PostgreSQL DEST with its search indexes built
    once at the end instead of row by row (``rag.pg.bulk_load``); each document is still one
    transaction.

    Raises NotFoundError for an unknown collection name, IndexMismatchError when DEST holds a
    collection of that name built with another embedding model.
    """
    names = list(collections) if collections else [c.name for c in store.list_collections(src)]
    pairs = [(source, _target_collection(dest, source)) for source in (store.require_collection(src, n) for n in names)]
    dimensions = sorted({target.dimension for _, target in pairs})
    if bulk is None:
        bulk = bulk_wanted(dest, dimensions)
    with ExitStack() as stack:
        if bulk and store.is_postgres(dest):
            from rag import pg

            stack.enter_context(pg.bulk_load(dest, dimensions))
        counts = [_copy_documents(src, dest, source, target, progress) for source, target in pairs]
    return [_verify(src, dest, source, target, copied, skipped, sample, seed)
            for (source, target), (copied, skipped) in zip(pairs, counts, strict=True)]


def _copy_documents(src: store.Connection, dest: store.Connection, source: Collection, target: Collection,
                    progress: Callable[[str, int, int], None] | None) -> tuple[int, int]:
    """Copy one collection's documents; (copied, skipped as already there unchanged)."""
    rows = store.document_rows(src, source.name)
    copied = skipped = 0
    for i, row in enumerate(rows, start=1):
        if _unchanged(row, store.find_document(dest, target.id, row["source"])):
            skipped += 1
        else:
            _copy_document(src, dest, source, target, row)
            copied += 1
        if progress is not None:
            progress(source.name, i, len(rows))
    return copied, skipped


def _verify(src: store.Connection, dest: store.Connection, source: Collection, target: Collection, copied: int,
            skipped: int, sample: int, seed: int) -> CollectionCopy:
    """Counts on both sides and the checksums of a sample of vectors, matched by (source, ordinal)."""
    rows = store.document_rows(src, source.name)
    withheld = store.withheld_access_key(src) if any(r["groups"] == store.WITHHELD_GROUPS for r in rows) else None
    keys = sorted(k for k, (_, access) in _chunk_keys(src, source).items() if access != withheld)
    picked = random.Random(seed).sample(keys, min(sample, len(keys)))
    theirs = _sample_vectors(src, source, picked)
    ours = _sample_vectors(dest, target, picked)
    differing = sorted(f"{s}#{o}" for s, o in picked if theirs.get((s, o)) != ours.get((s, o)))
    src_docs, src_chunks = _counts(src, source.id)
    dest_docs, dest_chunks = _counts(dest, target.id)
    return CollectionCopy(source.name, copied, skipped, (src_docs, dest_docs), (src_chunks, dest_chunks),
                          len(picked), differing)


# ---------------------------------------------------------------------------------------------
# What the desk learnt and said about the collections: fitted decisions, evaluation runs, chats

_RUN_COLUMNS = ("created_at, collection, embedder, strategy, stages, ks, gate_stage, threshold, "
                "recommended_threshold, max_sources, git_commit, golden_name, golden_hash, queries, leaks, "
                "destroyed, settings, summary")
_RESULT_COLUMNS = "query_id, item_id, kind, wording, query, groups, stage, rank, min_distance, destroyed, leak, gate"
_TURN_COLUMNS = "collection, chat_id, question, searched, answer, groups, created_at"


@dataclass(frozen=True, slots=True)
class HistoryCopy:
    decisions_copied: int = 0
    decisions_differing: list[str] = field(default_factory=list)  # collections DEST already fitted otherwise
    runs_copied: int = 0
    runs_skipped: int = 0  # already in DEST (a second run)
    turns_copied: int = 0
    turns_skipped: int = 0
    turns_without_reader: int = 0  # asked by a user DEST does not have (copied with --no-users): not copied

    @property
    def verified(self) -> bool:
        return not self.turns_without_reader

    @property
    def anything(self) -> bool:
        return any((self.decisions_copied, self.decisions_differing, self.runs_copied, self.runs_skipped,
                    self.turns_copied, self.turns_skipped, self.turns_without_reader))


def copy_history(src: store.Connection, dest: store.Connection, collections: Sequence[str]) -> HistoryCopy:
    """Copy the fitted decisions, evaluation runs and chats of ``collections`` to ``dest``; safe to run again.

    Run after ``rag.auth.copy_team``: a chat turn belongs to its reader, found in DEST by name (a
    desktop turn has none). A turn whose reader DEST lacks is not copied (it would become anyone's)
    and is counted. A turn's passages link to DEST's document of the same source (DEST numbers
    documents its own way). Rows get DEST's own ids; a run or a turn DEST already holds (same collection,
    time and content) is skipped, and a decision DEST fitted itself is never overwritten. ONE
    transaction on DEST: an interrupted copy leaves all or none of it.
    """
    decisions, differing = 0, []
    runs = runs_skipped = turns = turns_skipped = orphans = 0
    readers = _reader_ids(src, dest)
    with store.transaction(dest):
        for name in collections:
            # each slot once: "model" and "examined" share one (rag.decide.meta_key)
            for key in dict.fromkeys(decide.meta_key(name, kind) for kind in decide.POLICY_KINDS):
                theirs = store.get_meta(src, key)
                ours = store.get_meta(dest, key)
                if theirs is not None and ours is None:
                    store.set_meta(dest, key, theirs)
                    decisions += 1
                elif theirs is not None and ours != theirs and name not in differing:
                    differing.append(name)
            copied, skipped = _copy_runs(src, dest, name)
            runs, runs_skipped = runs + copied, runs_skipped + skipped
            copied, skipped, missing = _copy_turns(src, dest, name, readers)
            turns, turns_skipped, orphans = turns + copied, turns_skipped + skipped, orphans + missing
    return HistoryCopy(decisions, differing, runs, runs_skipped, turns, turns_skipped, orphans)


def _reader_ids(src: store.Connection, dest: store.Connection) -> dict[int, int | None]:
    """SRC user id -> DEST user id of the same name (as the databases compare names), None when absent."""
    theirs = {int(r["id"]): same_name_key(str(r["name"])) for r in src.execute("SELECT id, name FROM users")}
    ours = {same_name_key(str(r["name"])): int(r["id"]) for r in dest.execute("SELECT id, name FROM users")}
    return {uid: ours.get(name) for uid, name in theirs.items()}


def _copy_runs(src: store.Connection, dest: store.Connection, collection: str) -> tuple[int, int]:
    present = {(r["created_at"], r["golden_hash"], r["summary"]) for r in dest.execute(
        "SELECT created_at, golden_hash, summary FROM eval_runs WHERE collection = ?", (collection,))}
    copied = skipped = 0
    marks = ", ".join("?" * len(_RUN_COLUMNS.split(", ")))
    result_marks = ", ".join("?" * (1 + len(_RESULT_COLUMNS.split(", "))))
    for run in src.execute(f"SELECT id, {_RUN_COLUMNS} FROM eval_runs WHERE collection = ? ORDER BY id",
                           (collection,)).fetchall():
        if (run["created_at"], run["golden_hash"], run["summary"]) in present:
            skipped += 1
            continue
        values = tuple(run[c] for c in _RUN_COLUMNS.split(", "))
        new_id = int(dest.execute(f"INSERT INTO eval_runs ({_RUN_COLUMNS}) VALUES ({marks})", values).lastrowid)
        for row in src.execute(f"SELECT {_RESULT_COLUMNS} FROM eval_results WHERE run_id = ? ORDER BY rowid",
                               (run["id"],)).fetchall():  # insertion order: rag.history reads it
            dest.execute(f"INSERT INTO eval_results (run_id, {_RESULT_COLUMNS}) VALUES ({result_marks})",
                         (new_id, *(row[c] for c in _RESULT_COLUMNS.split(", "))))
        copied += 1
    return copied, skipped


def _turn_key(row: Any) -> tuple[Any, ...]:
    return row["chat_id"], row["created_at"], row["question"], row["answer"]


# Each document's id by its source (not document_rows: no document's text is read).
DOCUMENT_IDS_SQL = """
SELECT d.id, d.source FROM documents d JOIN collections c ON c.id = d.collection_id WHERE c.name = :collection
"""


def _document_ids(src: store.Connection, dest: store.Connection, collection: str) -> dict[int, int]:
    """SRC document id -> DEST id of the same source in ``collection`` (DEST numbers its own)."""
    ours = {r[1]: int(r[0]) for r in dest.execute(DOCUMENT_IDS_SQL, {"collection": collection})}
    return {int(r[0]): ours[r[1]] for r in src.execute(DOCUMENT_IDS_SQL, {"collection": collection}) if r[1] in ours}


def _answer_for(dest_ids: dict[int, int], answer: str) -> str:
    """A stored answer whose passages' ``document_id`` (what its "open the passage" links carry)
    are DEST's ids; a document DEST does not hold gets 0, which opens no document, never another."""
    raw = json.loads(answer)
    for hit in [*raw.get("hits", []), *raw.get("dropped", [])]:
        if isinstance(hit, dict) and "document_id" in hit:
            hit["document_id"] = dest_ids.get(int(hit["document_id"]), 0)
    return json.dumps(raw, ensure_ascii=False)  # as conversation.answer_to_json writes it


def _copy_turns(src: store.Connection, dest: store.Connection, collection: str,
                readers: dict[int, int | None]) -> tuple[int, int, int]:
    present = {_turn_key(r) for r in dest.execute(
        "SELECT chat_id, created_at, question, answer FROM chat_turns WHERE collection = ?", (collection,))}
    dest_ids = _document_ids(src, dest, collection)
    copied = skipped = orphans = 0
    marks = ", ".join("?" * (1 + len(_TURN_COLUMNS.split(", "))))
    for turn in src.execute(f"SELECT user_id, {_TURN_COLUMNS} FROM chat_turns WHERE collection = ? ORDER BY id",
                            (collection,)).fetchall():
        reader = None if turn["user_id"] is None else readers.get(int(turn["user_id"]))
        values = {c: turn[c] for c in _TURN_COLUMNS.split(", ")} | {"answer": _answer_for(dest_ids, turn["answer"])}
        if turn["user_id"] is not None and reader is None:
            orphans += 1
        elif _turn_key(values) in present:  # copied before
            skipped += 1
        elif _turn_key(turn) in present:  # copied by a version that kept SRC's document ids: DEST's now
            dest.execute("UPDATE chat_turns SET answer = ? WHERE collection = ? AND chat_id = ? AND created_at = ? "
                         "AND question = ? AND answer = ?",
                         (values["answer"], collection, turn["chat_id"], turn["created_at"], turn["question"],
                          turn["answer"]))
            skipped += 1
        else:
            dest.execute(f"INSERT INTO chat_turns (user_id, {_TURN_COLUMNS}) VALUES ({marks})",
                         (reader, *values.values()))
            copied += 1
    return copied, skipped, orphans
