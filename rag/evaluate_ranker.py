"""Fitting and checking the learned order (``rag.ranker``): ``rag eval ranker``.

Each golden set gives, per answerable query, the first ``depth`` fused hits (the learned order off)
with their ``rag.ranker.FEATURES`` and whether each holds the evidence (the golden relevance rule).
The model is checked leave-one-corpus-out (fitted on the other sets, scored on this one: first
relevant rank before and after, R@1/R@4/R@20, MRR@20, sign tests per query) and then fitted on
every set together; that last fit is what ``--out`` writes and ``rag/ranker_default.json`` holds.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rag import ranker, retrieval, store
from rag.config import Settings
from rag.errors import RagError
from rag.evaluate import QueryCache
from rag.golden import Golden, expand_queries, is_relevant

KS = (1, 4, 20)


@dataclass(frozen=True, slots=True)
class RankedQuery:
    """One answerable query's fused list: its features and relevance labels, in the fused order."""

    id: str
    features: np.ndarray
    labels: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OrderCheck:
    """A set scored by a model fitted without it: first relevant rank per query, fused and learned."""

    name: str
    fitted_on: tuple[str, ...]
    fused: tuple[int | None, ...]
    learned: tuple[int | None, ...]

    def recall(self, k: int, learned: bool) -> float:
        ranks = self.learned if learned else self.fused
        return sum(1 for r in ranks if r is not None and r <= k) / len(ranks) if ranks else 0.0

    def mrr(self, learned: bool, k: int = 20) -> float:
        ranks = self.learned if learned else self.fused
        return sum(1.0 / r for r in ranks if r is not None and r <= k) / len(ranks) if ranks else 0.0

    def sign(self, k: int | None) -> tuple[int, int, float]:
        """Queries better / worse with the learned order (at R@k, or on the reciprocal rank when k is
        None) and the two-sided sign test's p-value (scipy.stats.binomtest)."""
        from scipy.stats import binomtest

        def value(rank: int | None) -> float:
            if k is not None:
                return 1.0 if rank is not None and rank <= k else 0.0
            return 1.0 / rank if rank is not None and rank <= 20 else 0.0

        up = sum(1 for a, b in zip(self.fused, self.learned, strict=True) if value(b) > value(a))
        down = sum(1 for a, b in zip(self.fused, self.learned, strict=True) if value(b) < value(a))
        return up, down, float(binomtest(up, up + down).pvalue) if up + down else 1.0


def first_relevant(labels: Sequence[int], order: Sequence[int] | None = None) -> int | None:
    """1-based position of the first relevant label, reading ``labels`` in ``order`` (default as given)."""
    for position, i in enumerate(order if order is not None else range(len(labels)), start=1):
        if labels[i]:
            return position
    return None


def ranked_queries(
    conn: store.Connection, golden: Golden, *, embedder: Any, settings: Settings, depth: int,
    translator: Any = None, search: Callable[..., list[Any]] = retrieval.search,
) -> list[RankedQuery]:
    """Every answerable query of ``golden``, asked as its item's groups, with the learned order off."""
    plain = dataclasses.replace(settings, rank_model="off")
    ask = functools.partial(search, translator=translator) if translator is not None else search
    cached = QueryCache(embedder)
    rows = []
    for query in expand_queries(golden.items):
        if query.kind != "answerable":
            continue
        hits = ask(conn, query.text, embedder=cached, settings=plain, groups=list(query.groups), stage="hybrid",
                   k=depth)[:depth]
        labels = tuple(int(is_relevant(h.source, h.content, query.item.evidence)) for h in hits)
        rows.append(RankedQuery(query.id, retrieval.rank_features(conn, query.text, hits), labels))
    return rows


def _stack(rows: Sequence[RankedQuery]) -> tuple[np.ndarray, list[int]]:
    listed = [r for r in rows if r.labels]
    if not listed:
        return np.zeros((0, len(ranker.FEATURES))), []
    return np.vstack([r.features for r in listed]), [label for r in listed for label in r.labels]


def fit(sets: Mapping[str, Sequence[RankedQuery]], depth: int) -> ranker.RankModel:
    """One model on every listed hit of every set."""
    features, labels = _stack([row for rows in sets.values() for row in rows])
    return ranker.fit_rank_model(features, labels, depth=depth, fitted_on=sorted(sets))


def check(name: str, rows: Sequence[RankedQuery], model: ranker.RankModel) -> OrderCheck:
    """``rows`` re-ordered by ``model``: first relevant rank before and after, per query."""
    fused: list[int | None] = []
    learned: list[int | None] = []
    for row in rows:
        fused.append(first_relevant(row.labels))
        if not row.labels:
            learned.append(None)
            continue
        scores = model.scores(row.features)
        learned.append(first_relevant(row.labels, sorted(range(len(row.labels)), key=lambda i: -scores[i])))
    return OrderCheck(name, model.fitted_on, tuple(fused), tuple(learned))


def leave_one_corpus_out(sets: Mapping[str, Sequence[RankedQuery]], depth: int) -> list[OrderCheck]:
    """Each set scored by a model fitted on the others (needs at least two sets)."""
    if len(sets) < 2:
        raise RagError("leave-one-corpus-out needs at least two golden sets")
    return [check(name, rows, fit({n: r for n, r in sets.items() if n != name}, depth)) for name, rows in sets.items()]


def format_checks(checks: Sequence[OrderCheck]) -> str:
    """The table `rag eval ranker` prints: each set fused -> learned, with the sign tests."""
    lines = ["set             queries  fitted on                 R@1            R@4            R@20           "
             "MRR@20         R@4 +/- (p)     RR +/- (p)"]
    for c in checks:
        cells = [f"{c.recall(k, False):.3f}->{c.recall(k, True):.3f}" for k in KS]
        up4, down4, p4 = c.sign(4)
        up, down, p = c.sign(None)
        lines.append(f"{c.name:<15} {len(c.fused):>7}  {','.join(c.fitted_on):<24}  {cells[0]:<13}  {cells[1]:<13}  "
                     f"{cells[2]:<13}  {c.mrr(False):.3f}->{c.mrr(True):.3f}  +{up4}/-{down4} ({p4:.2g})"
                     f"{'':<4}+{up}/-{down} ({p:.2g})")
    return "\n".join(lines)


__all__ = ["OrderCheck", "RankedQuery", "check", "first_relevant", "fit", "format_checks", "leave_one_corpus_out",
           "ranked_queries"]
