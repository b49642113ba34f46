"""Store: migrations, connect fallback, vec0 filters, FTS triggers, atomic document replace."""

from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np
import pytest

from rag import store
from rag.errors import ExtensionLoadError, IndexMismatchError, StorageError
from rag.records import Chunk

from .conftest import SQLITE_ONLY, database_error, migration_named, vector_access_keys


@pytest.fixture
def db_path(backend_db: Path | str) -> Path | str:
    """Every test here runs on SQLite and on PostgreSQL (tests/conftest.py), but the SQLITE_ONLY ones."""
    return backend_db

EXPECTED_COLUMNS = {
    "meta": ["key", "value"],
    "collections": ["id", "name", "embedder", "dimension", "metric", "strategy", "max_distance", "created_at"],
    "access_keys": ["id", "groups"],
    "documents": [
        "id",
        "collection_id",
        "source",
        "path",
        "title",
        "groups",
        "access_key",
        "content_hash",
        "bytes_hash",
        "canonical_text",
        "extractor",
        "extractor_version",
        "status",
        "error",
        "chunk_count",
        "embedder",
        "dimension",
        "pipeline_version",
        "created_at",
        "updated_at",
    ],
    "chunks": [
        "id",
        "document_id",
        "collection_id",
        "access_key",
        "ordinal",
        "section",
        "text",
        "content",
        "char_from",
        "char_to",
        "page",
        "token_count",
        "truncated",
        "kind",
        "fts_heading",
        "fts_body",
    ],
    "window_vectors": ["chunk_id", "ordinal", "embedding"],
}


def columns(conn: store.Connection, table: str) -> list[str]:
    return [r["name"] for r in conn.execute(f"PRAGMA table_info({table})")]


