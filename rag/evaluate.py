"""Evaluation runs: every query of a golden set through each retrieval stage of a collection, into
a typed report (``EvalReport``), plus paired comparisons of runs and the chunking-strategy table.

The pieces live next door: the maths in ``rag.metrics`` (hit rate, MRR, Wilson intervals, sign
tests, the gate sweep), golden sets and the relevance rule in ``rag.golden``, the run history in
``rag.history``; the text tables are printed by ``rag.cli`` and the charts drawn by ``rag.ui``.

Every result here is a frozen dataclass whose ``to_json()`` is the JSON of ``rag eval --json``
(``docs/eval-json-schema.md``) and whose ``from_json()`` reads it back, so saved files, the
baseline (``tests/baseline_eval.json``) and stored history keep their shape.

Naming: the JSON keys ``recall@k`` (and the ``R@k`` labels of the tables) are kept from seed
000, but what they hold is the **hit rate at k**: the share of answerable queries with at least
one relevant chunk among their first k hits (``rag.metrics.hit_rate_at_k``). The fields of the
dataclasses say ``hit_rate``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rag import gate, retrieval, store
from rag.chunking import destroyed_needles
from rag.config import Settings
from rag.errors import RagError
from rag.golden import KINDS, Evidence, Golden, Query, expand_queries, is_relevant
from rag.metrics import (
    SWEEP_MODES,
    GateCase,
    GatePoint,
    first_relevant_rank,
    flips,
    gate_outcome,
    hit_count,
    hit_rate_at_k,
    mrr_at_k,
    paired_counts,
    recommend_threshold,
    sign_test,
    sweep_gate,
    sweep_thresholds,
    wilson_interval,
)
from rag.records import Collection, Hit
from rag.text import QUERY_LANGUAGES, query_language, relevance_norm

if TYPE_CHECKING:
    from rag.translate import Translator

STAGES: tuple[str, ...] = tuple(retrieval.STAGES)
DEFAULT_KS = (1, 4, 8, 20)
STRATEGY_PAIRS = (("E", "A"), ("E", "C"))  # seed 000's paired tests: header vs blind, header vs boundaries
REPORT_VERSION = 1
GATE_RULE = "kept = the first max_sources hits in rank order with distance < threshold"
GATE_TIE_BREAK = "fewest bluffs + lost; then fewest bluffs; then the lower threshold"
LEAK_FORBIDDEN = "forbidden evidence"  # a hit relevant to a query that must be refused
LEAK_UNREADABLE = "unreadable document"  # a hit from a document the asker's groups may not read

SearchFn = Callable[..., list[Hit]]


def _r(value: float, digits: int = 4) -> float:
    return round(float(value), digits)


def _p(value: float) -> float:
    """A p-value to 3 significant figures (rounding to decimals would print 2.6e-08 as 0)."""
    return float(f"{float(value):.3g}")


def _hit_rates_json(hit_rate: Mapping[int, HitRate]) -> dict[str, Any]:
    return {f"recall@{k}": cell.to_json() for k, cell in hit_rate.items()}


def _hit_rates_from_json(raw: Mapping[str, Any]) -> dict[int, HitRate]:
    return {int(key.removeprefix("recall@")): HitRate.from_json(value)
            for key, value in raw.items() if key.startswith("recall@")}


# ---------------------------------------------------------------------------------------------
# The report: typed, with its JSON (docs/eval-json-schema.md)


@dataclass(frozen=True, slots=True)
class HitRate:
    """Hit rate at one k (JSON ``recall@k``) with its Wilson 95 % interval."""

    value: float  # share of answerable queries with a relevant hit in the first k (4 decimals)
    ci: tuple[float, float]  # Wilson 95 % interval (4 decimals)
    hits: int  # queries with a relevant hit in the first k

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "ci": list(self.ci), "hits": self.hits}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> HitRate:
        low, high = raw["ci"]
        return cls(float(raw["value"]), (float(low), float(high)), int(raw["hits"]))

    @classmethod
    def of(cls, ranks: Sequence[int | None], k: int) -> HitRate:
        """The hit rate of ``ranks`` at ``k``, rounded as the report stores it."""
        hits = hit_count(ranks, k)
        low, high = wilson_interval(hits, len(ranks))
        return cls(_r(hit_rate_at_k(ranks, k)), (_r(low), _r(high)), hits)


@dataclass(frozen=True, slots=True)
class StageResult:
    """The metrics of one retrieval stage over the answerable queries."""

    n: int  # answerable queries
    hit_rate: dict[int, HitRate]  # k -> hit rate@k (JSON "recall@k"), in k order
    mrr: dict[int, float]  # k -> MRR@k (JSON "mrr@k")
    ceiling: float  # 1 - destroyed queries / n: the best hit rate chunking left possible
    leaks: int  # leaks found in this stage

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, **_hit_rates_json(self.hit_rate), **{f"mrr@{k}": v for k, v in self.mrr.items()},
                "ceiling": self.ceiling, "leaks": self.leaks}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> StageResult:
        mrr = {int(key.removeprefix("mrr@")): float(v) for key, v in raw.items() if key.startswith("mrr@")}
        return cls(int(raw["n"]), _hit_rates_from_json(raw), mrr, float(raw["ceiling"]), int(raw["leaks"]))


@dataclass(frozen=True, slots=True)
class GoldenRef:
    """Which golden set a run measured."""

    name: str
    sha256: str
    items: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "sha256": self.sha256, "items": self.items}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> GoldenRef:
        return cls(str(raw["name"]), str(raw["sha256"]), int(raw["items"]))


@dataclass(frozen=True, slots=True)
class RunConfig:
    """What a run measured, and with what."""

    timestamp: str  # UTC, ISO 8601 to the second
    collection: str
    embedder: str  # the collection's model id
    strategy: str  # the collection's chunking strategy
    stages: tuple[str, ...]
    ks: tuple[int, ...]
    depth: int  # hits retrieved per query and stage
    groups_as_golden: bool
    golden: GoldenRef
    git_commit: str | None
    settings: dict[str, Any]  # every Settings field but db_path, JSON-ready
    run_id: int | None = None  # set once stored in the database

    def to_json(self) -> dict[str, Any]:
        out = {
            "timestamp": self.timestamp, "collection": self.collection, "embedder": self.embedder,
            "strategy": self.strategy, "stages": list(self.stages), "ks": list(self.ks), "depth": self.depth,
            "groups_as_golden": self.groups_as_golden, "golden": self.golden.to_json(),
            "git_commit": self.git_commit, "settings": dict(self.settings),
        }
        if self.run_id is not None:
            out["run_id"] = self.run_id
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> RunConfig:
        return cls(
            timestamp=str(raw["timestamp"]), collection=str(raw["collection"]), embedder=str(raw["embedder"]),
            strategy=str(raw["strategy"]), stages=tuple(raw["stages"]), ks=tuple(int(k) for k in raw["ks"]),
            depth=int(raw["depth"]), groups_as_golden=bool(raw["groups_as_golden"]),
            golden=GoldenRef.from_json(raw["golden"]), git_commit=raw["git_commit"], settings=dict(raw["settings"]),
            run_id=None if raw.get("run_id") is None else int(raw["run_id"]),
        )


@dataclass(frozen=True, slots=True)
class QueryCounts:
    total: int
    items: int
    answerable: int
    unanswerable: int
    forbidden: int

    @property
    def must_refuse(self) -> int:
        return self.unanswerable + self.forbidden

    def to_json(self) -> dict[str, Any]:
        return {"total": self.total, "items": self.items, "answerable": self.answerable,
                "unanswerable": self.unanswerable, "forbidden": self.forbidden}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> QueryCounts:
        return cls(*(int(raw[key]) for key in ("total", "items", *KINDS)))


@dataclass(frozen=True, slots=True)
class MissingNeedle:
    """A golden needle no document of the collection holds: a mistake in the golden set, not chunking's."""

    source: str
    quote: str
    reason: str  # NOT_INDEXED or NOT_IN_DOCUMENT

    def to_json(self) -> dict[str, str]:
        return {"source": self.source, "quote": self.quote, "reason": self.reason}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> MissingNeedle:
        return cls(str(raw["source"]), str(raw["quote"]), str(raw["reason"]))


