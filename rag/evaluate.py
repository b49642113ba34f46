"""Evaluation: golden sets, per-stage retrieval metrics with intervals, paired tests, the gate
sweep, the chunking-strategy table and the run history kept in the database.

The metrics are pure functions over ranks and counts (``recall_at_k``, ``mrr_at_k``,
``wilson_interval``, ``sign_test``, ``gate_kept``, ``sweep_gate``); ``run_eval`` is the one
function that touches the database and the retriever, and it returns the JSON report documented
in ``docs/eval-json-schema.md``. Relevance follows ``../shared/eval/README.md``: a hit is relevant
when its source is the evidence source and its own ``content`` contains the whole quote, both
under ``relevance_norm`` (NFC, casefold, whitespace collapsed, stripped). Evidence is a quote,
never a chunk id, so a golden set survives any change of chunker.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import binomtest, norm

from rag import retrieval, store
from rag.chunking import destroyed_needles
from rag.config import Settings
from rag.errors import NotFoundError, RagError
from rag.models import Hit
from rag.text import relevance_norm

STAGES: tuple[str, ...] = tuple(retrieval.STAGES)
KINDS = ("answerable", "unanswerable", "forbidden")
DEFAULT_KS = (1, 4, 8, 20)
SWEEP_MODES = ("grid", "quantiles", "both")
GRID = (0.40, 0.80, 0.025)  # start, stop (inclusive), step of the fixed threshold grid
QUANTILE_LEVELS = tuple(round(0.05 * i, 2) for i in range(1, 20))  # 5 %, 10 %, ..., 95 %
STRATEGY_PAIRS = (("E", "A"), ("E", "C"))  # seed 000's paired tests: header vs blind, header vs boundaries
REPORT_VERSION = 1

SearchFn = Callable[..., list[Hit]]


# ---------------------------------------------------------------------------------------------
# Pure metrics


def first_relevant_rank(relevant: Sequence[bool]) -> int | None:
    """1-based rank of the first relevant hit, or None when no hit is relevant."""
    for index, flag in enumerate(relevant):
        if flag:
            return index + 1
    return None


def _check_k(k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be at least 1 (got {k})")


def recall_at_k(ranks: Sequence[int | None], k: int) -> float:
    """Share of queries whose first relevant hit lies at rank <= k.

    Each golden item has one needle (any of its evidence entries counts), so recall@k of one
    query is 1 or 0 and the mean over queries is the hit rate
    ``R@k = |{q : rank_q <= k}| / |Q|`` (Manning, Raghavan & Schütze 2008, *Introduction to
    Information Retrieval*, §8.3). ``None`` means no relevant hit was retrieved. An empty list
    gives 0.0.
    """
    _check_k(k)
    if not ranks:
        return 0.0
    return sum(r is not None and r <= k for r in ranks) / len(ranks)


def mrr_at_k(ranks: Sequence[int | None], k: int) -> float:
    """Mean reciprocal rank cut at k: ``MRR@k = (1/|Q|) * sum_q [rank_q <= k] / rank_q``.

    Voorhees 1999, "The TREC-8 Question Answering Track Report". A query with no relevant hit
    in the first k contributes 0. An empty list gives 0.0.
    """
    _check_k(k)
    if not ranks:
        return 0.0
    return sum(1.0 / r for r in ranks if r is not None and r <= k) / len(ranks)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion.

    With ``p = successes / n`` and ``z`` the ``(1 + confidence) / 2`` quantile of the standard
    normal (1.959964 for 95 %)::

        centre = (p + z²/2n) / (1 + z²/n)
        half   = z / (1 + z²/n) * sqrt(p(1 - p)/n + z²/4n²)

    Wilson 1927, "Probable inference, the law of succession, and statistical inference" (JASA
    22:209); recommended over the Wald interval by Brown, Cai & DasGupta 2001 (Stat. Sci. 16:101).
    ``n = 0`` gives the uninformative (0, 1).
    """
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n (got {successes}/{n})")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1) (got {confidence})")
    if n == 0:
        return 0.0, 1.0
    z = float(norm.ppf((1 + confidence) / 2))
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided sign test on the discordant pairs of a paired comparison.

    Ties (both pass or both fail) carry no information and are dropped; under H0 each of the
    ``n = wins + losses`` discordant pairs is a win with probability 1/2, so
    ``p = min(1, 2 * P[X >= max(wins, losses)])`` with ``X ~ Binomial(n, 1/2)`` (Dixon & Mood
    1946, "The statistical sign test", JASA 41:557), computed by ``scipy.stats.binomtest``.
    No discordant pair gives p = 1.
    """
    if wins < 0 or losses < 0:
        raise ValueError(f"wins and losses must be >= 0 (got {wins}, {losses})")
    if wins + losses == 0:
        return 1.0
    return float(binomtest(wins, wins + losses, 0.5, alternative="two-sided").pvalue)


def paired_counts(ranks_a: Sequence[int | None], ranks_b: Sequence[int | None], k: int) -> tuple[int, int]:
    """(wins, losses) of B over A at R@k on the same queries, in the same order.

    A win is a query B passes (rank <= k) and A fails; a loss the reverse.
    """
    _check_k(k)
    if len(ranks_a) != len(ranks_b):
        raise ValueError(f"paired lists differ in length ({len(ranks_a)} vs {len(ranks_b)})")
    wins = losses = 0
    for a, b in zip(ranks_a, ranks_b, strict=True):
        a_pass = a is not None and a <= k
        b_pass = b is not None and b <= k
        wins += b_pass and not a_pass
        losses += a_pass and not b_pass
    return wins, losses


def flips(
    before: Mapping[str, int | None], after: Mapping[str, int | None], k: int
) -> tuple[list[str], list[str]]:
    """(lost, gained): query ids passing at R@k before and failing after, and the reverse.

    Only ids present in both mappings are compared; each list is sorted.
    """
    _check_k(k)
    lost, gained = [], []
    for key in sorted(before.keys() & after.keys()):
        b, a = before[key], after[key]
        was, now = b is not None and b <= k, a is not None and a <= k
        if was and not now:
            lost.append(key)
        elif now and not was:
            gained.append(key)
    return lost, gained


# ---------------------------------------------------------------------------------------------
# The gate and its sweep


def gate_kept(distances: Sequence[float], max_distance: float, max_sources: int) -> list[int]:
    """Indices of the hits the refusal gate keeps: the first ``max_sources`` hits, in rank order,
    whose cosine distance is strictly below ``max_distance``.

    The same rule as ``rag.gate.apply_gate`` (checked by a test); an empty result is a refusal.
    """
    kept = [i for i, d in enumerate(distances) if d < max_distance]
    return kept[:max_sources]


@dataclass(frozen=True, slots=True)
class GateCase:
    """One query as the gate sees it: its hit distances in rank order and which are relevant."""

    kind: str  # "answerable" | "unanswerable" | "forbidden" (the last two must be refused)
    distances: tuple[float, ...]
    relevant: tuple[bool, ...]


@dataclass(frozen=True, slots=True)
class GatePoint:
    threshold: float
    bluffs_unanswerable: int  # unanswerable queries with at least one kept hit
    bluffs_forbidden: int  # forbidden queries with at least one kept hit
    lost: int  # answerable queries whose kept hits hold no relevant one
    origin: str = "grid"  # "grid" | "quantile" | "current"

    @property
    def bluffs(self) -> int:
        return self.bluffs_unanswerable + self.bluffs_forbidden

    @property
    def errors(self) -> int:
        return self.bluffs + self.lost


def gate_outcome(case: GateCase, max_distance: float, max_sources: int) -> str:
    """"ok", "bluff" (a must-refuse query got through) or "lost" (an answer was turned away)."""
    kept = gate_kept(case.distances, max_distance, max_sources)
    if case.kind == "answerable":
        return "ok" if any(case.relevant[i] for i in kept) else "lost"
    return "bluff" if kept else "ok"


def sweep_gate(
    cases: Sequence[GateCase], thresholds: Sequence[tuple[float, str]] | Sequence[float], max_sources: int
) -> list[GatePoint]:
    """Bluffs and lost answers at each threshold (the refusal trade-off curve of seed 000)."""
    points = []
    for entry in thresholds:
        threshold, origin = entry if isinstance(entry, tuple) else (float(entry), "grid")
        counts = {"unanswerable": 0, "forbidden": 0, "lost": 0}
        for case in cases:
            outcome = gate_outcome(case, threshold, max_sources)
            if outcome == "bluff":
                counts[case.kind] += 1
            elif outcome == "lost":
                counts["lost"] += 1
        points.append(GatePoint(threshold, counts["unanswerable"], counts["forbidden"], counts["lost"], origin))
    return points


def recommend_threshold(curve: Sequence[GatePoint]) -> GatePoint:
    """The point with the fewest errors (bluffs + lost answers).

    Ties go to the point with fewer bluffs (a refusal costs less than a confident wrong answer),
    then to the lower threshold.
    """
    if not curve:
        raise ValueError("the sweep is empty")
    return min(curve, key=lambda p: (p.errors, p.bluffs, p.threshold))


def threshold_grid(start: float = GRID[0], stop: float = GRID[1], step: float = GRID[2]) -> list[float]:
    """The fixed grid start, start + step, ..., stop (inclusive), rounded to 4 decimals."""
    if step <= 0 or stop < start:
        raise ValueError(f"need step > 0 and stop >= start (got {start}, {stop}, {step})")
    count = math.floor((stop - start) / step + 1e-9) + 1
    return [round(start + i * step, 4) for i in range(count)]


def threshold_quantiles(distances: Sequence[float], levels: Sequence[float] = QUANTILE_LEVELS) -> list[float]:
    """Thresholds at quantiles of observed distances (linear interpolation, rounded to 3 decimals).

    Models differ in where their distances fall (multilingual-e5 puts every query under 0.45),
    so a fixed grid can miss the whole decision range; quantiles follow the model.
    """
    if not distances:
        return []
    values = np.quantile(np.asarray(distances, dtype=float), list(levels))
    return sorted({round(float(v), 3) for v in values})


def deciding_distances(cases: Iterable[GateCase], max_sources: int) -> list[float]:
    """Per query, the distance at which its gate outcome changes.

    A must-refuse query bluffs once the threshold passes its closest hit; an answerable one is
    kept once it passes its closest relevant hit among the first ``max_sources`` hits.
    """
    out = []
    for case in cases:
        if case.kind == "answerable":
            relevant = [d for d, r in zip(case.distances[:max_sources], case.relevant, strict=False) if r]
            if relevant:
                out.append(min(relevant))
        elif case.distances:
            out.append(min(case.distances))
    return out


def sweep_thresholds(
    cases: Sequence[GateCase], mode: str = "both", max_sources: int = 4, extra: Iterable[float] = ()
) -> list[tuple[float, str]]:
    """Thresholds to sweep, each with its origin; ``mode`` is "grid", "quantiles" or "both".

    Quantiles are taken over ``deciding_distances``; ``extra`` (the threshold in force) is always
    included so the curve shows where the system stands today.
    """
    if mode not in SWEEP_MODES:
        raise ValueError(f"unknown sweep mode {mode!r}; choose one of {', '.join(SWEEP_MODES)}")
    chosen: dict[float, str] = {}
    if mode in ("grid", "both"):
        chosen.update((t, "grid") for t in threshold_grid())
    if mode in ("quantiles", "both"):
        for t in threshold_quantiles(deciding_distances(cases, max_sources)):
            chosen.setdefault(t, "quantile")
    for t in extra:
        chosen.setdefault(round(float(t), 4), "current")
    return sorted(chosen.items())


# ---------------------------------------------------------------------------------------------
# Golden sets and relevance


@dataclass(frozen=True, slots=True)
class Evidence:
    source: str  # relative to the corpus folder, as stored in documents.source
    quote: str  # the needle: a verbatim sentence of that file


@dataclass(frozen=True, slots=True)
class GoldenItem:
    id: str
    kind: str  # "answerable" | "unanswerable" | "forbidden"
    question: str
    paraphrases: tuple[str, ...]
    groups: tuple[str, ...]  # the asker's groups
    evidence: tuple[Evidence, ...]


@dataclass(frozen=True, slots=True)
class Golden:
    name: str  # file stem, e.g. "golden_handbook"
    sha256: str  # of the file bytes: runs on different versions of a set are not comparable
    items: tuple[GoldenItem, ...]


@dataclass(frozen=True, slots=True)
class Query:
    """One wording of one golden item, asked as one reader."""

    id: str  # "H01/q" for the question, "H01/p1" for the first paraphrase
    item: GoldenItem
    wording: str  # "question" | "paraphrase 1" | ...
    text: str
    groups: tuple[str, ...]
    kind: str  # the item's kind for this asker (a restricted answer asked as "all" is forbidden)


def is_relevant(source: str, content: str, evidence: Sequence[Evidence]) -> bool:
    """The golden-set relevance rule: same source, and the chunk's own content holds a whole quote."""
    if not evidence:
        return False
    text = relevance_norm(content)
    return any(source == e.source and relevance_norm(e.quote) in text for e in evidence)


