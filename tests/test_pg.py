"""The PostgreSQL backend on a real server (tests/conftest.py starts it): schema, row-level
security as the second net, pgvector and BM25 against SQLite, ``rag migrate``, and one writer with
eight reader processes. The shared behaviour (store, ingest, retrieval, permissions, ask) is
tested on both backends by those modules' own tests."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest

from rag import pg, pg_retrieval, retrieval, store, transfer
from rag.cli import main
from rag.config import load_settings
from rag.errors import StorageError
from rag.ingest import ingest
from rag.records import Chunk
from rag.retrieval import search

from .conftest import ROOT
from .fakes import FakeEmbedder
from .pg_workers import PARTS, live_text
from .test_retrieval import CORPUS, FORBIDDEN, write_corpus


@pytest.fixture
def pconn(pg_url: str) -> Any:
    conn = store.open_db(pg_url)
    yield conn
    conn.close()


@pytest.fixture
def indexed(pconn: Any, pg_url: str, tmp_path: Path) -> Any:
    settings = load_settings(db_path=pg_url)
    report = ingest(pconn, [write_corpus(tmp_path / "docs", CORPUS)], settings=settings, embedder=FakeEmbedder())
    assert not report.failed
    return pconn


def _forbidden_ids(conn: Any) -> set[int]:
    rows = conn.execute("SELECT k.id, d.source FROM chunks k JOIN documents d ON d.id = k.document_id")
    ids = {int(r[0]) for r in rows if r[1] in FORBIDDEN}
    assert ids, "the corpus must hold restricted chunks for these tests to mean anything"
    return ids


def _branches(conn: Any, *, app_filter: bool, keys: list[int]) -> set[int]:
    """Every chunk id the dense (exact and HNSW) and sparse branches return for a question that
    matches the restricted documents best."""
    coll = store.require_collection(conn, "default")
    vector = FakeEmbedder().embed_queries(["salary band cap for paid vacation payouts"])[0]
    found: set[int] = set()
    for exact in (True, False):
        found |= {c for c, _ in pg_retrieval.search_vectors(
            conn, vector, collection_id=coll.id, dimension=coll.dimension, access_keys=keys, k=50, exact=exact,
            app_filter=app_filter)}
    for question in ("salary band cap for paid vacation payouts", "191,900 dollars"):  # words; a phrase
        match = retrieval.build_fts_query(question)
        found |= {c for c, _ in pg_retrieval.search_fts(conn, match, collection_id=coll.id, access_keys=keys, k=50,
                                                        app_filter=app_filter)}
    return found


# ---------------------------------------------------------------------------------------------
# Pure parts


def test_translate_turns_sqlite_placeholders_into_psycopg_ones() -> None:
    assert pg.translate("SELECT * FROM t WHERE a = ? AND b = :name") == "SELECT * FROM t WHERE a = %s AND b = %(name)s"
    # literals, casts and % are left alone (a % doubled for psycopg), :: is a cast, not a name
    assert pg.translate("SELECT '%Y :x ?', x::text, 5 % 2 WHERE y = :y") == (
        "SELECT '%%Y :x ?', x::text, 5 %% 2 WHERE y = %(y)s")


def test_tsvector_literal_splits_like_fts5_with_weights_and_length() -> None:
    literal, length = pg.tsvector_literal("guide > vpn", "loi vpn-403: restart vpn")
    assert length == 2 + 5  # vpn-403 is two tokens, as in FTS5's unicode61
    # the body starts at 4: one position left empty so that no phrase spans the two columns
    assert literal == "'guide':1A 'vpn':2A,5B,8B 'loi':4B '403':6B 'restart':7B"


def test_bm25_by_hand() -> None:
    """One document of length 4 (avgdl 4), the term twice in the body (weight 1) and once in the
    heading (weight 3): f = 3 + 2 = 5, idf = ln((10 - 2 + 0.5) / (2 + 0.5)), FTS5's formula."""
    positions = {"fox": {1: "A", 3: "B", 4: "B"}}
    scores = pg_retrieval.bm25_scores({7: (4, positions)}, [["fox"]], [pg_retrieval.bm25_idf(10, 2)],
                                      {"A": 3.0, "B": 1.0}, 4.0)
    idf = math.log(8.5 / 2.5)
    assert scores[7] == pytest.approx(-(idf * 5 * 2.2 / (5 + 1.2)))
    assert pg_retrieval.bm25_idf(10, 9) == pg_retrieval.FTS5_MIN_IDF  # FTS5's floor for common terms