NOT_INDEXED = "source not indexed"
NOT_IN_DOCUMENT = "quote not in its document"


@dataclass(frozen=True, slots=True)
class Destroyed:
    """What chunking made impossible to find, and the golden needles no document holds at all.

    An answerable item is unfindable when every one of its needles is lost. It counts as destroyed
    by chunking (``items``) when at least one of them is in its document but no chunk holds it
    whole; when none is in its document at all it is a golden-set mistake (``missing_items``).
    """

    items: tuple[str, ...]  # answerable items with every needle lost, chunking to blame
    queries: int  # their queries
    needles: tuple[Evidence, ...]  # golden needles in their document that no chunk holds whole
    missing_items: tuple[str, ...] = ()  # answerable items none of whose needles is in its document
    missing_queries: int = 0  # their queries
    missing: tuple[MissingNeedle, ...] = ()  # golden needles no indexed document holds

    def to_json(self) -> dict[str, Any]:
        return {"items": list(self.items), "queries": self.queries,
                "needles": [{"source": e.source, "quote": e.quote} for e in self.needles],
                "missing_items": list(self.missing_items), "missing_queries": self.missing_queries,
                "missing": [m.to_json() for m in self.missing]}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Destroyed:
        # reports written before the missing keys existed read as "no golden-set mistakes found"
        return cls(tuple(raw["items"]), int(raw["queries"]),
                   tuple(Evidence(e["source"], e["quote"]) for e in raw["needles"]),
                   tuple(raw.get("missing_items", ())), int(raw.get("missing_queries", 0)),
                   tuple(MissingNeedle.from_json(m) for m in raw.get("missing", ())))


@dataclass(frozen=True, slots=True)
class Leak:
    """A hit a reader must never see: forbidden evidence or a document of other groups."""

    query: str
    item: str
    stage: str
    rank: int
    source: str
    chunk_id: int
    reason: str  # LEAK_FORBIDDEN | LEAK_UNREADABLE

    def to_json(self) -> dict[str, Any]:
        return {"query": self.query, "item": self.item, "stage": self.stage, "rank": self.rank,
                "source": self.source, "chunk_id": self.chunk_id, "reason": self.reason}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Leak:
        return cls(str(raw["query"]), str(raw["item"]), str(raw["stage"]), int(raw["rank"]), str(raw["source"]),
                   int(raw["chunk_id"]), str(raw["reason"]))