def _str_list(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RagError(f"{where} must be a list of strings")
    return tuple(value)


def parse_golden(raw: Any, name: str = "golden", sha256: str = "") -> Golden:
    """Validate a golden set in the ``../shared/eval/README.md`` format."""
    if not isinstance(raw, list) or not raw:
        raise RagError(f"golden set {name!r} must be a non-empty JSON list of items")
    items, seen = [], set()
    for index, entry in enumerate(raw):
        where = f"golden set {name!r}, item {index + 1}"
        if not isinstance(entry, dict):
            raise RagError(f"{where} is not an object")
        missing = [f for f in ("id", "kind", "question") if not isinstance(entry.get(f), str) or not entry[f]]
        if missing:
            raise RagError(f"{where} lacks {', '.join(missing)}")
        item_id = entry["id"]
        if item_id in seen:
            raise RagError(f"{where}: duplicate id {item_id!r}")
        seen.add(item_id)
        if entry["kind"] not in KINDS:
            raise RagError(f"{where} ({item_id}): kind must be one of {', '.join(KINDS)}")
        evidence = []
        for e in entry.get("evidence") or []:
            if not isinstance(e, dict) or not isinstance(e.get("source"), str) or not isinstance(e.get("quote"), str):
                raise RagError(f"{where} ({item_id}): evidence entries need a source and a quote")
            evidence.append(Evidence(e["source"], e["quote"]))
        if entry["kind"] == "answerable" and not evidence:
            raise RagError(f"{where} ({item_id}): an answerable item needs evidence")
        items.append(
            GoldenItem(
                id=item_id,
                kind=entry["kind"],
                question=entry["question"],
                paraphrases=_str_list(entry.get("paraphrases", []), f"{where} ({item_id}) paraphrases"),
                groups=tuple(store.normalize_groups(_str_list(entry.get("groups", ["all"]), f"{where} groups"))),
                evidence=tuple(evidence),
            )
        )
    return Golden(name, sha256, tuple(items))


def load_golden(path: str | Path) -> Golden:
    path = Path(path)
    try:
        data = path.read_bytes()
        raw = json.loads(data.decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RagError(f"cannot read the golden set {path}: {e}") from e
    return parse_golden(raw, path.stem, hashlib.sha256(data).hexdigest())


def expand_queries(items: Sequence[GoldenItem], groups_as_golden: bool = True) -> list[Query]:
    """Every question and every paraphrase as a query.

    With ``groups_as_golden`` each query is asked as its item's groups. Without it every query is
    asked as a public reader (``["all"]``), and an answerable item whose evidence needs other
    groups becomes "forbidden" for that reader: it must be refused and must not leak.
    """
    queries: list[Query] = []
    for item in items:
        groups = item.groups if groups_as_golden else (store.PUBLIC_GROUP,)
        kind = item.kind
        if not groups_as_golden and kind == "answerable" and item.groups != (store.PUBLIC_GROUP,):
            kind = "forbidden"
        wordings = [("q", "question", item.question)] + [
            (f"p{i}", f"paraphrase {i}", text) for i, text in enumerate(item.paraphrases, start=1)
        ]
        queries.extend(Query(f"{item.id}/{tag}", item, label, text, groups, kind) for tag, label, text in wordings)
    return queries


# ---------------------------------------------------------------------------------------------
# Running an evaluation


class QueryCache:
    """An embedder that embeds each distinct query text once.

    An eval run asks every query in several stages (and the strategy table in seven databases);
    the query vector does not change, so it is computed once. Passages go straight through.
    """

    def __init__(self, embedder: Any) -> None:
        self.inner = embedder
        self.model_id: str = embedder.model_id
        self.dimension: int = embedder.dimension
        self.max_tokens: int = embedder.max_tokens
        self._vectors: dict[str, np.ndarray] = {}

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self.inner.embed_passages(texts))

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        missing = list(dict.fromkeys(t for t in texts if t not in self._vectors))
        if missing:
            self._vectors.update(zip(missing, np.asarray(self.inner.embed_queries(missing)), strict=True))
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return np.stack([self._vectors[t] for t in texts])

    def count_tokens(self, text: str) -> int:
        return int(self.inner.count_tokens(text))


def default_search() -> SearchFn:
    """``rag.retrieval.search``; a function, so tests and callers can substitute a retriever."""
    return retrieval.search


def default_stages(settings: Settings) -> tuple[str, ...]:
    """dense, fts and hybrid, plus rerank when a reranker is configured."""
    return STAGES if settings.rerank != "none" else STAGES[:3]


def parse_stages(raw: str | Sequence[str]) -> tuple[str, ...]:
    names = [s.strip() for s in (raw.split(",") if isinstance(raw, str) else raw) if s.strip()]
    unknown = [s for s in names if s not in STAGES]
    if unknown or not names:
        raise RagError(f"unknown stage(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(STAGES)}")
    return tuple(dict.fromkeys(names))


def parse_ks(raw: str | Sequence[int]) -> tuple[int, ...]:
    try:
        ks = [int(k) for k in (raw.split(",") if isinstance(raw, str) else raw) if str(k).strip()]
    except ValueError as e:
        raise RagError(f"k must be a comma-separated list of integers (got {raw!r})") from e
    if not ks or min(ks) < 1:
        raise RagError(f"k must be a list of integers >= 1 (got {raw!r})")
    return tuple(sorted(set(ks)))


def choose_gate_stage(stages: Sequence[str], settings: Settings) -> str:
    """The stage that feeds the answer: rerank when enabled, else hybrid, else the last one run."""
    if "rerank" in stages and settings.rerank != "none":
        return "rerank"
    return "hybrid" if "hybrid" in stages else stages[-1]


def current_commit(repo: str | Path | None = None) -> str | None:
    """``git rev-parse HEAD`` of the source tree, or None outside a git checkout."""
    where = Path(repo) if repo else Path(__file__).resolve().parent.parent
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


@dataclass(frozen=True, slots=True)
class StageRun:
    """One query in one stage."""

    rank: int | None  # first relevant hit, 1-based, within the retrieved depth
    distances: tuple[float, ...]
    relevant: tuple[bool, ...]
    leaks: tuple[dict[str, Any], ...]


def _settings_json(settings: Settings) -> dict[str, Any]:
    """The settings a run measured; the database path is where, not what, so it is left out."""
    return {f.name: (str(v) if isinstance(v := getattr(settings, f.name), Path) else v)
            for f in dataclasses.fields(settings) if f.name != "db_path"}


def _r(value: float, digits: int = 4) -> float:
    return round(float(value), digits)


def _p(value: float) -> float:
    """A p-value to 3 significant figures (rounding to decimals would print 2.6e-08 as 0)."""
    return float(f"{float(value):.3g}")


def run_eval(
    conn: store.Connection,
    golden: Golden,
    *,
    embedder: Any,
    settings: Settings,
    collection: str | None = None,
    stages: Sequence[str] | None = None,
    ks: Sequence[int] = DEFAULT_KS,
    search_fn: SearchFn | None = None,
    reranker: Any = None,
    groups_as_golden: bool = True,
    sweep: str = "both",
    commit: str | None = None,
) -> dict[str, Any]:
    """Run every query of ``golden`` through each stage and build the report.

    Args:
        embedder: the collection's embedding model (wrapped in a ``QueryCache``).
        stages: retrieval stages to measure; default ``default_stages(settings)``.
        ks: cut-offs for recall@k and MRR@k; hits are fetched to ``max(ks)`` (at least
            ``settings.max_sources``) and leaks are counted over that depth.
        search_fn: ``rag.retrieval.search`` or a stand-in with its signature.
        reranker: passed to the search of the "rerank" stage.
        groups_as_golden: ask each query as its item's groups (see ``expand_queries``).
        sweep: gate-sweep thresholds, "grid" (0.40-0.80 by 0.025), "quantiles" of observed
            distances, or "both".
        commit: git commit recorded with the run.

    Returns:
        The report as JSON-ready data (``docs/eval-json-schema.md``).

    Raises:
        RagError: unknown stage or collection, bad k list, retriever not available.
    """
    stages = parse_stages(stages) if stages is not None else default_stages(settings)
    ks = parse_ks(ks)
    if sweep not in SWEEP_MODES:
        raise RagError(f"unknown sweep mode {sweep!r}; choose one of {', '.join(SWEEP_MODES)}")
    search = search_fn or default_search()
    coll = store.require_collection(conn, collection or settings.collection)
    if "rerank" in stages and reranker is None and search_fn is None:
        from rag.rerank import load_reranker

        reranker = load_reranker(settings)  # once, not once per query
    cached = embedder if isinstance(embedder, QueryCache) else QueryCache(embedder)
    depth = max(max(ks), settings.max_sources)
    threshold = coll.max_distance if coll.max_distance is not None else settings.max_distance
    gate_stage = choose_gate_stage(stages, settings)
    queries = expand_queries(golden.items, groups_as_golden)

    # Which needles survived chunking, and who may read each document.
    contents: dict[str, list[str]] = {}
    for row in store.chunk_rows(conn, collection=coll.name):
        contents.setdefault(row["source"], []).append(row["content"])
    doc_groups = {row["source"]: set(json.loads(row["groups"])) for row in store.document_rows(conn, coll.name)}
    needles = [(e.source, e.quote) for item in golden.items for e in item.evidence]
    lost_needles = set(destroyed_needles(contents, needles))
    destroyed_items = {
        item.id for item in golden.items
        if item.kind == "answerable" and all((e.source, e.quote) in lost_needles for e in item.evidence)
    }

    runs: dict[tuple[str, str], StageRun] = {}
    for query in queries:
        reader = set(query.groups) | {store.PUBLIC_GROUP}
        for stage in stages:
            hits = search(
                conn, query.text, embedder=cached, settings=settings, groups=list(query.groups),
                collection=coll.name, stage=stage, k=depth, reranker=reranker if stage == "rerank" else None,
            )[:depth]
            relevant = tuple(is_relevant(h.source, h.content, query.item.evidence) for h in hits)
            leaks = []
            for rank, (hit, rel) in enumerate(zip(hits, relevant, strict=True), start=1):
                if query.kind == "forbidden" and rel:
                    reason = "forbidden evidence"
                elif hit.source in doc_groups and not doc_groups[hit.source] & reader:
                    reason = "unreadable document"
                else:
                    continue
                leaks.append({"query": query.id, "item": query.item.id, "stage": stage, "rank": rank,
                              "source": hit.source, "chunk_id": hit.chunk_id, "reason": reason})
            first = first_relevant_rank(relevant) if query.kind == "answerable" else None
            runs[(query.id, stage)] = StageRun(first, tuple(float(h.distance) for h in hits), relevant, tuple(leaks))

    answerable = [q for q in queries if q.kind == "answerable"]
    stage_metrics: dict[str, Any] = {}
    all_leaks = [leak for run in runs.values() for leak in run.leaks]
    for stage in stages:
        ranks = [runs[(q.id, stage)].rank for q in answerable]
        block: dict[str, Any] = {"n": len(ranks)}
        for k in ks:
            hits_k = sum(r is not None and r <= k for r in ranks)
            low, high = wilson_interval(hits_k, len(ranks))
            block[f"recall@{k}"] = {"value": _r(recall_at_k(ranks, k)), "ci": [_r(low), _r(high)], "hits": hits_k}
        for k in ks:
            block[f"mrr@{k}"] = _r(mrr_at_k(ranks, k))
        destroyed_queries = sum(q.item.id in destroyed_items for q in answerable)
        block["ceiling"] = _r(1 - destroyed_queries / len(answerable)) if answerable else 0.0
        block["leaks"] = sum(leak["stage"] == stage for leak in all_leaks)
        stage_metrics[stage] = block

    cases = {
        q.id: GateCase(q.kind, runs[(q.id, gate_stage)].distances, runs[(q.id, gate_stage)].relevant) for q in queries
    }
    thresholds = sweep_thresholds(list(cases.values()), sweep, settings.max_sources, extra=[threshold])
    curve = sweep_gate(list(cases.values()), thresholds, settings.max_sources)
    best = recommend_threshold(curve)
    current = next(p for p in curve if p.threshold == round(float(threshold), 4))

    per_query = []
    for q in queries:
        per_query.append({
            "id": q.id,
            "item": q.item.id,
            "kind": q.kind,
            "wording": q.wording,
            "query": q.text,
            "groups": list(q.groups),
            "destroyed": q.kind == "answerable" and q.item.id in destroyed_items,
            "ranks": {s: runs[(q.id, s)].rank for s in stages},
            "min_distance": {s: _r(min(runs[(q.id, s)].distances)) if runs[(q.id, s)].distances else None
                             for s in stages},
            "leaks": [s for s in stages if runs[(q.id, s)].leaks],
            "gate": gate_outcome(cases[q.id], threshold, settings.max_sources),
        })

    kinds = [q.kind for q in queries]
    return {
        "version": REPORT_VERSION,
        "config": {
            "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
            "collection": coll.name,
            "embedder": coll.embedder,
            "strategy": coll.strategy,
            "stages": list(stages),
            "ks": list(ks),
            "depth": depth,
            "groups_as_golden": groups_as_golden,
            "golden": {"name": golden.name, "sha256": golden.sha256, "items": len(golden.items)},
            "git_commit": commit,
            "settings": _settings_json(settings),
        },
        "queries": {
            "total": len(queries),
            "items": len(golden.items),
            **{kind: kinds.count(kind) for kind in KINDS},
        },
        "stages": stage_metrics,
        "destroyed": {
            "items": sorted(destroyed_items),
            "queries": sum(q.item.id in destroyed_items for q in answerable),
            "needles": [{"source": s, "quote": quote} for s, quote in sorted(lost_needles)],
        },
        "leaks": {
            "total": len(all_leaks),
            "by_stage": {s: stage_metrics[s]["leaks"] for s in stages},
            "list": all_leaks,
        },
        "gate": {
            "stage": gate_stage,
            "max_sources": settings.max_sources,
            "rule": "kept = the first max_sources hits in rank order with distance < threshold",
            "sweep": sweep,
            "answerable": kinds.count("answerable"),
            "must_refuse": kinds.count("unanswerable") + kinds.count("forbidden"),
            "current": _point_json(current),
            "recommended": _point_json(best),
            "tie_break": "fewest bluffs + lost; then fewest bluffs; then the lower threshold",
            "curve": [_point_json(p) for p in curve],
        },
        "per_query": per_query,
    }


def _point_json(point: GatePoint) -> dict[str, Any]:
    return {
        "threshold": point.threshold,
        "origin": point.origin,
        "bluffs": point.bluffs,
        "bluffs_unanswerable": point.bluffs_unanswerable,
        "bluffs_forbidden": point.bluffs_forbidden,
        "lost": point.lost,
        "errors": point.errors,
    }


# ---------------------------------------------------------------------------------------------
# Comparing runs


def stage_ranks(report: Mapping[str, Any], stage: str) -> dict[str, int | None]:
    """Query id -> first relevant rank in ``stage``, for the answerable queries of a report."""
    if stage not in report["stages"]:
        raise RagError(f"stage {stage!r} is not in this run (it has {', '.join(report['stages'])})")
    return {q["id"]: q["ranks"][stage] for q in report["per_query"] if q["kind"] == "answerable"}


def compare_reports(
    a: Mapping[str, Any], b: Mapping[str, Any], *, stage_a: str, stage_b: str | None = None,
    ks: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Paired comparison of B against A at each R@k: wins, losses and the sign test.

    ``a`` and ``b`` may be the same report with two stages. Queries are matched by id; only the
    answerable queries present in both count.
    """
    stage_b = stage_b or stage_a
    ranks_a, ranks_b = stage_ranks(a, stage_a), stage_ranks(b, stage_b)
    common = sorted(ranks_a.keys() & ranks_b.keys())
    if not common:
        raise RagError("the two runs share no answerable query: were they run on the same golden set?")
    ks = parse_ks(ks) if ks is not None else tuple(sorted(set(a["config"]["ks"]) & set(b["config"]["ks"])))
    rows = []
    for k in ks:
        wins, losses = paired_counts([ranks_a[q] for q in common], [ranks_b[q] for q in common], k)
        rows.append({
            "k": k,
            "a": _r(recall_at_k([ranks_a[q] for q in common], k)),
            "b": _r(recall_at_k([ranks_b[q] for q in common], k)),
            "wins": wins,
            "losses": losses,
            "p": _p(sign_test(wins, losses)),
        })
    return {
        "a": stage_a, "b": stage_b, "queries": len(common),
        "only_a": len(ranks_a.keys() - ranks_b.keys()), "only_b": len(ranks_b.keys() - ranks_a.keys()),
        "rows": rows,
    }


def regressions(baseline: Mapping[str, Any], current: Mapping[str, Any], k: int = 8) -> dict[str, list[str]]:
    """Per stage present in both runs, the queries passing at R@k in the baseline that now fail."""
    out = {}
    for stage in baseline["stages"]:
        if stage in current["stages"]:
            lost, _ = flips(stage_ranks(baseline, stage), stage_ranks(current, stage), k)
            out[stage] = lost
    return out


# ---------------------------------------------------------------------------------------------
# The chunking-strategy table (seed 000)


def chunk_stats(conn: store.Connection, collection: str) -> dict[str, int]:
    """Chunks, embedded tokens (header included) and truncated chunks of a collection."""
    rows = store.chunk_rows(conn, collection=collection)
    return {
        "chunks": len(rows),
        "embedded_tokens": sum(int(r["token_count"]) for r in rows),
        "truncated": sum(int(r["truncated"]) for r in rows),
    }


def run_strategies(
    corpus: str | Path,
    golden: Golden,
    *,
    settings: Settings,
    embedder: Any,
    acl: Any = None,
    strategies: Sequence[str] | None = None,
    stage: str = "dense",
    ks: Sequence[int] = DEFAULT_KS,
    search_fn: SearchFn | None = None,
    workdir: str | Path | None = None,
    on_strategy: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Ingest ``corpus`` once per chunking strategy into temporary databases and evaluate each.

    One embedder serves every strategy (queries are embedded once for all of them). Returns the
    rows of seed 000's table and the paired sign tests of ``STRATEGY_PAIRS``.
    """
    from rag import chunking
    from rag.ingest import ingest

    strategies = tuple(strategies or chunking.STRATEGIES)
    unknown = [s for s in strategies if s not in chunking.STRATEGIES]
    if unknown:
        raise RagError(f"unknown strategy {', '.join(unknown)}; choose from {', '.join(chunking.STRATEGIES)}")
    stage = parse_stages([stage])[0]
    ks = parse_ks(ks)
    search = search_fn or default_search()
    cached = embedder if isinstance(embedder, QueryCache) else QueryCache(embedder)
    rows, ranks = [], {}
    with tempfile.TemporaryDirectory(prefix="rag-strategies-", dir=workdir) as tmp:
        for strategy in strategies:
            if on_strategy:
                on_strategy(strategy)
            db = Path(tmp) / f"strategy_{strategy}.db"
            local = settings.replace(db_path=db)
            conn = store.open_db(db)
            try:
                ingest(conn, [corpus], settings=local, embedder=cached, collection=local.collection,
                       strategy=strategy, acl=acl)
                report = run_eval(conn, golden, embedder=cached, settings=local, stages=[stage], ks=ks,
                                  search_fn=search, sweep="grid")
                stats = chunk_stats(conn, local.collection)
            finally:
                conn.close()
            block = report["stages"][stage]
            rows.append({
                "strategy": strategy,
                **{f"recall@{k}": block[f"recall@{k}"] for k in ks},
                "mrr": block[f"mrr@{max(ks)}"],
                "destroyed": len(report["destroyed"]["items"]),
                **stats,
                "leaks": report["leaks"]["total"],
            })
            ranks[strategy] = stage_ranks(report, stage)
    tests = []
    for first, second in STRATEGY_PAIRS:
        if first in ranks and second in ranks:
            common = sorted(ranks[first].keys() & ranks[second].keys())
            for k in ks:
                wins, losses = paired_counts([ranks[second][q] for q in common], [ranks[first][q] for q in common], k)
                tests.append({"a": first, "b": second, "k": k, "wins": wins, "losses": losses,
                              "p": _p(sign_test(wins, losses))})
    return {"stage": stage, "ks": list(ks), "golden": golden.name, "rows": rows, "sign_tests": tests, "ranks": ranks}


# ---------------------------------------------------------------------------------------------
# History in the database (db/migrations/0002_eval_runs.sql)

INSERT_RUN = """
INSERT INTO eval_runs (created_at, collection, embedder, strategy, stages, ks, gate_stage, threshold,
    recommended_threshold, max_sources, git_commit, golden_name, golden_hash, queries, leaks, destroyed,
    settings, summary)
VALUES (:created_at, :collection, :embedder, :strategy, :stages, :ks, :gate_stage, :threshold,
    :recommended_threshold, :max_sources, :git_commit, :golden_name, :golden_hash, :queries, :leaks, :destroyed,
    :settings, :summary)
"""

INSERT_RESULT = """
INSERT INTO eval_results (run_id, query_id, item_id, kind, wording, query, groups, stage, rank, min_distance,
    destroyed, leak, gate)
VALUES (:run_id, :query_id, :item_id, :kind, :wording, :query, :groups, :stage, :rank, :min_distance,
    :destroyed, :leak, :gate)
"""

PREVIOUS_RUN = """
SELECT id FROM eval_runs
WHERE golden_name = :golden_name AND collection = :collection AND id < :id
ORDER BY id DESC LIMIT 1
"""


def save_run(conn: store.Connection, report: Mapping[str, Any]) -> int:
    """Store a report (its summary and one row per query and stage) in one transaction."""
    config, gate = report["config"], report["gate"]
    summary = {key: value for key, value in report.items() if key != "per_query"}
    params = {
        "created_at": config["timestamp"],
        "collection": config["collection"],
        "embedder": config["embedder"],
        "strategy": config["strategy"],
        "stages": json.dumps(config["stages"]),
        "ks": json.dumps(config["ks"]),
        "gate_stage": gate["stage"],
        "threshold": gate["current"]["threshold"],
        "recommended_threshold": gate["recommended"]["threshold"],
        "max_sources": gate["max_sources"],
        "git_commit": config["git_commit"],
        "golden_name": config["golden"]["name"],
        "golden_hash": config["golden"]["sha256"],
        "queries": report["queries"]["total"],
        "leaks": report["leaks"]["total"],
        "destroyed": report["destroyed"]["queries"],
        "settings": json.dumps(config["settings"], ensure_ascii=False),
        "summary": json.dumps(summary, ensure_ascii=False),
    }
    with store.transaction(conn):
        run_id = int(conn.execute(INSERT_RUN, params).lastrowid)
        for q in report["per_query"]:
            for stage in config["stages"]:
                conn.execute(INSERT_RESULT, {
                    "run_id": run_id, "query_id": q["id"], "item_id": q["item"], "kind": q["kind"],
                    "wording": q["wording"], "query": q["query"], "groups": json.dumps(q["groups"]),
                    "stage": stage, "rank": q["ranks"][stage], "min_distance": q["min_distance"][stage],
                    "destroyed": int(q["destroyed"]), "leak": int(stage in q["leaks"]),
                    "gate": q["gate"] if stage == gate["stage"] else None,
                })
    return run_id


def list_runs(
    conn: store.Connection, golden_name: str | None = None, collection: str | None = None, limit: int = 50
) -> list[dict[str, Any]]:
    """Recent runs, newest first, without their per-query rows."""
    where: list[str] = []
    params: dict[str, Any] = {"limit": limit}
    if golden_name:
        where.append("golden_name = :golden_name")
        params["golden_name"] = golden_name
    if collection:
        where.append("collection = :collection")
        params["collection"] = collection
    sql = (
        "SELECT id, created_at, collection, embedder, strategy, stages, ks, gate_stage, threshold, "
        "recommended_threshold, max_sources, git_commit, golden_name, golden_hash, queries, leaks, destroyed, summary "
        "FROM eval_runs" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id DESC LIMIT :limit"
    )
    out = []
    for row in conn.execute(sql, params):
        entry = {key: row[key] for key in row.keys() if key != "summary"}  # noqa: SIM118 (sqlite3.Row)
        entry["stages"], entry["ks"] = json.loads(row["stages"]), json.loads(row["ks"])
        entry["metrics"] = json.loads(row["summary"])["stages"]
        out.append(entry)
    return out


def load_report(conn: store.Connection, run_id: int) -> dict[str, Any]:
    """A stored run as the same JSON shape ``run_eval`` returned."""
    row = conn.execute("SELECT summary FROM eval_runs WHERE id = ?", (run_id,)).fetchone()
    if row is None:
        raise NotFoundError(f"no evaluation run {run_id} in this database")
    report = json.loads(row["summary"])
    report["config"]["run_id"] = run_id
    per_query: dict[str, dict[str, Any]] = {}
    for r in conn.execute("SELECT * FROM eval_results WHERE run_id = ? ORDER BY rowid", (run_id,)):
        q = per_query.setdefault(r["query_id"], {
            "id": r["query_id"], "item": r["item_id"], "kind": r["kind"], "wording": r["wording"],
            "query": r["query"], "groups": json.loads(r["groups"]), "destroyed": bool(r["destroyed"]),
            "ranks": {}, "min_distance": {}, "leaks": [], "gate": None,
        })
        q["ranks"][r["stage"]] = r["rank"]
        q["min_distance"][r["stage"]] = r["min_distance"]
        if r["leak"]:
            q["leaks"].append(r["stage"])
        if r["gate"] is not None:
            q["gate"] = r["gate"]
    report["per_query"] = list(per_query.values())
    return report


def previous_run(conn: store.Connection, run_id: int) -> int | None:
    """The run before ``run_id`` on the same golden set and collection."""
    row = conn.execute("SELECT golden_name, collection FROM eval_runs WHERE id = ?", (run_id,)).fetchone()
    if row is None:
        raise NotFoundError(f"no evaluation run {run_id} in this database")
    found = conn.execute(
        PREVIOUS_RUN, {"golden_name": row["golden_name"], "collection": row["collection"], "id": run_id}
    ).fetchone()
    return None if found is None else int(found["id"])


def run_flips(
    conn: store.Connection, run_id: int, k: int = 8, previous: int | None = None
) -> list[dict[str, Any]]:
    """Queries whose R@k outcome changed since the previous run (or ``previous``), per stage."""
    before_id = previous if previous is not None else previous_run(conn, run_id)
    if before_id is None:
        return []
    before, after = load_report(conn, before_id), load_report(conn, run_id)
    out: list[dict[str, Any]] = []
    for stage in after["stages"]:
        if stage not in before["stages"]:
            continue
        old, new = stage_ranks(before, stage), stage_ranks(after, stage)
        lost, gained = flips(old, new, k)
        out.extend({"query": q, "stage": stage, "change": "lost", "before": old[q], "after": new[q]} for q in lost)
        out.extend({"query": q, "stage": stage, "change": "gained", "before": old[q], "after": new[q]}
                   for q in gained)
    return out


# ---------------------------------------------------------------------------------------------
# Text output


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], right: Iterable[int] = ()) -> list[str]:
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    aligned = set(right)
    lines = []
    for row in cells:
        parts = [c.rjust(w) if i in aligned else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(parts).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def _rank(value: int | None, k: int) -> str:
    return "-" if value is None else (str(value) if value <= k else f"({value})")


def format_report(report: Mapping[str, Any], per_query: bool = True) -> str:
    """The report as plain-text tables: stages with intervals, leaks, destroyed, gate sweep, queries."""
    config, counts = report["config"], report["queries"]
    ks, stages = config["ks"], config["stages"]
    lines = [
        f"golden {config['golden']['name']} ({counts['items']} items, {counts['total']} queries: "
        f"{counts['answerable']} answerable, {counts['unanswerable']} unanswerable, {counts['forbidden']} forbidden)",
        f"collection {config['collection']}: {config['embedder']}, strategy {config['strategy']}"
        + (f", commit {config['git_commit'][:10]}" if config.get("git_commit") else ""),
        "",
    ]
    header = ["stage", *[f"R@{k} [95% CI]" for k in ks], f"MRR@{max(ks)}", "leaks"]
    rows = []
    for stage in stages:
        block = report["stages"][stage]
        cells = [f"{block[f'recall@{k}']['value']:.3f} [{block[f'recall@{k}']['ci'][0]:.3f}, "
                 f"{block[f'recall@{k}']['ci'][1]:.3f}]" for k in ks]
        rows.append([stage, *cells, f"{block[f'mrr@{max(ks)}']:.3f}", block["leaks"]])
    lines += _table(header, rows)
    first = report["stages"][stages[0]]
    destroyed = report["destroyed"]
    lines += [
        "",
        f"answerable queries: {first['n']}; destroyed by chunking: {destroyed['queries']} "
        f"(items {', '.join(destroyed['items']) or 'none'}), recall ceiling {first['ceiling']:.3f}",
        f"leaks: {report['leaks']['total']}" + ("  <-- MUST BE 0" if report["leaks"]["total"] else ""),
    ]
    for leak in report["leaks"]["list"][:20]:
        lines.append(f"  LEAK {leak['query']} {leak['stage']} rank {leak['rank']}: {leak['source']} ({leak['reason']})")

    gate = report["gate"]
    lines += [
        "",
        f"gate sweep on {gate['stage']} hits (max_sources {gate['max_sources']}; {gate['must_refuse']} must-refuse "
        f"queries, {gate['answerable']} answerable)",
    ]
    sweep_rows = []
    for p in gate["curve"]:
        mark = []
        if p["threshold"] == gate["recommended"]["threshold"]:
            mark.append("recommended")
        if p["threshold"] == gate["current"]["threshold"]:
            mark.append("current")
        sweep_rows.append([f"{p['threshold']:.3f}", p["origin"], p["bluffs"], p["bluffs_unanswerable"],
                           p["bluffs_forbidden"], p["lost"], p["errors"], ", ".join(mark)])
    lines += _table(["threshold", "from", "bluffs", "unans.", "forb.", "lost", "errors", ""], sweep_rows,
                    right=(2, 3, 4, 5, 6))
    rec, cur = gate["recommended"], gate["current"]
    lines.append(
        f"recommended threshold {rec['threshold']:.3f}: {rec['bluffs']} bluffs + {rec['lost']} lost = "
        f"{rec['errors']}; current {cur['threshold']:.3f}: {cur['bluffs']} + {cur['lost']} = {cur['errors']}"
    )

    if per_query:
        kmax = max(ks)
        lines += ["", f"per query: rank of the first relevant hit (- none in top {config['depth']}; (r) beyond "
                      f"k={kmax}); closest distance and gate outcome at {cur['threshold']:.3f} on {gate['stage']}"]
        qrows = []
        for q in report["per_query"]:
            short = {"answerable": "ans", "unanswerable": "unans", "forbidden": "forb"}[q["kind"]]
            if q["kind"] == "answerable":
                ranks = [_rank(q["ranks"][s], kmax) for s in stages]
            else:
                ranks = ["LEAK" if s in q["leaks"] else "." for s in stages]
            flag = "X" if q["destroyed"] else ""
            distance = q["min_distance"].get(gate["stage"])
            qrows.append([q["id"], short, flag, *ranks, "" if distance is None else f"{distance:.3f}",
                          q["gate"] or "", q["query"][:70]])
        lines += _table(["query", "kind", "destroyed", *stages, "dmin", "gate", "text"], qrows)
    return "\n".join(lines)


def format_comparison(result: Mapping[str, Any], name_a: str = "A", name_b: str = "B") -> str:
    label_a = name_a if name_a == result["a"] else f"{name_a} [{result['a']}]"
    label_b = name_b if name_b == result["b"] else f"{name_b} [{result['b']}]"
    lines = [
        f"{label_b} vs {label_a} on {result['queries']} paired answerable queries"
        + (f" ({result['only_a']} only in {name_a}, {result['only_b']} only in {name_b})"
           if result["only_a"] or result["only_b"] else ""),
    ]
    rows = [[f"R@{r['k']}", f"{r['a']:.3f}", f"{r['b']:.3f}", f"+{r['wins']}/-{r['losses']}", f"{r['p']:.4g}"]
            for r in result["rows"]]
    lines += _table(["k", name_a, name_b, "wins/losses", "sign test p"], rows)
    return "\n".join(lines)


def format_strategies(result: Mapping[str, Any]) -> str:
    ks = result["ks"]
    header = ["strategy", *[f"R@{k}" for k in ks], f"MRR@{max(ks)}", "destroyed", "chunks", "embedded tokens",
              "truncated", "leaks"]
    rows = [
        [r["strategy"], *[f"{r[f'recall@{k}']['value']:.3f}" for k in ks], f"{r['mrr']:.3f}", r["destroyed"],
         r["chunks"], r["embedded_tokens"], r["truncated"], r["leaks"]]
        for r in result["rows"]
    ]
    lines = [f"chunking strategies on {result['golden']}, stage {result['stage']}"]
    lines += _table(header, rows, right=range(1, len(header)))
    for t in result["sign_tests"]:
        lines.append(f"{t['a']} vs {t['b']} at R@{t['k']}: +{t['wins']}/-{t['losses']}, sign test p = {t['p']:.4g}")
    return "\n".join(lines)


def format_history(runs: Sequence[Mapping[str, Any]], k: int = 8) -> str:
    rows = []
    for r in runs:
        stage = r["gate_stage"] if r["gate_stage"] in r["metrics"] else r["stages"][-1]
        metric = r["metrics"][stage].get(f"recall@{k}")
        recall = f"{metric['value']:.3f}" if metric else "n/a"
        rows.append([r["id"], r["created_at"], r["golden_name"], r["collection"], r["embedder"].split("/")[-1],
                     r["strategy"], f"{stage} R@{k} {recall}", r["leaks"], r["threshold"], r["recommended_threshold"],
                     (r["git_commit"] or "")[:10]])
    return "\n".join(_table(["run", "when", "golden", "collection", "embedder", "strategy", "recall", "leaks",
                             "threshold", "recommended", "commit"], rows))