@SQLITE_ONLY  # SQLite's schema, vec0 and FTS5 (PostgreSQL's: tests/test_pg.py)
def test_migrations_on_blank_db_create_exact_columns(db_path: Path) -> None:
    conn = store.connect(db_path)
    applied = store.migrate(conn)
    assert applied[0] == "0001_initial"
    assert applied == [m.name for m in store.all_migrations()]
    for table, expected in EXPECTED_COLUMNS.items():
        assert columns(conn, table) == expected, table
    fts = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'chunks_fts'").fetchone()["sql"]
    assert "content = 'chunks'" in fts and "fts_heading" in fts and "fts_body" in fts
    triggers = {r["name"] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    assert {"chunks_ai", "chunks_ad", "chunks_au"} <= triggers
    # the runner records what it applied and a second run applies nothing
    assert store.migrate(conn) == []
    assert store.applied_migrations(conn) == applied


@SQLITE_ONLY  # SQLite's schema, vec0 and FTS5 (PostgreSQL's: tests/test_pg.py)
def test_migrate_stop_before_leaves_later_migrations_pending(db_path: Path) -> None:
    conn = store.connect(db_path)
    names = [m.name for m in store.all_migrations()]
    if len(names) < 2:
        assert store.migrate(conn, stop_before=names[0]) == []
        assert [m.name for m in store.pending_migrations(conn)] == names
        return
    store.migrate(conn, stop_before=names[1])
    assert store.applied_migrations(conn) == names[:1]
    assert [m.name for m in store.pending_migrations(conn)] == names[1:]


@SQLITE_ONLY  # PostgreSQL's runner checks under its advisory lock (rag.pg.migrate)
def test_a_migration_another_process_applied_while_this_one_waited_is_skipped(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two processes open an older database at once (the app and `rag status` after an upgrade):
    # both list the same pending migrations, one applies them, the other takes the write lock after.
    first, second = store.connect(db_path), store.connect(db_path)
    listed = store.pending_migrations(second)
    assert store.migrate(first) == [m.name for m in listed]
    monkeypatch.setattr(store, "pending_migrations", lambda conn: listed)
    assert store.migrate(second) == []  # was: "table meta already exists"
    assert store.applied_migrations(second) == [m.name for m in store.all_migrations()]
    first.close()
    second.close()


def test_a_database_upgraded_by_a_newer_version_is_refused_and_left_as_it_was(db_path: Path | str) -> None:
    # A user who goes back to this version after a newer one migrated the database: writing to it
    # would skip the newer schema's tables, so it is one clear error before anything is changed.
    conn = store.open_db(db_path)
    coll = store.create_collection(conn, "c", "fake", 8)
    store.replace_document(conn, coll, _version("a.md", "one", ["all"]), _rows("one", [_unit(8, 1)]))
    conn.execute("INSERT INTO _migrations (name) VALUES (?)", ("9999_from_a_newer_version",))
    before = sorted(tuple(r) for r in conn.execute("SELECT name FROM _migrations"))
    conn.close()
    with pytest.raises(StorageError, match=r"newer version of rag-desk .*9999_from_a_newer_version.*nothing was"):
        store.open_db(db_path)
    conn = store.connect(db_path)
    assert sorted(tuple(r) for r in conn.execute("SELECT name FROM _migrations")) == before
    assert conn.execute("SELECT count(*) FROM documents").fetchone()[0] == 1
    conn.close()


@SQLITE_ONLY  # SQLite's schema, vec0 and FTS5 (PostgreSQL's: tests/test_pg.py)
def test_connect_sets_wal_foreign_keys_and_loads_sqlite_vec(conn: store.Connection) -> None:
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("SELECT vec_version()").fetchone()[0].startswith("v")
    assert conn.execute("SELECT sqlite_compileoption_used('ENABLE_FTS5')").fetchone()[0] == 1


def _module(can_load: bool) -> types.ModuleType:
    module = types.ModuleType("fake_sqlite")

    class Connection:
        pass

    if can_load:
        Connection.enable_load_extension = lambda self, flag: None  # type: ignore[attr-defined]
    module.Connection = Connection  # type: ignore[attr-defined]
    return module


def test_choose_sqlite_prefers_standard_module_that_can_load_extensions() -> None:
    standard, fallback = _module(True), _module(True)
    assert store.choose_sqlite([standard, fallback]) is standard


def test_choose_sqlite_falls_back_to_pysqlite3() -> None:
    standard, fallback = _module(False), _module(True)
    assert store.choose_sqlite([standard, fallback]) is fallback
    assert store.choose_sqlite([standard, None, fallback]) is fallback


def test_choose_sqlite_without_any_loader_says_what_to_install() -> None:
    with pytest.raises(ExtensionLoadError, match="pip install pysqlite3-binary"):
        store.choose_sqlite([_module(False), None])


def _chunk(i: int, content: str, start: int) -> Chunk:
    return Chunk(i, "Doc > Part", content, "Doc > Part\n\n" + content, start, start + len(content), None, 5, False)


def _version(source: str, text: str, groups: list[str], dim: int = 8) -> store.DocumentVersion:
    return store.DocumentVersion(
        source=source,
        path=f"/tmp/{source}",
        title="Doc",
        groups=groups,
        content_hash=f"h-{text}",
        bytes_hash="b",
        canonical_text=text,
        extractor="markdown",
        extractor_version="1",
        embedder="fake",
        dimension=dim,
        pipeline_version="p1",
    )


def _rows(text: str, vectors: list[np.ndarray]) -> list[store.StoredChunk]:
    parts = text.split("\n\n")
    out, offset = [], 0
    for i, (part, vector) in enumerate(zip(parts, vectors, strict=False)):
        start = text.index(part, offset)
        offset = start + len(part)
        out.append(store.StoredChunk(_chunk(i, part, start), vector / np.linalg.norm(vector), "doc part", part.lower()))
    return out


def _unit(dim: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(dim).astype(np.float32)


@SQLITE_ONLY  # SQLite's schema, vec0 and FTS5 (PostgreSQL's: tests/test_pg.py)
def test_vec0_group_filter_runs_inside_knn(conn: store.Connection) -> None:
    """A reader who may see few chunks still gets k of them: the filter is not a post-filter."""
    coll = store.create_collection(conn, "c", "fake", 8)
    query = _unit(8, 0)
    # 40 public chunks all very close to the query, 3 hr-only chunks far from it
    for d in range(40):
        text = "alpha\n\nbeta"
        vecs = [query + 0.01 * _unit(8, 100 + d), query + 0.01 * _unit(8, 200 + d)]
        store.replace_document(conn, coll, _version(f"pub{d}.md", text, ["all"]), _rows(text, vecs))
    for d in range(3):
        text = "secret"
        store.replace_document(
            conn, coll, _version(f"hr{d}.md", text, ["hr"]), _rows(text, [-query + 0.01 * _unit(8, d)])
        )
    hr_only = [k for k in store.visible_access_keys(conn, ["hr"]) if k not in store.visible_access_keys(conn, ["x"])]
    assert len(hr_only) == 1
    q = store.serialize_vector(query / np.linalg.norm(query))
    rows = conn.execute(
        "SELECT chunk_id, distance FROM vec_chunks_8 WHERE embedding MATCH ? AND k = 3 "
        "AND collection_id = ? AND acl IN (?)",
        (q, coll.id, hr_only[0]),
    ).fetchall()
    assert len(rows) == 3  # all three far-away hr chunks, although 80 closer public ones exist
    sources = {
        conn.execute(
            "SELECT d.source FROM chunks k JOIN documents d ON d.id = k.document_id WHERE k.id = ?", (r["chunk_id"],)
        ).fetchone()[0]
        for r in rows
    }
    assert sources == {"hr0.md", "hr1.md", "hr2.md"}
    public = store.visible_access_keys(conn, ["all"])
    marks = ",".join("?" * len(public))
    rows = conn.execute(
        f"SELECT chunk_id FROM vec_chunks_8 WHERE embedding MATCH ? AND k = 100 AND collection_id = ? "
        f"AND acl IN ({marks})",
        (q, coll.id, *public),
    ).fetchall()
    assert len(rows) == 80  # every public chunk, no hr chunk


def test_access_keys_visibility_is_group_intersection(conn: store.Connection) -> None:
    public = store.access_key(conn, ["all"])
    hr = store.access_key(conn, ["hr"])
    hr_admin = store.access_key(conn, ["admin", "hr", "hr"])
    assert store.access_key(conn, ["hr", "admin"]) == hr_admin  # normalised set
    assert set(store.visible_access_keys(conn, ["all"])) == {public}
    assert set(store.visible_access_keys(conn, ["hr"])) == {public, hr, hr_admin}
    assert set(store.visible_access_keys(conn, ["admin"])) == {public, hr_admin}
    assert store.normalize_groups([]) == ["all"]


def test_a_group_name_in_nfd_is_the_same_group_as_its_nfc_spelling(conn: store.Connection) -> None:
    import unicodedata

    nfd = unicodedata.normalize("NFD", "nhân-sự")
    assert store.normalize_groups([nfd, "nhân-sự"]) == ["nhân-sự"]
    assert store.access_key(conn, [nfd]) == store.access_key(conn, ["nhân-sự"])
    # a key an older version stored with the name decomposed (an access map written on macOS)
    conn.execute("INSERT INTO access_keys (groups) VALUES (?)", (json.dumps([nfd, "x"]),))
    legacy = conn.execute("SELECT id FROM access_keys WHERE groups = ?", (json.dumps([nfd, "x"]),)).fetchone()[0]
    assert legacy in store.visible_access_keys(conn, ["nhân-sự"])
    assert legacy in store.visible_access_keys(conn, [nfd])


def _fts_ids(conn: store.Connection, term: str) -> set[int]:
    return {r[0] for r in conn.execute("SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH ?", (f'"{term}"',))}


@SQLITE_ONLY  # SQLite's schema, vec0 and FTS5 (PostgreSQL's: tests/test_pg.py)
def test_fts_triggers_stay_in_sync_on_insert_update_delete(conn: store.Connection) -> None:
    coll = store.create_collection(conn, "c", "fake", 8)
    text = "zebra crossing\n\nyellow submarine"
    doc_id = store.replace_document(
        conn, coll, _version("a.md", text, ["all"]), _rows(text, [_unit(8, 1), _unit(8, 2)])
    )
    assert len(_fts_ids(conn, "zebra")) == 1
    (chunk_id,) = _fts_ids(conn, "zebra")
    conn.execute("UPDATE chunks SET fts_body = 'quokka island' WHERE id = ?", (chunk_id,))
    assert _fts_ids(conn, "zebra") == set()
    assert _fts_ids(conn, "quokka") == {chunk_id}
    # replacing the document removes the old FTS rows through the delete trigger
    text2 = "walrus tusk"
    store.replace_document(conn, coll, _version("a.md", text2, ["all"]), _rows(text2, [_unit(8, 3)]))
    assert _fts_ids(conn, "quokka") == set() and _fts_ids(conn, "yellow") == set()
    assert len(_fts_ids(conn, "walrus")) == 1
    store.delete_document(conn, doc_id)
    assert _fts_ids(conn, "walrus") == set()
    assert conn.execute("SELECT count(*) FROM vec_chunks_8").fetchone()[0] == 0
    conn.execute("INSERT INTO chunks_fts(chunks_fts) VALUES('integrity-check')")


def test_replace_document_is_atomic_when_an_exception_hits_midway(conn: store.Connection) -> None:
    coll = store.create_collection(conn, "c", "fake", 8)
    old = "first version\n\nsecond paragraph"
    store.replace_document(conn, coll, _version("a.md", old, ["all"]), _rows(old, [_unit(8, 1), _unit(8, 2)]))
    new = "new one\n\nnew two\n\nnew three"
    rows = _rows(new, [_unit(8, 3), _unit(8, 4), _unit(8, 5)])
    bad = [*rows[:2], store.StoredChunk(rows[2].chunk, np.zeros(3, np.float32), "x", "y")]  # wrong dimension
    with pytest.raises(database_error(conn)):
        store.replace_document(conn, coll, _version("a.md", new, ["all"]), bad)
    doc = conn.execute("SELECT * FROM documents WHERE source = 'a.md'").fetchone()
    assert doc["canonical_text"] == old and doc["status"] == "ok" and doc["chunk_count"] == 2
    assert [r["content"] for r in store.chunk_rows(conn, doc["id"])] == ["first version", "second paragraph"]
    assert vector_access_keys(conn, 8) == [1, 1]
    if not store.is_postgres(conn):
        assert len(_fts_ids(conn, "first")) == 1 and _fts_ids(conn, "new") == set()


def test_chunk_count_is_written_by_the_server(conn: store.Connection) -> None:
    coll = store.create_collection(conn, "c", "fake", 8)
    text = "a\n\nb\n\nc"
    doc_id = store.replace_document(
        conn, coll, _version("a.md", text, ["all"]), _rows(text, [_unit(8, i) for i in range(3)])
    )
    assert store.get_document(conn, doc_id)["chunk_count"] == 3


def test_collection_refuses_another_embedding_model(conn: store.Connection) -> None:
    coll = store.create_collection(conn, "c", "model-a", 8)
    with pytest.raises(IndexMismatchError, match="rag reindex"):
        store.check_embedder(coll, "model-b", 8)
    with pytest.raises(IndexMismatchError):
        store.replace_document(conn, coll, _version("a.md", "x", ["all"]), [])


def test_update_groups_moves_vectors_to_the_new_access_key(conn: store.Connection) -> None:
    coll = store.create_collection(conn, "c", "fake", 8)
    text = "payroll"
    doc_id = store.replace_document(conn, coll, _version("p.md", text, ["all"]), _rows(text, [_unit(8, 1)]))
    store.update_document_groups(conn, coll, doc_id, ["hr"])
    hr = store.access_key(conn, ["hr"])
    assert set(vector_access_keys(conn, 8)) == {hr}
    assert {r[0] for r in conn.execute("SELECT access_key FROM chunks")} == {hr}


# ---------------------------------------------------------------------------------------------
# 0004_chunk_vectors: the plain vector table, its codes and its version counter


def _plain_rows(conn: store.Connection) -> dict[int, tuple[int, int, bytes, bytes]]:
    return {r[0]: (r[1], r[2], r[3], r[4]) for r in conn.execute(
        "SELECT chunk_id, collection_id, acl, embedding, embedding_bit FROM chunk_vectors")}


def _version_of(conn: store.Connection, collection_id: int) -> int:
    row = conn.execute("SELECT version FROM vector_versions WHERE collection_id = ?", (collection_id,)).fetchone()
    return int(row[0]) if row else 0


@SQLITE_ONLY  # SQLite's schema, vec0 and FTS5 (PostgreSQL's: tests/test_pg.py)
def test_sign_bits_match_sqlite_vec_quantize_binary(conn: store.Connection) -> None:
    for seed in range(5):
        vector = _unit(64, seed)
        expected = conn.execute("SELECT vec_quantize_binary(?)", (store.serialize_vector(vector),)).fetchone()[0]
        assert store.sign_bits(vector) == expected == store.sign_bits(store.serialize_vector(vector))
    assert store.sign_bits(np.array([1.0, -1.0, 0.0, 2.0] + [0.0] * 6, dtype=np.float32)) == bytes([0b1001, 0])


@SQLITE_ONLY  # SQLite's schema, vec0 and FTS5 (PostgreSQL's: tests/test_pg.py)
def test_chunk_vectors_mirror_vec0_through_replace_groups_and_delete(conn: store.Connection) -> None:
    coll = store.create_collection(conn, "c", "fake", 8)
    text = "alpha one\n\nbeta two"
    doc_id = store.replace_document(conn, coll, _version("a.md", text, ["all"]),
                                    _rows(text, [_unit(8, 1), _unit(8, 2)]))
    vec0 = {r[0]: (r[1], r[2], r[3])
            for r in conn.execute("SELECT chunk_id, collection_id, acl, embedding FROM vec_chunks_8")}
    plain = _plain_rows(conn)
    assert set(plain) == set(vec0) and len(plain) == 2
    for chunk_id, (collection_id, acl, blob, bits) in plain.items():
        assert (collection_id, acl, blob) == vec0[chunk_id]
        assert bits == store.sign_bits(blob)
    before = _version_of(conn, coll.id)
    store.update_document_groups(conn, coll, doc_id, ["hr"])
    hr = store.access_key(conn, ["hr"])
    assert {acl for _, acl, _, _ in _plain_rows(conn).values()} == {hr}
    assert _version_of(conn, coll.id) > before
    before = _version_of(conn, coll.id)
    store.replace_document(conn, coll, _version("a.md", "gamma", ["all"]), _rows("gamma", [_unit(8, 3)]))
    assert len(_plain_rows(conn)) == 1 and _version_of(conn, coll.id) > before
    store.delete_document(conn, doc_id)
    assert _plain_rows(conn) == {}


@SQLITE_ONLY  # SQLite's schema, vec0 and FTS5 (PostgreSQL's: tests/test_pg.py)
def test_chunk_vectors_go_with_their_chunks_and_collection(conn: store.Connection) -> None:
    coll = store.create_collection(conn, "c", "fake", 8)
    a = store.replace_document(conn, coll, _version("a.md", "x\n\ny", ["all"]),
                               _rows("x\n\ny", [_unit(8, 1), _unit(8, 2)]))
    store.replace_document(conn, coll, _version("b.md", "z", ["all"]), _rows("z", [_unit(8, 4)]))
    conn.execute("DELETE FROM chunks WHERE document_id = ?", (a,))  # the foreign key cascades
    assert len(_plain_rows(conn)) == 1
    with store.transaction(conn):
        store.drop_collection_vectors(conn, coll)
    assert _plain_rows(conn) == {}


@SQLITE_ONLY  # SQLite's schema, vec0 and FTS5 (PostgreSQL's: tests/test_pg.py)
def test_migration_0004_backfills_chunk_vectors_from_vec0(db_path: Path) -> None:
    conn = store.open_db(db_path)
    coll = store.create_collection(conn, "c", "fake", 8)
    text = "one\n\ntwo\n\nthree"
    store.replace_document(conn, coll, _version("a.md", text, ["hr"]), _rows(text, [_unit(8, i) for i in range(3)]))
    expected = _plain_rows(conn)
    # Turn the database back into one made before 0004 (vec0 holds the vectors, nothing else).
    for statement in ("DROP TABLE chunk_vectors", "DROP TABLE vector_versions",
                      "DELETE FROM meta WHERE key = 'vector_index_id'",
                      "DELETE FROM _migrations WHERE name = '0004_chunk_vectors'"):
        conn.execute(statement)
    assert store.migrate(conn) == ["0004_chunk_vectors"]
    assert _plain_rows(conn) == expected
    assert store.get_meta(conn, "vector_index_id")
    conn.close()


# ---------------------------------------------------------------------------------------------
# nfc_sources: document names stored in NFC


def test_migration_nfc_sources_composes_the_names_older_versions_stored_decomposed(db_path: Path) -> None:
    import unicodedata

    nfd = unicodedata.normalize("NFD", "Nghỉ phép.md")
    twin = unicodedata.normalize("NFD", "Ghi chú.md")
    conn = store.open_db(db_path)
    coll = store.create_collection(conn, "c", "fake", 8)
    for source in (nfd, twin, unicodedata.normalize("NFC", twin), "plain.md"):  # Ghi chú.md in both forms
        store.replace_document(conn, coll, _version(source, "text", ["all"]), _rows("text", [_unit(8, 1)]))
    name = migration_named(conn, "_nfc_sources")
    assert store.migrate(conn) == [name]
    sources = {r["source"] for r in store.document_rows(conn)}
    # the twin stays as it was: renaming it would merge two documents (`rag delete` removes one)
    assert sources == {"Nghỉ phép.md", "Ghi chú.md", twin, "plain.md"}
    assert store.find_document(conn, coll.id, "Nghỉ phép.md") is not None
    conn.close()


# ---------------------------------------------------------------------------------------------
# document_id_high_water: ids that chats of earlier versions cite are never given again


@SQLITE_ONLY  # PostgreSQL's identity column never gives an id twice
def test_migration_document_id_high_water_keeps_the_id_an_old_chat_cites_from_a_new_document(db_path: Path) -> None:
    from rag import conversation
    from rag.records import Answer, Citation, Hit

    conn = store.open_db(db_path)
    coll = store.create_collection(conn, "c", "fake", 8)
    for source in ("a.md", "b.md", "c.md"):
        store.replace_document(conn, coll, _version(source, "text", ["all"]), _rows("text", [_unit(8, 1)]))
    cited = max(r["id"] for r in store.document_rows(conn))
    hit = Hit(9, cited, "c.md", "C", "C", "text", 0, 4, None, 0.2)
    answer = Answer("extractive", "q", "“text” [1]", citations=[Citation(1, 9, "C", "c.md", "C", "#char=0,4", 0, 4,
                                                                        None, "text", 0.2)], hits=[hit])
    conversation.save_turn(conn, collection="c", chat_id="old", question="q", searched="q", answer=answer,
                           groups=["all"])
    store.delete_document(conn, cited)
    # The database as a version before the high-water mark left it, upgraded now.
    conn.execute("DELETE FROM meta WHERE key = 'documents:last_id'")
    conn.execute("DELETE FROM _migrations WHERE name LIKE '%_document_id_high_water'")
    store.migrate(conn)
    store.replace_document(conn, coll, _version("new.md", "text", ["all"]), _rows("text", [_unit(8, 2)]))
    added = store.find_document(conn, coll.id, "new.md")["id"]
    assert added > cited  # was == cited: the old answer's link (?document=ID) opened new.md
    conn.close()