@dataclass(frozen=True, slots=True)
class Leaks:
    total: int
    by_stage: dict[str, int]
    found: tuple[Leak, ...]  # JSON "list"

    def to_json(self) -> dict[str, Any]:
        return {"total": self.total, "by_stage": dict(self.by_stage), "list": [x.to_json() for x in self.found]}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Leaks:
        return cls(int(raw["total"]), {str(s): int(n) for s, n in raw["by_stage"].items()},
                   tuple(Leak.from_json(x) for x in raw["list"]))


@dataclass(frozen=True, slots=True)
class GateSweep:
    """The gate's bluffs and lost answers over a range of thresholds, on one stage's hits."""

    stage: str
    max_sources: int
    sweep: str  # "grid" | "quantiles" | "both"
    answerable: int
    must_refuse: int  # unanswerable + forbidden queries
    current: GatePoint  # at the threshold in force
    recommended: GatePoint
    curve: tuple[GatePoint, ...]
    rule: str = GATE_RULE
    tie_break: str = GATE_TIE_BREAK

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage, "max_sources": self.max_sources, "rule": self.rule, "sweep": self.sweep,
            "answerable": self.answerable, "must_refuse": self.must_refuse, "current": self.current.to_json(),
            "recommended": self.recommended.to_json(), "tie_break": self.tie_break,
            "curve": [p.to_json() for p in self.curve],
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> GateSweep:
        return cls(
            stage=str(raw["stage"]), max_sources=int(raw["max_sources"]), sweep=str(raw["sweep"]),
            answerable=int(raw["answerable"]), must_refuse=int(raw["must_refuse"]),
            current=GatePoint.from_json(raw["current"]), recommended=GatePoint.from_json(raw["recommended"]),
            curve=tuple(GatePoint.from_json(p) for p in raw["curve"]), rule=str(raw["rule"]),
            tie_break=str(raw["tie_break"]),
        )


@dataclass(frozen=True, slots=True)
class QueryResult:
    """One query of the golden set across the stages run."""

    id: str
    item: str
    kind: str  # for this asker
    wording: str
    query: str
    groups: tuple[str, ...]  # the groups it was asked as
    destroyed: bool
    ranks: dict[str, int | None]  # stage -> first relevant rank (None: none, or a must-refuse query)
    min_distance: dict[str, float | None]  # stage -> closest hit
    leaks: tuple[str, ...]  # stages in which this query leaked
    gate: str | None  # ok | bluff | lost at the current threshold on the gate stage

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "item": self.item, "kind": self.kind, "wording": self.wording, "query": self.query,
                "groups": list(self.groups), "destroyed": self.destroyed, "ranks": dict(self.ranks),
                "min_distance": dict(self.min_distance), "leaks": list(self.leaks), "gate": self.gate}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> QueryResult:
        return cls(
            id=str(raw["id"]), item=str(raw["item"]), kind=str(raw["kind"]), wording=str(raw["wording"]),
            query=str(raw["query"]), groups=tuple(raw["groups"]), destroyed=bool(raw["destroyed"]),
            ranks={str(s): None if r is None else int(r) for s, r in raw["ranks"].items()},
            min_distance={str(s): None if d is None else float(d) for s, d in raw["min_distance"].items()},
            leaks=tuple(raw["leaks"]), gate=raw["gate"],
        )


BREAKDOWNS = ("wording", "language")  # how the answerable queries are split in ``breakdown``
WORDINGS = ("question", "paraphrase")


def query_wording(wording: str) -> str:
    """"question" or "paraphrase" (``Query.wording`` numbers the paraphrases: "paraphrase 1")."""
    return "question" if wording == "question" else "paraphrase"


@dataclass(frozen=True, slots=True)
class GroupResult:
    """The answerable queries of one kind (a wording, or the language they are written in), per stage."""

    by: str  # "wording" | "language"
    group: str  # "question" | "paraphrase"; "vi" | "vi-toneless" | "en" (rag.text.query_language)
    n: int  # answerable queries in the group
    hit_rate: dict[str, dict[int, HitRate]]  # stage -> k -> hit rate@k (JSON "recall@k")
    mrr: dict[str, dict[int, float]]  # stage -> k -> MRR@k

    def to_json(self) -> dict[str, Any]:
        return {"by": self.by, "group": self.group, "n": self.n,
                "stages": {s: {**_hit_rates_json(rates), **{f"mrr@{k}": v for k, v in self.mrr[s].items()}}
                           for s, rates in self.hit_rate.items()}}


def query_groups(query: QueryResult) -> dict[str, str]:
    """The group of ``query`` under each breakdown."""
    return {"wording": query_wording(query.wording), "language": query_language(query.query)}


