"""Evaluation metrics: pure functions over ranks, counts and distances (no I/O, no database).

- **Hit rate@k** (``hit_rate_at_k``): the share of queries whose first relevant hit lies at rank
  <= k. Each golden item has one needle (any of its evidence entries counts), so this is what the
  report's JSON keys and the printed tables call ``recall@k`` / ``R@k`` (the name of seed 000's
  tables, kept so saved runs, baselines and README tables stay readable). It is *not* recall over
  several relevant documents: one relevant chunk in the top k is a hit.
- **MRR@k** (``mrr_at_k``), **Wilson intervals** (``wilson_interval``), the paired **sign test**
  (``paired_counts`` + ``sign_test``, via scipy) and pass/fail **flips** between two runs.
- **Gate-sweep arithmetic**: ``GateCase`` (one query as the gate sees it), ``gate_outcome``,
  ``sweep_gate``, ``recommend_threshold`` and the thresholds swept (``threshold_grid``,
  ``threshold_quantiles``, ``deciding_distances``, ``sweep_thresholds``). Which hits the gate
  keeps is decided by ``rag.gate.kept_indices``, the rule the answer path uses.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import binomtest, norm

from rag.gate import kept_indices

SWEEP_MODES = ("grid", "quantiles", "both")
GRID = (0.40, 0.80, 0.025)  # start, stop (inclusive), step of the fixed threshold grid
QUANTILE_LEVELS = tuple(round(0.05 * i, 2) for i in range(1, 20))  # 5 %, 10 %, ..., 95 %


# ---------------------------------------------------------------------------------------------
# Ranks


def first_relevant_rank(relevant: Sequence[bool]) -> int | None:
    """1-based rank of the first relevant hit, or None when no hit is relevant."""
    for index, flag in enumerate(relevant):
        if flag:
            return index + 1
    return None


def _check_k(k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be at least 1 (got {k})")


def passes(rank: int | None, k: int) -> bool:
    """Whether a query with first relevant hit at ``rank`` (None: none retrieved) is a hit at k."""
    return rank is not None and rank <= k


def hit_count(ranks: Sequence[int | None], k: int) -> int:
    """Number of queries whose first relevant hit lies at rank <= k."""
    _check_k(k)
    return sum(passes(r, k) for r in ranks)


def hit_rate_at_k(ranks: Sequence[int | None], k: int) -> float:
    """Hit rate at k: the share of queries with a relevant hit among their first k.

    ``HR@k = |{q : rank_q <= k}| / |Q|``, ``rank_q`` the 1-based rank of the first relevant hit
    of query q (``None``: none retrieved). With one needle per query this equals the mean of
    per-query recall@k, which is why the report calls it ``recall@k`` (Manning, Raghavan &
    Schütze 2008, *Introduction to Information Retrieval*, §8.3, for recall; "hit rate" as in
    the top-k recommendation literature, e.g. Deshpande & Karypis 2004, ACM TOIS 22:143). An
    empty list gives 0.0.
    """
    _check_k(k)
    if not ranks:
        return 0.0
    return hit_count(ranks, k) / len(ranks)


def mrr_at_k(ranks: Sequence[int | None], k: int) -> float:
    """Mean reciprocal rank cut at k: ``MRR@k = (1/|Q|) * sum_q [rank_q <= k] / rank_q``.

    Voorhees 1999, "The TREC-8 Question Answering Track Report". A query with no relevant hit
    in the first k contributes 0. An empty list gives 0.0.
    """
    _check_k(k)
    if not ranks:
        return 0.0
    return sum(1.0 / r for r in ranks if r is not None and r <= k) / len(ranks)


# ---------------------------------------------------------------------------------------------
# Intervals and paired tests


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
    """(wins, losses) of B over A at hit rate@k on the same queries, in the same order.

    A win is a query B passes (rank <= k) and A fails; a loss the reverse.
    """
    _check_k(k)
    if len(ranks_a) != len(ranks_b):
        raise ValueError(f"paired lists differ in length ({len(ranks_a)} vs {len(ranks_b)})")
    wins = losses = 0
    for a, b in zip(ranks_a, ranks_b, strict=True):
        a_pass, b_pass = passes(a, k), passes(b, k)
        wins += b_pass and not a_pass
        losses += a_pass and not b_pass
    return wins, losses


def flips(
    before: Mapping[str, int | None], after: Mapping[str, int | None], k: int
) -> tuple[list[str], list[str]]:
    """(lost, gained): query ids passing at hit rate@k before and failing after, and the reverse.

    Only ids present in both mappings are compared; each list is sorted.
    """
    _check_k(k)
    lost, gained = [], []
    for key in sorted(before.keys() & after.keys()):
        was, now = passes(before[key], k), passes(after[key], k)
        if was and not now:
            lost.append(key)
        elif now and not was:
            gained.append(key)
    return lost, gained


# ---------------------------------------------------------------------------------------------
# The gate sweep


@dataclass(frozen=True, slots=True)
class GateCase:
    """One query as the gate sees it: its hit distances in rank order and which are relevant."""

    kind: str  # "answerable" | "unanswerable" | "forbidden" (the last two must be refused)
    distances: tuple[float, ...]
    relevant: tuple[bool, ...]


@dataclass(frozen=True, slots=True)
class GatePoint:
    """The gate's errors at one threshold."""

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

    def to_json(self) -> dict[str, Any]:
        """The point as the report stores it (``docs/eval-json-schema.md``, ``gate.curve[]``)."""
        return {
            "threshold": self.threshold,
            "origin": self.origin,
            "bluffs": self.bluffs,
            "bluffs_unanswerable": self.bluffs_unanswerable,
            "bluffs_forbidden": self.bluffs_forbidden,
            "lost": self.lost,
            "errors": self.errors,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> GatePoint:
        """Read ``to_json()`` back (``bluffs`` and ``errors`` are derived, so not read)."""
        return cls(float(raw["threshold"]), int(raw["bluffs_unanswerable"]), int(raw["bluffs_forbidden"]),
                   int(raw["lost"]), str(raw["origin"]))


def gate_outcome(case: GateCase, max_distance: float, max_sources: int) -> str:
    """"ok", "bluff" (a must-refuse query got through) or "lost" (an answer was turned away).

    The kept hits are ``rag.gate.kept_indices`` of the case's distances: the answer path's rule.
    """
    kept = kept_indices(case.distances, max_distance, max_sources)
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
