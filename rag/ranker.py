"""Learned order (issue 16): a logistic model re-orders the first fused hits from the signals retrieval
already has.

Fusion adds two scores; it cannot see that a passage holding most of the question's rare keywords
is likelier than one holding a common one, that a passage both branches return is likelier than
one only the dense branch found, or that a very short passage seldom holds a whole answer. A
pointwise learning-to-rank model (Liu, "Learning to Rank for Information Retrieval", 2009; here
``sklearn.linear_model.LogisticRegression`` on relevant / not relevant) weighs those signals:

- ``fused``: the fused score (convex or RRF), min-max normalised over the list;
- ``similarity``: the chunk's cosine similarity, min-max normalised over the list;
- ``bm25``: the keyword branch's bm25 over the list's best (0 when it did not return the chunk);
- ``dense_rr``, ``sparse_rr``: 1 / rank in each branch (0 when absent);
- ``coverage``: the IDF-weighted share of the question's keywords the chunk's content holds;
- ``heading_coverage``: the same share in its title and section path;
- ``log_length``: ``ln(1 + characters)`` of the content;
- ``position_rr``: 1 / its position in the fused list.

Every feature is relative to the question's own list or bounded, so one model serves collections
of any size and both embedders (MiniLM's and e5's distance scales differ; the normalised
similarity does not). The bundled model (``rag/ranker_default.json``) was fitted on the project's
visible golden sets with ``rag eval ranker`` and checked leave-one-corpus-out and on the held-out
sets (README, seventh round of issue 16). The pure parts live here; retrieval computes the
coverages (it has the keyword IDF) and calls ``learned_order``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rag.errors import RagError
from rag.records import Hit

FEATURES = ("fused", "similarity", "bm25", "dense_rr", "sparse_rr", "coverage", "heading_coverage",
            "log_length", "position_rr")
BUNDLED_MODEL = "ranker_default.json"


def _min_max(values: Sequence[float]) -> list[float]:
    low, high = min(values), max(values)
    return [(v - low) / (high - low) if high > low else 1.0 for v in values]


def rank_features(hits: Sequence[Hit], coverage: Sequence[float], heading_coverage: Sequence[float]) -> np.ndarray:
    """The ``FEATURES`` matrix of a fused list (one row per hit, in the list's order).

    ``coverage`` and ``heading_coverage`` are the keyword coverages of each hit's content and of its
    title and section path (``rag.retrieval.keyword_coverage``), in the same order.
    """
    if not (len(hits) == len(coverage) == len(heading_coverage)):
        raise ValueError(f"{len(hits)} hits, {len(coverage)} coverages, {len(heading_coverage)} heading coverages")
    if not hits:
        return np.zeros((0, len(FEATURES)))
    fused = _min_max([h.rrf_score for h in hits])
    similarity = _min_max([1.0 - h.distance for h in hits])
    bm25 = [-h.fts_score if h.fts_score is not None else 0.0 for h in hits]
    top = max(bm25)
    rows = [
        [fused[i], similarity[i], bm25[i] / top if top > 0 else 0.0,
         1.0 / h.dense_rank if h.dense_rank else 0.0, 1.0 / h.sparse_rank if h.sparse_rank else 0.0,
         coverage[i], heading_coverage[i], math.log1p(len(h.content)), 1.0 / (i + 1)]
        for i, h in enumerate(hits)
    ]
    return np.asarray(rows, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class RankModel:
    """Weights of the logistic model over ``FEATURES`` and how deep into the fused list it reads."""

    weights: tuple[float, ...]
    intercept: float
    depth: int = 30
    fitted_on: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.weights) != len(FEATURES):
            raise ValueError(f"a rank model needs {len(FEATURES)} weights ({', '.join(FEATURES)}), "
                             f"got {len(self.weights)}")
        if self.depth < 1:
            raise ValueError(f"a rank model's depth must be at least 1 (got {self.depth})")
        if not all(math.isfinite(w) for w in (*self.weights, self.intercept)):
            raise ValueError("a rank model's weights must be finite numbers")

    def scores(self, features: np.ndarray) -> np.ndarray:
        """The probability that each row's passage holds the answer."""
        logits = features @ np.asarray(self.weights, dtype=np.float64) + self.intercept
        return 1.0 / (1.0 + np.exp(-logits))

    def to_json(self) -> str:
        raw = dataclasses.asdict(self) | {"features": list(FEATURES)}
        return json.dumps(raw, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = "rank model") -> RankModel:
        try:
            raw: Any = json.loads(text)
            if list(raw.get("features", FEATURES)) != list(FEATURES):
                raise ValueError(f"features {raw.get('features')} are not this version's {list(FEATURES)}")
            return cls(tuple(float(w) for w in raw["weights"]), float(raw["intercept"]), int(raw.get("depth", 30)),
                       tuple(str(s) for s in raw.get("fitted_on", ())))
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise RagError(f"{where} is not a rank model: {e}") from e


def learned_order(hits: Sequence[Hit], features: np.ndarray, model: RankModel) -> list[Hit]:
    """The hits best first by ``model``'s probability, each carrying it as ``rank_score``; ties keep
    the fused order."""
    if len(features) != len(hits):
        raise ValueError(f"{len(features)} feature rows for {len(hits)} hits")
    if not hits:
        return []
    scores = model.scores(features)
    order = sorted(range(len(hits)), key=lambda i: -scores[i])  # stable
    return [dataclasses.replace(hits[i], rank_score=float(scores[i])) for i in order]


def fit_rank_model(features: np.ndarray, labels: Sequence[int], *, depth: int, fitted_on: Sequence[str] = ()
                   ) -> RankModel:
    """``LogisticRegression`` (default L2, C = 1) on every listed hit of every training question."""
    from sklearn.linear_model import LogisticRegression

    y = np.asarray(labels, dtype=int)
    if len(set(y.tolist())) < 2:
        raise RagError("fitting a rank model needs relevant and irrelevant hits: no listed hit was "
                       + ("relevant" if not y.any() else "irrelevant"))
    fitted = LogisticRegression(C=1.0, max_iter=5000).fit(features, y)
    return RankModel(tuple(float(w) for w in fitted.coef_[0]), float(fitted.intercept_[0]), depth, tuple(fitted_on))


@functools.cache
def bundled_model() -> RankModel | None:
    """The model fitted on the project's visible golden sets (``rag/ranker_default.json``); None when absent."""
    from importlib import resources

    path = resources.files("rag").joinpath(BUNDLED_MODEL)
    if not path.is_file():
        return None
    return RankModel.from_json(path.read_text(encoding="utf-8"), where=str(path))


def load_rank_model(setting: str) -> RankModel | None:
    """The model ``settings.rank_model`` names: "off" none, "" or "bundled" the bundled one, else a JSON
    file written by ``rag eval ranker --out``."""
    if setting == "off":
        return None
    if setting in ("", "bundled"):
        return bundled_model()
    path = Path(setting).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RagError(f"cannot read the rank model {path}: {e.strerror or e}") from e
    return _parsed(text, str(path))


@functools.lru_cache(maxsize=8)
def _parsed(text: str, where: str) -> RankModel:
    return RankModel.from_json(text, where)


__all__ = ["BUNDLED_MODEL", "FEATURES", "RankModel", "bundled_model", "fit_rank_model", "learned_order",
           "load_rank_model", "rank_features"]