def breakdown(report: EvalReport) -> tuple[GroupResult, ...]:
    """Hit rate@k and MRR@k of every stage per query kind: question vs paraphrase, and toned
    Vietnamese vs toneless vs English. Computed from ``per_query``, so any stored run has it; a
    group with no query is left out."""
    answerable = [q for q in report.per_query if q.kind == "answerable"]
    order = {"wording": WORDINGS, "language": QUERY_LANGUAGES}
    out = []
    for by in BREAKDOWNS:
        groups: dict[str, list[QueryResult]] = {}
        for q in answerable:
            groups.setdefault(query_groups(q)[by], []).append(q)
        for group in order[by]:
            members = groups.get(group, [])
            if not members:
                continue
            ranks = {s: [q.ranks.get(s) for q in members] for s in report.stages}
            out.append(GroupResult(
                by=by, group=group, n=len(members),
                hit_rate={s: {k: HitRate.of(r, k) for k in report.config.ks} for s, r in ranks.items()},
                mrr={s: {k: _r(mrr_at_k(r, k)) for k in report.config.ks} for s, r in ranks.items()},
            ))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class EvalReport:
    """A whole evaluation run; ``to_json()`` is the file ``rag eval --json`` writes."""

    config: RunConfig
    queries: QueryCounts
    stages: dict[str, StageResult]  # in the order run
    destroyed: Destroyed
    leaks: Leaks
    gate: GateSweep
    per_query: tuple[QueryResult, ...]
    version: int = REPORT_VERSION

    def quote_missing(self, query: QueryResult) -> bool:
        """Whether ``query`` is answerable and no indexed document holds any of its item's quotes
        (a golden-set mistake: ``Destroyed.missing_items``), which no stage can find."""
        return query.kind == "answerable" and query.item in self.destroyed.missing_items

    def to_json(self) -> dict[str, Any]:
        """The report; ``breakdown`` is derived from ``per_query`` (``from_json`` does not read it)."""
        return {**self.summary_json(), "breakdown": [g.to_json() for g in breakdown(self)],
                "per_query": [q.to_json() for q in self.per_query]}

    def summary_json(self) -> dict[str, Any]:
        """The report without ``per_query`` (what ``eval_runs.summary`` stores)."""
        return {
            "version": self.version, "config": self.config.to_json(), "queries": self.queries.to_json(),
            "stages": {s: block.to_json() for s, block in self.stages.items()},
            "destroyed": self.destroyed.to_json(), "leaks": self.leaks.to_json(), "gate": self.gate.to_json(),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> EvalReport:
        """Read a report back (a file of ``rag eval --json``, or the history's rows).

        Raises:
            KeyError, TypeError, ValueError: when ``raw`` is not that JSON.
        """
        return cls(
            config=RunConfig.from_json(raw["config"]), queries=QueryCounts.from_json(raw["queries"]),
            stages={str(s): StageResult.from_json(b) for s, b in raw["stages"].items()},
            destroyed=Destroyed.from_json(raw["destroyed"]), leaks=Leaks.from_json(raw["leaks"]),
            gate=GateSweep.from_json(raw["gate"]), per_query=tuple(QueryResult.from_json(q) for q in raw["per_query"]),
            version=int(raw["version"]),
        )

    def with_run_id(self, run_id: int) -> EvalReport:
        """The same report, recorded as run ``run_id`` of the database history."""
        return dataclasses.replace(self, config=dataclasses.replace(self.config, run_id=run_id))


def read_report(raw: Any, where: str) -> EvalReport:
    """``EvalReport.from_json`` with a malformed file turned into a ``RagError`` naming ``where``."""
    try:
        return EvalReport.from_json(raw)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise RagError(f"{where} is not the JSON of `rag eval --json OUT` ({type(e).__name__}: {e})") from e


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


def parse_sweep(raw: str) -> str:
    if raw not in SWEEP_MODES:
        raise RagError(f"unknown sweep mode {raw!r}; choose one of {', '.join(SWEEP_MODES)}")
    return raw


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
    leaks: tuple[Leak, ...]


@dataclass(frozen=True, slots=True)
class CollectionFacts:
    """What a run needs to know about the collection besides its hits."""

    collection: Collection
    doc_groups: dict[str, set[str]]  # source -> groups that may read it
    lost_needles: frozenset[tuple[str, str]]  # (source, quote) in its document, no chunk holds whole
    destroyed_items: frozenset[str]  # answerable items with every needle lost, chunking to blame
    threshold: float  # the gate threshold in force (rag.gate.gate_threshold)
    missing: tuple[MissingNeedle, ...] = ()  # needles no indexed document holds
    missing_items: frozenset[str] = frozenset()  # answerable items none of whose needles is in its document


@dataclass(frozen=True, slots=True)
class RunPlan:
    """The checked arguments of a run."""

    stages: tuple[str, ...]
    ks: tuple[int, ...]
    depth: int
    sweep: str
    gate_stage: str
    groups_as_golden: bool
    max_sources: int


def missing_needles(
    document_texts: Mapping[str, str], needles: Sequence[tuple[str, str]]
) -> list[MissingNeedle]:
    """The needles whose source is not indexed, or whose quote its document's text does not hold.

    Read with the relevance rule (``relevance_norm``) the chunks are read with, so a needle is
    missing here only if no chunking at all could keep it: a typo in the golden quote, a wrong
    source path, or a file that failed to ingest.

    Args:
        document_texts: source -> the canonical text of an indexed document.
        needles: ``(source, quote)`` pairs.
    """
    normalised: dict[str, str] = {}
    missing = []
    for source, quote in dict.fromkeys(needles):
        if source not in document_texts:
            missing.append(MissingNeedle(source, quote, NOT_INDEXED))
            continue
        if source not in normalised:
            normalised[source] = relevance_norm(document_texts[source])
        if relevance_norm(quote) not in normalised[source]:
            missing.append(MissingNeedle(source, quote, NOT_IN_DOCUMENT))
    return missing


def collection_facts(conn: store.Connection, coll: Collection, golden: Golden, settings: Settings) -> CollectionFacts:
    """Which golden needles survived chunking or were never in a document, who may read each one."""
    contents: dict[str, list[str]] = {}
    for row in store.chunk_rows(conn, collection=coll.name):
        contents.setdefault(row["source"], []).append(row["content"])
    documents = store.document_rows(conn, coll.name)
    doc_groups = {row["source"]: set(json.loads(row["groups"])) for row in documents}
    texts = {row["source"]: row["canonical_text"] for row in documents
             if row["status"] == "ok" and row["canonical_text"] is not None}
    needles = [(e.source, e.quote) for item in golden.items for e in item.evidence]
    cut = destroyed_needles(contents, needles)
    missing = missing_needles(texts, cut)
    absent = {(m.source, m.quote) for m in missing}
    lost = frozenset(cut) - absent
    unfindable = [
        item for item in golden.items
        if item.kind == "answerable" and all((e.source, e.quote) in lost | absent for e in item.evidence)
    ]
    missing_items = frozenset(
        item.id for item in unfindable if all((e.source, e.quote) in absent for e in item.evidence)
    )
    destroyed = frozenset(item.id for item in unfindable) - missing_items
    return CollectionFacts(coll, doc_groups, lost, destroyed, gate.gate_threshold(settings, coll),
                           tuple(missing), missing_items)


def find_leaks(
    query: Query, stage: str, hits: Sequence[Hit], relevant: Sequence[bool], doc_groups: Mapping[str, set[str]]
) -> tuple[Leak, ...]:
    """The hits of one query and stage its asker must never see.

    A hit relevant to a forbidden query is ``LEAK_FORBIDDEN``; any hit from a document none of
    the asker's groups (``all`` included) may read is ``LEAK_UNREADABLE``.
    """
    reader = set(query.groups) | {store.PUBLIC_GROUP}
    leaks = []
    for rank, (hit, rel) in enumerate(zip(hits, relevant, strict=True), start=1):
        if query.kind == "forbidden" and rel:
            reason = LEAK_FORBIDDEN
        elif hit.source in doc_groups and not doc_groups[hit.source] & reader:
            reason = LEAK_UNREADABLE
        else:
            continue
        leaks.append(Leak(query.id, query.item.id, stage, rank, hit.source, hit.chunk_id, reason))
    return tuple(leaks)


def stage_run(query: Query, stage: str, hits: Sequence[Hit], doc_groups: Mapping[str, set[str]]) -> StageRun:
    """What one query's hits in one stage say: first relevant rank, distances, relevance, leaks."""
    relevant = tuple(is_relevant(h.source, h.content, query.item.evidence) for h in hits)
    first = first_relevant_rank(relevant) if query.kind == "answerable" else None
    return StageRun(first, tuple(float(h.distance) for h in hits), relevant,
                    find_leaks(query, stage, hits, relevant, doc_groups))


def run_queries(
    conn: store.Connection, queries: Sequence[Query], plan: RunPlan, facts: CollectionFacts, *,
    search: SearchFn, embedder: Any, settings: Settings, reranker: Any,
) -> dict[tuple[str, str], StageRun]:
    """Every query in every stage, asked as its groups: (query id, stage) -> ``StageRun``."""
    runs: dict[tuple[str, str], StageRun] = {}
    for query in queries:
        for stage in plan.stages:
            hits = search(
                conn, query.text, embedder=embedder, settings=settings, groups=list(query.groups),
                collection=facts.collection.name, stage=stage, k=plan.depth,
                reranker=reranker if stage == "rerank" else None,
            )[: plan.depth]
            runs[(query.id, stage)] = stage_run(query, stage, hits, facts.doc_groups)
    return runs


def stage_result(
    stage: str, answerable: Sequence[Query], runs: Mapping[tuple[str, str], StageRun], ks: Sequence[int],
    destroyed_items: frozenset[str], leaks: int,
) -> StageResult:
    """Hit rate@k with intervals, MRR@k and the ceiling of one stage over the answerable queries.

    ``destroyed_items`` are every answerable item no chunk can be relevant to, whether chunking
    or the golden set is to blame: the ceiling is the best hit rate the run could reach.
    """
    ranks = [runs[(q.id, stage)].rank for q in answerable]
    destroyed_queries = sum(q.item.id in destroyed_items for q in answerable)
    return StageResult(
        n=len(ranks),
        hit_rate={k: HitRate.of(ranks, k) for k in ks},
        mrr={k: _r(mrr_at_k(ranks, k)) for k in ks},
        ceiling=_r(1 - destroyed_queries / len(answerable)) if answerable else 0.0,
        leaks=leaks,
    )


def gate_cases(
    queries: Sequence[Query], runs: Mapping[tuple[str, str], StageRun], stage: str
) -> dict[str, GateCase]:
    """Query id -> the query as the gate sees it on ``stage``'s hits."""
    return {q.id: GateCase(q.kind, runs[(q.id, stage)].distances, runs[(q.id, stage)].relevant) for q in queries}


def sweep_report(
    cases: Sequence[GateCase], plan: RunPlan, threshold: float, counts: QueryCounts
) -> GateSweep:
    """The gate sweep around the threshold in force, with the recommended threshold."""
    thresholds = sweep_thresholds(cases, plan.sweep, plan.max_sources, extra=[threshold])
    curve = sweep_gate(cases, thresholds, plan.max_sources)
    current = next(p for p in curve if p.threshold == round(float(threshold), 4))
    return GateSweep(
        stage=plan.gate_stage, max_sources=plan.max_sources, sweep=plan.sweep, answerable=counts.answerable,
        must_refuse=counts.must_refuse, current=current, recommended=recommend_threshold(curve), curve=tuple(curve),
    )


def query_result(
    query: Query, stages: Sequence[str], runs: Mapping[tuple[str, str], StageRun], destroyed_items: frozenset[str],
    outcome: str,
) -> QueryResult:
    """One row of ``per_query``: ranks, closest distance and leaks per stage, and the gate outcome."""
    mine = {s: runs[(query.id, s)] for s in stages}
    return QueryResult(
        id=query.id, item=query.item.id, kind=query.kind, wording=query.wording, query=query.text,
        groups=tuple(query.groups), destroyed=query.kind == "answerable" and query.item.id in destroyed_items,
        ranks={s: run.rank for s, run in mine.items()},
        min_distance={s: _r(min(run.distances)) if run.distances else None for s, run in mine.items()},
        leaks=tuple(s for s, run in mine.items() if run.leaks), gate=outcome,
    )


def query_counts(queries: Sequence[Query], golden: Golden) -> QueryCounts:
    kinds = [q.kind for q in queries]
    return QueryCounts(len(queries), len(golden.items), *(kinds.count(kind) for kind in KINDS))


def settings_json(settings: Settings) -> dict[str, Any]:
    """The settings a run measured; the database path is where, not what, so it is left out."""
    return {f.name: (str(v) if isinstance(v := getattr(settings, f.name), Path) else v)
            for f in dataclasses.fields(settings) if f.name != "db_path"}


def run_config(
    plan: RunPlan, coll: Collection, golden: Golden, settings: Settings, commit: str | None
) -> RunConfig:
    return RunConfig(
        timestamp=datetime.now(UTC).isoformat(timespec="seconds"), collection=coll.name, embedder=coll.embedder,
        strategy=coll.strategy, stages=plan.stages, ks=plan.ks, depth=plan.depth,
        groups_as_golden=plan.groups_as_golden, golden=GoldenRef(golden.name, golden.sha256, len(golden.items)),
        git_commit=commit, settings=settings_json(settings),
    )


def plan_run(
    settings: Settings, stages: Sequence[str] | None, ks: Sequence[int], sweep: str, groups_as_golden: bool
) -> RunPlan:
    """Check the arguments of ``run_eval`` and fix the depth and the gate stage."""
    chosen = parse_stages(stages) if stages is not None else default_stages(settings)
    cut_offs = parse_ks(ks)
    return RunPlan(
        stages=chosen, ks=cut_offs, depth=max(max(cut_offs), settings.max_sources), sweep=parse_sweep(sweep),
        gate_stage=choose_gate_stage(chosen, settings), groups_as_golden=groups_as_golden,
        max_sources=settings.max_sources,
    )


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
    translator: Translator | None = None,
) -> EvalReport:
    """Run every query of ``golden`` through each stage and build the report.

    Args:
        embedder: the collection's embedding model (wrapped in a ``QueryCache``).
        stages: retrieval stages to measure; default ``default_stages(settings)``.
        ks: cut-offs for hit rate@k and MRR@k; hits are fetched to ``max(ks)`` (at least
            ``settings.max_sources``) and leaks are counted over that depth.
        search_fn: ``rag.retrieval.search`` or a stand-in with its signature.
        translator: passed to every search, when given (``rag.translate``: an English question
            that lands on Vietnamese passages is also searched in Vietnamese).
        reranker: passed to the search of the "rerank" stage.
        groups_as_golden: ask each query as its item's groups (see ``expand_queries``).
        sweep: gate-sweep thresholds, "grid" (0.40-0.80 by 0.025), "quantiles" of observed
            distances, or "both".
        commit: git commit recorded with the run.

    Returns:
        The report; ``.to_json()`` is the JSON of ``docs/eval-json-schema.md``.

    Raises:
        RagError: unknown stage or collection, bad k list, retriever not available.
    """
    plan = plan_run(settings, stages, ks, sweep, groups_as_golden)
    search = search_fn or default_search()
    if translator is not None:
        search = functools.partial(search, translator=translator)
    coll = store.require_collection(conn, collection or settings.collection)
    if "rerank" in plan.stages and reranker is None and search_fn is None:
        from rag.rerank import load_reranker

        reranker = load_reranker(settings)  # once, not once per query
    cached = embedder if isinstance(embedder, QueryCache) else QueryCache(embedder)
    queries = expand_queries(golden.items, plan.groups_as_golden)
    facts = collection_facts(conn, coll, golden, settings)
    runs = run_queries(conn, queries, plan, facts, search=search, embedder=cached, settings=settings,
                       reranker=reranker)

    found = tuple(leak for run in runs.values() for leak in run.leaks)
    by_stage = {s: sum(leak.stage == s for leak in found) for s in plan.stages}
    answerable = [q for q in queries if q.kind == "answerable"]
    counts = query_counts(queries, golden)
    cases = gate_cases(queries, runs, plan.gate_stage)
    return EvalReport(
        config=run_config(plan, coll, golden, settings, commit),
        queries=counts,
        stages={s: stage_result(s, answerable, runs, plan.ks, facts.destroyed_items | facts.missing_items,
                                by_stage[s])
                for s in plan.stages},
        destroyed=Destroyed(
            items=tuple(sorted(facts.destroyed_items)),
            queries=sum(q.item.id in facts.destroyed_items for q in answerable),
            needles=tuple(Evidence(s, quote) for s, quote in sorted(facts.lost_needles)),
            missing_items=tuple(sorted(facts.missing_items)),
            missing_queries=sum(q.item.id in facts.missing_items for q in answerable),
            missing=facts.missing,
        ),
        leaks=Leaks(len(found), by_stage, found),
        gate=sweep_report(list(cases.values()), plan, facts.threshold, counts),
        per_query=tuple(
            query_result(q, plan.stages, runs, facts.destroyed_items,
                         gate_outcome(cases[q.id], facts.threshold, plan.max_sources))
            for q in queries
        ),
    )