def test_phrase_counts_need_adjacent_positions() -> None:
    positions = {"vpn": {2: "B", 9: "B"}, "403": {3: "B", 20: "B"}}
    assert pg_retrieval.phrase_counts(positions, ["vpn", "403"]) == {"B": 1}
    assert pg_retrieval.tsquery_literal([["vpn", "403"], ["loi"]]) == "('vpn' <-> '403') | ('loi')"


def test_vector_text_round_trip_keeps_float32_bits() -> None:
    vector = np.random.default_rng(3).standard_normal(384).astype(np.float32)
    assert pg.parse_vector(pg.vector_literal(vector)).tobytes() == vector.tobytes()


def test_settings_keep_a_postgres_url_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_DB", "postgresql://desk@db.example:5432/desk")
    assert load_settings().db_path == "postgresql://desk@db.example:5432/desk"
    assert load_settings(db_path="notes.db").db_path == Path("notes.db")


# ---------------------------------------------------------------------------------------------
# Schema and connection


def test_migrations_stamp_the_schema_and_enable_row_level_security(pconn: Any, pg_url: str) -> None:
    names = [m.name for m in pg.all_migrations()]
    assert pg.applied_migrations(pconn) == names
    columns = {r[0] for r in pconn.query(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'documents'")}
    assert {"embedder", "dimension", "pipeline_version", "extractor_version", "status", "content_hash"} <= columns
    secured = {r[0] for r in pconn.query("SELECT relname FROM pg_class WHERE relrowsecurity")}
    assert {"documents", "chunks", "chunk_vectors"} <= secured
    role = pconn.query("SELECT rolsuper, rolbypassrls, rolcanlogin FROM pg_roles WHERE rolname = 'rag_reader'")[0]
    assert tuple(role) == (False, False, False)
    assert store.open_db(pg_url).close() is None  # a second open applies nothing and fails nothing
    assert pg.pending_migrations(pconn) == []


def test_a_server_that_cannot_be_reached_is_one_clear_error(tmp_path: Path) -> None:
    url = f"postgresql://desk:secret@/desk?host={tmp_path}&connect_timeout=2"
    with pytest.raises(StorageError, match="cannot connect to the PostgreSQL database") as caught:
        store.open_db(url)
    assert "secret" not in str(caught.value)


def test_passwords_never_reach_messages() -> None:
    assert pg.redact("postgresql://desk:s3cret@db:5432/desk") == "postgresql://desk:***@db:5432/desk"
    assert pg.redact("postgresql://desk@/desk?host=/run&password=s3cret") == (
        "postgresql://desk@/desk?host=/run&password=***")
    assert store.display_location("postgresql://a:b@h/d") == "postgresql://a:***@h/d"


def test_team_mode_runs_on_postgres_and_a_search_cannot_read_its_tables(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["users", "list", "--db", pg_url]) == 0  # tests/test_auth.py and test_cli_users.py: the rest
    assert "no users" in capsys.readouterr().out
    conn = store.open_db(pg_url)
    try:
        for table in ("users", "sessions", "sign_in_failures", "audit_log"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege), pg.reader(conn, [1]):
                conn.execute(f"SELECT * FROM {table}")  # rag_reader: no privilege on team mode's tables
    finally:
        conn.close()


def test_cli_errors_from_the_server_are_one_line(pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--db", pg_url.replace("/test_", "/missing_")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot connect to the PostgreSQL database") and "Traceback" not in err


# ---------------------------------------------------------------------------------------------
# Row-level security: the second net


def test_rls_alone_returns_no_forbidden_chunk_with_the_application_filter_removed(indexed: Any) -> None:
    forbidden = _forbidden_ids(indexed)
    keys = store.visible_access_keys(indexed, ["all"])
    with pg.reader(indexed, keys):
        found = _branches(indexed, app_filter=False, keys=keys)
        every_row = {int(r[0]) for r in indexed.query("SELECT id FROM chunks")}
        documents = {r[0] for r in indexed.query("SELECT source FROM documents")}
        vectors = {int(r[0]) for r in indexed.query("SELECT chunk_id FROM chunk_vectors")}
        vectors |= {int(r[0]) for r in indexed.query("SELECT chunk_id FROM fts_postings")}
    assert found and not found & forbidden
    assert every_row and not every_row & forbidden and not vectors & forbidden
    assert not documents & set(FORBIDDEN)


def test_the_application_filter_alone_holds_without_rls(indexed: Any) -> None:
    """Outside a reader transaction (the owner: no policy applies) the WHERE clause alone holds."""
    forbidden = _forbidden_ids(indexed)
    found = _branches(indexed, app_filter=True, keys=store.visible_access_keys(indexed, ["all"]))
    assert found and not found & forbidden


def test_without_either_net_the_forbidden_chunks_come_back(indexed: Any) -> None:
    """The two tests above can fail: with neither the filter nor RLS, restricted chunks are found."""
    found = _branches(indexed, app_filter=False, keys=store.visible_access_keys(indexed, ["all"]))
    assert found & _forbidden_ids(indexed)


def test_rls_follows_the_reader_groups(indexed: Any) -> None:
    forbidden = _forbidden_ids(indexed)
    keys = store.visible_access_keys(indexed, ["hr"])
    with pg.reader(indexed, keys):
        assert _branches(indexed, app_filter=False, keys=keys) & forbidden
    with pg.reader(indexed, []):  # no keys set: nothing at all (fail closed)
        assert indexed.query("SELECT count(*) FROM chunks")[0][0] == 0
        assert indexed.query("SELECT count(*) FROM documents")[0][0] == 0


def test_a_reader_transaction_cannot_write(indexed: Any) -> None:
    with pytest.raises(psycopg.Error), pg.reader(indexed, [1]):
        indexed.query("DELETE FROM chunks")
    assert indexed.query("SELECT count(*) FROM chunks")[0][0] > 0


def test_search_runs_as_the_reader(indexed: Any, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """retrieval.search on PostgreSQL runs inside pg.reader: a branch whose WHERE lost its access
    condition still returns nothing forbidden through the whole pipeline."""
    monkeypatch.setattr(pg_retrieval, "dense_sql", lambda dimension, exact, app_filter=True:
                        (pg_retrieval.DENSE_EXACT_SQL if exact else pg_retrieval.DENSE_HNSW_SQL).format(
                            dim=int(dimension), access=""))
    monkeypatch.setattr(pg_retrieval, "fts_sql", lambda app_filter=True: pg_retrieval.FTS_BM25_SQL.format(access=""))
    monkeypatch.setattr(pg_retrieval, "phrase_sql",
                        lambda app_filter=True: pg_retrieval.FTS_MATCHES_SQL.format(access=""))
    settings = load_settings(db_path=pg_url)
    for stage in ("dense", "fts", "hybrid"):
        hits = search(indexed, "salary band cap for paid vacation payouts", embedder=FakeEmbedder(),
                      settings=settings, stage=stage, k=50)
        assert hits and not {h.source for h in hits} & set(FORBIDDEN)


def test_vector_counts_follow_writes_access_changes_and_deletes(indexed: Any) -> None:
    """The counts that choose exact scan or HNSW equal the rows through every kind of change."""

    def counts() -> tuple[dict[int, int], dict[int, int]]:
        kept = {int(r[0]): int(r[1]) for r in indexed.query("SELECT acl, vectors FROM vector_counts") if r[1]}
        real = {int(r[0]): int(r[1]) for r in indexed.query("SELECT acl, count(*) FROM chunk_vectors GROUP BY acl")}
        return kept, real

    kept, real = counts()
    assert kept == real and len(real) == 2
    coll = store.require_collection(indexed, "default")
    doc = store.find_document(indexed, coll.id, "handbook/leave.md")
    store.update_document_groups(indexed, coll, int(doc["id"]), ["finance"])
    kept, real = counts()
    assert kept == real and len(real) == 3
    store.delete_document(indexed, int(store.find_document(indexed, coll.id, "hr/salary.md")["id"]))
    kept, real = counts()
    assert kept == real


# ---------------------------------------------------------------------------------------------
# Dense and sparse against SQLite


def test_hnsw_with_iterative_scan_fills_k_under_a_selective_filter(pconn: Any) -> None:
    """600 vectors near the query are public; a reader who sees only the 6 far ones (1 %) still gets
    all 6 from the HNSW index (pgvector without iterative scans returns what its first ef_search
    candidates hold: here none). The planner would scan 606 rows sequentially, so it is told not to."""
    coll = store.create_collection(pconn, "c", "fake", 16)
    rng = np.random.default_rng(1)
    query = rng.standard_normal(16).astype(np.float32)
    for i in range(606):
        near = i < 600
        vector = query + (0.05 if near else 3.0) * rng.standard_normal(16).astype(np.float32)
        text = f"note {i}"
        version = store.DocumentVersion(f"{i}.md", f"/{i}.md", "", ["all"] if near else ["rare"], str(i), str(i),
                                        text, "text", "1", "fake", 16, "t")
        chunk = Chunk(0, "", text, text, 0, len(text))
        store.replace_document(pconn, coll, version, [store.StoredChunk(chunk, vector / np.linalg.norm(vector),
                                                                        "", text)])
    rare = [store.access_key(pconn, ["rare"])]
    pconn.query("DROP INDEX chunk_vectors_collection_access")  # else the planner filters by access key first
    with pg.reader(pconn, rare):
        pconn.query("SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off")
        exact = pg_retrieval.search_vectors(pconn, query, collection_id=coll.id, dimension=16, access_keys=rare,
                                            k=10, exact=True)
        hnsw = pg_retrieval.search_vectors(pconn, query, collection_id=coll.id, dimension=16, access_keys=rare,
                                           k=10, exact=False)
        plan = "\n".join(r[0] for r in pconn.query(
            "EXPLAIN " + pg_retrieval.dense_sql(16, exact=False),
            {"query": pg.vector_literal(query), "collection": coll.id, "k": 10, "access_keys": rare}))
    assert len(exact) == 6 and [c for c, _ in hnsw] == [c for c, _ in exact]
    assert pg.index_name(16) in plan  # the HNSW index does the work


def test_fts_scores_equal_sqlite_fts5_bm25(pconn: Any, tmp_path: Path) -> None:
    """The same folded texts on both backends: the same order and the same bm25 values."""
    from .test_retrieval import BM25_TEXTS, _bm25_corpus

    lite = store.open_db(tmp_path / "bm25.db")
    embedder = FakeEmbedder()
    _bm25_corpus(lite, BM25_TEXTS, embedder)
    _bm25_corpus(pconn, BM25_TEXTS, embedder)
    for query in ("fox badger", "the river", "cold water fish", "dawn", "otter and badger and fox",
                  "lazy-dog", "river-otter fish", "old oak"):
        match = retrieval.build_fts_query(query)
        a = retrieval.search_fts(lite, match, collection_id=1, access_keys=[1], k=10)
        b = retrieval.search_fts(pconn, match, collection_id=1, access_keys=[1], k=10)
        assert [c for c, _ in a] == [c for c, _ in b], query
        assert [s for _, s in a] == pytest.approx([s for _, s in b], abs=1e-9), query
    lite.close()


def test_both_backends_give_the_same_hits(indexed: Any, pg_url: str, tmp_path: Path) -> None:
    lite = store.open_db(tmp_path / "same.db")
    ingest(lite, [tmp_path / "docs"], settings=load_settings(db_path=tmp_path / "same.db"), embedder=FakeEmbedder())
    for query in ("vacation days", "lỗi VPN-403", "sign commit gpg", "salary cap", "bảo hiểm"):
        for groups in (["all"], ["hr"]):
            for stage in ("dense", "fts", "hybrid"):
                got = [search(conn, query, embedder=FakeEmbedder(), settings=load_settings(db_path=db), stage=stage,
                              groups=groups, k=8) for conn, db in ((lite, tmp_path / "same.db"), (indexed, pg_url))]
                assert [(h.source, h.char_from) for h in got[0]] == [(h.source, h.char_from) for h in got[1]]
                # sqlite-vec sums in float32, pgvector in double: distances agree to ~1e-6
                assert [h.distance for h in got[0]] == pytest.approx([h.distance for h in got[1]], abs=1e-5)
    lite.close()


def test_both_backends_weigh_keywords_alike_after_documents_are_replaced_and_deleted(
    indexed: Any, pg_url: str, tmp_path: Path
) -> None:
    """The keyword IDF (coverage filter, learned order) counted SQLite's chunks as its highest
    chunk id, which a re-ingest or a delete leaves above the count: the same desk then ordered
    hybrid hits otherwise than on PostgreSQL, which counts them."""
    lite_path = tmp_path / "same.db"
    lite = store.open_db(lite_path)
    docs = tmp_path / "docs"
    ingest(lite, [docs], settings=load_settings(db_path=lite_path), embedder=FakeEmbedder())
    (docs / "handbook" / "leave.md").write_text(CORPUS["handbook/leave.md"] + "\n## Carry over\n\nFive days carry "
                                                "over into the next year.\n", encoding="utf-8")
    (docs / "handbook" / "git.md").unlink()
    for conn, db in ((lite, lite_path), (indexed, pg_url)):
        ingest(conn, [docs], settings=load_settings(db_path=db), embedder=FakeEmbedder(), prune=True)
    keywords = retrieval.keywords("paid vacation days sick leave carry over")
    assert retrieval.query_idf(lite, keywords) == pytest.approx(retrieval.query_idf(indexed, keywords), abs=1e-12)
    for conn, db in ((lite, lite_path), (indexed, pg_url)):
        hits = search(conn, "how many vacation days carry over", embedder=FakeEmbedder(),
                      settings=load_settings(db_path=db), stage="hybrid", k=8)
        assert hits
        if conn is lite:
            expected = [(h.source, h.char_from, h.rank_score) for h in hits]
    # sqlite-vec sums in float32, pgvector in double: the similarity feature agrees to ~1e-6
    assert [(h.source, h.char_from, pytest.approx(h.rank_score, abs=1e-5)) for h in hits] == expected
    lite.close()


# ---------------------------------------------------------------------------------------------
# The write path (COPY) and bulk loads


def test_copy_writes_postings_vectors_and_windows_exactly(pconn: Any) -> None:
    """What COPY wrote reads back as written: the float32 bits of every vector and window vector,
    and one posting row per term with its counts in each column and the chunk's length."""
    coll = store.create_collection(pconn, "c", "fake", 8)
    rng = np.random.default_rng(7)
    chunks = []
    for ordinal, (heading, body) in enumerate((("Leave", "vacation days carry over; vacation-403"),
                                               ("Leave › Pay", "pay the days in cash, days"))):
        text = f"{heading}\n\n{body}"
        chunk = Chunk(ordinal, heading, body, text, 0, len(body))
        chunks.append(store.StoredChunk(chunk, rng.standard_normal(8).astype(np.float32), heading.lower(),
                                        body.lower(), rng.standard_normal((3, 8)).astype(np.float32)))
    version = store.DocumentVersion("a.md", "/a.md", "A", ["hr"], "h", "b", "t", "text", "1", "fake", 8, "p")
    document_id = store.replace_document(pconn, coll, version, chunks)
    ids = [int(r["id"]) for r in store.chunk_rows(pconn, document_id)]
    vectors = store.chunk_vectors(pconn, 8, ids)
    windows = store.window_vectors(pconn, ids)
    key = store.access_key(pconn, ["hr"])
    for chunk_id, stored in zip(ids, chunks, strict=True):
        assert vectors[chunk_id].tobytes() == stored.vector.tobytes()
        assert windows[chunk_id].tobytes() == stored.windows.tobytes()  # type: ignore[union-attr]
        rows = pconn.query("SELECT term, tf_heading, tf_body, length, collection_id, acl FROM fts_postings "
                           "WHERE chunk_id = %s", (chunk_id,))
        length = len(pg.fts_tokens(stored.fts_heading)) + len(pg.fts_tokens(stored.fts_body))
        assert {r[0]: (r[1], r[2]) for r in rows} == pg.term_counts(stored.fts_heading, stored.fts_body)
        assert {(r[3], r[4], r[5]) for r in rows} == {(length, coll.id, key)}
    assert {r[0]: r[1] for r in pconn.query("SELECT acl, count(*) FROM window_vectors GROUP BY acl")} == {key: 6}


def _index_definitions(conn: Any, dimension: int) -> dict[str, str]:
    names = pg.bulk_index_names([dimension])
    return {r[0]: r[1] for r in conn.query("SELECT indexname, indexdef FROM pg_indexes WHERE indexname = ANY(%s)",
                                           (names,))}


def test_migrate_into_an_empty_database_is_a_bulk_load_with_the_same_indexes_and_hits(
        pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Into an empty database the copy drops the search indexes and builds them at the end: the
    same definitions as the migrations' (and the HNSW index of ensure_vector_index), and the
    same hits as SQLite on every stage."""
    source_db = tmp_path / "src.db"
    lite = store.open_db(source_db)
    settings = load_settings(db_path=source_db)
    ingest(lite, [write_corpus(tmp_path / "docs", CORPUS)], settings=settings, embedder=FakeEmbedder())
    src = store.require_collection(lite, "default")
    dest = store.open_db(pg_url)
    store.create_collection(dest, src.name, src.embedder, src.dimension, src.strategy, src.metric)
    before = _index_definitions(dest, src.dimension)
    assert len(before) == 3 and transfer.bulk_wanted(dest, [src.dimension])
    dropped: list[list[str]] = []
    original = pg.build_indexes

    def build(conn: Any, dimensions: Any) -> dict[str, float]:
        dropped.append(pg.missing_bulk_indexes(conn, dimensions))
        return original(conn, dimensions)

    monkeypatch.setattr(pg, "build_indexes", build)
    assert transfer.copy_collections(lite, dest)[0].verified
    assert dropped == [list(before)]  # all three were missing during the load
    assert _index_definitions(dest, src.dimension) == before
    assert not transfer.bulk_wanted(dest, [src.dimension])  # it holds chunks now
    for query in ("vacation days", "lỗi VPN-403", "salary cap"):
        for stage in ("dense", "fts", "hybrid"):
            got = [[(h.source, h.char_from) for h in search(conn, query, embedder=FakeEmbedder(), stage=stage,
                                                           settings=load_settings(db_path=db), groups=["hr"], k=8)]
                   for conn, db in ((lite, source_db), (dest, pg_url))]
            assert got[0] == got[1] and got[0], (query, stage)
    lite.close()
    dest.close()


def test_build_memory_grows_with_the_vectors_within_the_server_setting_and_the_cap(
        indexed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    coll = store.require_collection(indexed, "default")
    server_mb = int(indexed.query("SELECT pg_size_bytes(current_setting('maintenance_work_mem'))")[0][0]) >> 20
    assert pg.build_memory_mb(indexed, [coll.dimension]) == server_mb  # a few vectors: the server's own
    indexed.query("UPDATE vector_counts SET vectors = vectors * 1000000")  # as if there were millions
    monkeypatch.setattr(pg, "BULK_MAINTENANCE_WORK_MEM_MAX_MB", server_mb * 3)
    assert pg.build_memory_mb(indexed, [coll.dimension]) == server_mb * 3
    monkeypatch.setattr(pg, "BULK_MAINTENANCE_WORK_MEM_MAX_MB", 10 ** 9)
    vectors = int(indexed.query("SELECT sum(vectors) FROM vector_counts WHERE dimension = %s",
                                (coll.dimension,))[0][0])
    assert pg.build_memory_mb(indexed, [coll.dimension]) == (vectors * (4 * coll.dimension + 1024)) >> 20


def test_bulk_load_builds_its_indexes_after_an_error_and_a_resumed_copy_finishes_them(
        indexed: Any, tmp_path: Path) -> None:
    coll = store.require_collection(indexed, "default")
    before = _index_definitions(indexed, coll.dimension)
    with pytest.raises(RuntimeError), pg.bulk_load(indexed, [coll.dimension]):
        raise RuntimeError("the load failed")
    assert _index_definitions(indexed, coll.dimension) == before
    # a killed bulk load leaves them missing: the next copy into that database builds them
    pg.drop_bulk_indexes(indexed, [coll.dimension])
    assert transfer.bulk_wanted(indexed, [coll.dimension])
    lite = store.open_db(tmp_path / "more.db")
    ingest(lite, [write_corpus(tmp_path / "more", {"notes/extra.md": "# Extra\n\nA note on printers."})],
           settings=load_settings(db_path=tmp_path / "more.db"), embedder=FakeEmbedder())
    assert transfer.copy_collections(lite, indexed)[0].copied == 1
    assert _index_definitions(indexed, coll.dimension) == before
    lite.close()


# ---------------------------------------------------------------------------------------------
# rag migrate


def test_migrate_copies_vectors_resumes_and_round_trips(pg_url: str, tmp_path: Path) -> None:
    source_db = tmp_path / "src.db"
    lite = store.open_db(source_db)
    settings = load_settings(db_path=source_db)
    ingest(lite, [write_corpus(tmp_path / "docs", CORPUS)], settings=settings, embedder=FakeEmbedder())
    coll = store.require_collection(lite, "default")
    doc = store.find_document(lite, coll.id, "handbook/git.md")
    store.record_failure(lite, coll, "handbook/git.md", doc["path"], None, "b", "c", "unreadable permissions")
    dest = store.open_db(pg_url)
    first = transfer.copy_collections(lite, dest)
    assert [r.verified for r in first] == [True] and first[0].copied == len(CORPUS)
    assert first[0].vectors_checked > 0 and first[0].documents == (len(CORPUS), len(CORPUS))
    again = transfer.copy_collections(lite, dest)
    assert again[0].skipped == len(CORPUS) - 1 and again[0].verified  # only the withheld one is re-recorded
    # the withheld document stays withheld, and the copied vectors find the same chunks (dense: the
    # FTS statistics differ, since the withheld document's chunks are not copied)
    for query in ("sign every commit with a gpg key", "vacation days"):
        a = [(h.source, h.char_from) for h in search(lite, query, embedder=FakeEmbedder(), settings=settings, k=8,
                                                     stage="dense")]
        b = [(h.source, h.char_from) for h in search(dest, query, embedder=FakeEmbedder(), stage="dense",
                                                    settings=load_settings(db_path=pg_url), k=8)]
        assert a == b and "handbook/git.md" not in {s for s, _ in b}
    back_db = tmp_path / "back.db"
    back = store.open_db(back_db)
    assert all(r.verified for r in transfer.copy_collections(dest, back))
    vectors = {r["source"]: r for r in store.chunk_rows(back)}
    assert set(vectors) == set(CORPUS) - {"handbook/git.md"}
    for c in (lite, dest, back):
        c.close()


def test_cli_migrate_reports_verified(pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source_db = tmp_path / "src.db"
    lite = store.open_db(source_db)
    ingest(lite, [write_corpus(tmp_path / "docs", CORPUS)], settings=load_settings(db_path=source_db),
           embedder=FakeEmbedder())
    lite.close()
    assert main(["migrate", str(source_db), pg_url]) == 0
    assert "verified" in capsys.readouterr().out
    assert main(["migrate", str(tmp_path / "none.db"), pg_url]) == 1
    assert "no database at" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Concurrency: several processes on one server


def test_one_writer_and_eight_readers_see_whole_documents(pg_url: str, tmp_path: Path) -> None:
    folder = tmp_path / "live"
    folder.mkdir()
    (folder / "live.md").write_text(live_text(0), encoding="utf-8")
    conn = store.open_db(pg_url)
    ingest(conn, [folder], settings=load_settings(db_path=pg_url), embedder=FakeEmbedder())
    conn.close()
    command = [sys.executable, "-m", "tests.pg_workers"]
    readers = [subprocess.Popen([*command, "read", pg_url, "8"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
               for _ in range(8)]
    writer = subprocess.Popen([*command, "write", pg_url, str(folder), "25"], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True)
    try:
        out, _ = writer.communicate(timeout=120)
        results = [json.loads(r.communicate(timeout=120)[0]) for r in readers]
    finally:
        for process in [writer, *readers]:
            if process.poll() is None:
                process.kill()
    assert writer.returncode == 0 and json.loads(out) == {"versions": 25}
    assert all(r.returncode == 0 for r in readers)
    assert all(r["searches"] > 0 for r in results)
    assert sum(r["torn_count"] for r in results) == 0, [r["torn"] for r in results if r["torn"]]
    conn = store.open_db(pg_url)
    final = [r["content"] for r in store.chunk_rows(conn) if r["source"] == "live.md"]
    conn.close()
    assert all("version v25 " in c for c in final) and len(final) >= 1 and PARTS == 5