# ---------------------------------------------------------------------------------------------
# Comparing runs


@dataclass(frozen=True, slots=True)
class ComparisonRow:
    """B against A at one k."""

    k: int
    hit_rate_a: float  # JSON "a"
    hit_rate_b: float  # JSON "b"
    wins: int  # queries B passes and A fails
    losses: int  # queries A passes and B fails
    p: float  # exact two-sided sign test, 3 significant figures

    def to_json(self) -> dict[str, Any]:
        return {"k": self.k, "a": self.hit_rate_a, "b": self.hit_rate_b, "wins": self.wins, "losses": self.losses,
                "p": self.p}


@dataclass(frozen=True, slots=True)
class Comparison:
    """The JSON of ``rag eval compare --json``."""

    a: str  # stage of A
    b: str  # stage of B
    queries: int  # answerable query ids both runs share
    only_a: int
    only_b: int
    rows: tuple[ComparisonRow, ...]

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "queries": self.queries, "only_a": self.only_a, "only_b": self.only_b,
                "rows": [r.to_json() for r in self.rows]}


NO_SHARED_QUERY = "the two runs share no answerable query: were they run on the same golden set?"


def stage_ranks(report: EvalReport, stage: str) -> dict[str, int | None]:
    """Query id -> first relevant rank in ``stage``, for the answerable queries of a report."""
    if stage not in report.stages:
        raise RagError(f"stage {stage!r} is not in this run (it has {', '.join(report.stages)})")
    return {q.id: q.ranks[stage] for q in report.per_query if q.kind == "answerable"}


def compare_ranks(
    ranks_a: Mapping[str, int | None], ranks_b: Mapping[str, int | None], *, stage_a: str, stage_b: str,
    ks: Sequence[int],
) -> Comparison:
    """Paired comparison of B against A at each k on the query ids both have."""
    common = sorted(ranks_a.keys() & ranks_b.keys())
    if not common:
        raise RagError(NO_SHARED_QUERY)
    a, b = [ranks_a[q] for q in common], [ranks_b[q] for q in common]
    rows = []
    for k in ks:
        wins, losses = paired_counts(a, b, k)
        rows.append(ComparisonRow(k, _r(hit_rate_at_k(a, k)), _r(hit_rate_at_k(b, k)), wins, losses,
                                  _p(sign_test(wins, losses))))
    return Comparison(stage_a, stage_b, len(common), len(ranks_a.keys() - ranks_b.keys()),
                      len(ranks_b.keys() - ranks_a.keys()), tuple(rows))


def compare_reports(
    a: EvalReport, b: EvalReport, *, stage_a: str, stage_b: str | None = None, ks: Sequence[int] | None = None,
) -> Comparison:
    """Paired comparison of B against A at each hit rate@k: wins, losses and the sign test.

    ``a`` and ``b`` may be the same report with two stages. Queries are matched by id; only the
    answerable queries present in both count. ``ks`` defaults to the cut-offs both runs have.
    """
    stage_b = stage_b or stage_a
    ranks_a, ranks_b = stage_ranks(a, stage_a), stage_ranks(b, stage_b)
    if not ranks_a.keys() & ranks_b.keys():
        raise RagError(NO_SHARED_QUERY)
    cut_offs = parse_ks(ks) if ks is not None else tuple(sorted(set(a.config.ks) & set(b.config.ks)))
    return compare_ranks(ranks_a, ranks_b, stage_a=stage_a, stage_b=stage_b, ks=cut_offs)


def regressions(baseline: EvalReport, current: EvalReport, k: int = 8) -> dict[str, list[str]]:
    """Per stage present in both runs, the queries passing at hit rate@k in the baseline that now fail."""
    out = {}
    for stage in baseline.stages:
        if stage in current.stages:
            lost, _ = flips(stage_ranks(baseline, stage), stage_ranks(current, stage), k)
            out[stage] = lost
    return out


# ---------------------------------------------------------------------------------------------
# The chunking-strategy table (seed 000)


@dataclass(frozen=True, slots=True)
class StrategyRow:
    """One chunking strategy on one stage."""

    strategy: str
    hit_rate: dict[int, HitRate]  # JSON "recall@k"
    mrr: float  # MRR at the largest k
    destroyed: int  # answerable items
    chunks: int
    embedded_tokens: int
    truncated: int
    leaks: int

    def to_json(self) -> dict[str, Any]:
        return {"strategy": self.strategy, **_hit_rates_json(self.hit_rate), "mrr": self.mrr,
                "destroyed": self.destroyed, "chunks": self.chunks, "embedded_tokens": self.embedded_tokens,
                "truncated": self.truncated, "leaks": self.leaks}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> StrategyRow:
        return cls(str(raw["strategy"]), _hit_rates_from_json(raw), float(raw["mrr"]), int(raw["destroyed"]),
                   int(raw["chunks"]), int(raw["embedded_tokens"]), int(raw["truncated"]), int(raw["leaks"]))


@dataclass(frozen=True, slots=True)
class SignTest:
    """Strategy ``a`` against ``b`` at one k: wins are queries ``a`` passes and ``b`` fails."""

    a: str
    b: str
    k: int
    wins: int
    losses: int
    p: float

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "k": self.k, "wins": self.wins, "losses": self.losses, "p": self.p}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> SignTest:
        return cls(str(raw["a"]), str(raw["b"]), int(raw["k"]), int(raw["wins"]), int(raw["losses"]),
                   float(raw["p"]))


@dataclass(frozen=True, slots=True)
class StrategyTable:
    """The JSON of ``rag eval strategies --json OUT``."""

    stage: str
    ks: tuple[int, ...]
    golden: str  # the golden set's name
    rows: tuple[StrategyRow, ...]
    sign_tests: tuple[SignTest, ...] = ()
    ranks: dict[str, dict[str, int | None]] = field(default_factory=dict)  # strategy -> query id -> rank

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "ks": list(self.ks), "golden": self.golden,
                "rows": [r.to_json() for r in self.rows], "sign_tests": [t.to_json() for t in self.sign_tests],
                "ranks": {s: dict(r) for s, r in self.ranks.items()}}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> StrategyTable:
        """Read ``to_json()`` back; ``sign_tests`` and ``ranks`` may be missing."""
        return cls(
            stage=str(raw["stage"]), ks=tuple(int(k) for k in raw["ks"]), golden=str(raw["golden"]),
            rows=tuple(StrategyRow.from_json(r) for r in raw["rows"]),
            sign_tests=tuple(SignTest.from_json(t) for t in raw.get("sign_tests", [])),
            ranks={str(s): {str(q): None if r is None else int(r) for q, r in by.items()}
                   for s, by in raw.get("ranks", {}).items()},
        )


def chunk_stats(conn: store.Connection, collection: str) -> dict[str, int]:
    """Chunks, embedded tokens (header included) and truncated chunks of a collection."""
    rows = store.chunk_rows(conn, collection=collection)
    return {
        "chunks": len(rows),
        "embedded_tokens": sum(int(r["token_count"]) for r in rows),
        "truncated": sum(int(r["truncated"]) for r in rows),
    }


def strategy_row(strategy: str, report: EvalReport, stage: str, stats: Mapping[str, int]) -> StrategyRow:
    block = report.stages[stage]
    return StrategyRow(
        strategy=strategy, hit_rate=dict(block.hit_rate), mrr=block.mrr[max(report.config.ks)],
        destroyed=len(report.destroyed.items), chunks=stats["chunks"], embedded_tokens=stats["embedded_tokens"],
        truncated=stats["truncated"], leaks=report.leaks.total,
    )


def strategy_sign_tests(ranks: Mapping[str, Mapping[str, int | None]], ks: Sequence[int]) -> tuple[SignTest, ...]:
    """The sign tests of ``STRATEGY_PAIRS`` present in ``ranks``, at every k."""
    tests = []
    for first, second in STRATEGY_PAIRS:
        if first in ranks and second in ranks:
            common = sorted(ranks[first].keys() & ranks[second].keys())
            for k in ks:
                wins, losses = paired_counts([ranks[second][q] for q in common], [ranks[first][q] for q in common], k)
                tests.append(SignTest(first, second, k, wins, losses, _p(sign_test(wins, losses))))
    return tuple(tests)


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
) -> StrategyTable:
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
            rows.append(strategy_row(strategy, report, stage, stats))
            ranks[strategy] = stage_ranks(report, stage)
    return StrategyTable(stage, ks, golden.name, tuple(rows), strategy_sign_tests(ranks, ks), ranks)
