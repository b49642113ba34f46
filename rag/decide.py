"""The answer-or-refuse decision: a calibrated logistic model over several signals.

The distance gate (``rag.gate``) stays the cheap first filter: a question whose nearest passage
is far away never reaches the model. Past it, "quote the nearest passage when the model fails"
turned most unanswerable questions into bluffs, because a near-topic question always has a
near passage. This module decides instead, from signals that each carry part of the evidence:

- ``distance``: the best cosine distance, divided by the collection's gate threshold so that
  embedders with different distance scales (MiniLM ~0.3-0.9, e5 ~0.1-0.25) share one model;
- ``gap``: how much closer the best passage is than the next one (relative, as above);
- ``coverage``: the IDF-weighted share of the question's keywords held by the best kept
  passage, and ``rare_coverage``: the same over the rarer half of the keywords only — an
  unanswerable near-topic question tends to miss exactly its rare term ("Wi-Fi password",
  "severance");
- ``agreement``: whether the dense and the sparse branch put the same passage on top;
- ``lm_refused``: the language model replied "not in the sources";
- ``lm_logodds``: the model's yes/no log-odds that the sources answer the question (0 unknown);
- ``verified``: the share of the model's sentences that passed verification.

The model is ``sklearn.linear_model.LogisticRegression`` (Cox 1958; calibrated probabilities by
construction of the log-loss), fitted on golden sets with leave-one-corpus-out validation
(``sklearn.model_selection.LeaveOneGroupOut``) so that the reported figures come from corpora
the weights never saw. The threshold on the probability is chosen on the out-of-fold
predictions: the lowest share of lost answers such that bluffs stay within ``max_bluff``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

FEATURES = ("distance", "gap", "coverage", "rare_coverage", "agreement", "lm_refused", "lm_logodds", "verified")
LOGODDS_CLIP = 10.0  # |log-odds| beyond this says nothing more and would dominate the fit


@dataclass(frozen=True, slots=True)
class Signals:
    """The evidence for one question, each value a plain float (see the module docstring)."""

    distance: float
    gap: float
    coverage: float
    rare_coverage: float
    agreement: float
    lm_refused: float = 0.0
    lm_logodds: float = 0.0
    verified: float = 0.0

    def vector(self) -> np.ndarray:
        return np.array([getattr(self, name) for name in FEATURES], dtype=np.float64)


def retrieval_signals(
    distances: Sequence[float],
    coverages: Sequence[float],
    rare_coverages: Sequence[float],
    top_dense_rank: int | None,
    top_sparse_rank: int | None,
    threshold: float,
) -> Signals:
    """The retrieval part of the signals, from the kept hits in rank order.

    Args:
        distances: cosine distance of each kept hit (best first).
        coverages: IDF-weighted keyword coverage of each kept hit.
        rare_coverages: the same over the rarer half of the keywords.
        top_dense_rank, top_sparse_rank: the first hit's rank in each branch (None: absent).
        threshold: the collection's gate threshold (the distance scale).
    """
    if not distances:
        raise ValueError("retrieval_signals needs at least one kept hit")
    scale = threshold if threshold > 0 else 1.0
    best = min(distances)
    rest = sorted(distances)[1:]
    gap = (rest[0] - best) / scale if rest else 1.0
    agreement = 1.0 if top_dense_rank == 1 and top_sparse_rank == 1 else (
        0.5 if top_dense_rank is not None and top_sparse_rank is not None else 0.0)
    return Signals(
        distance=best / scale, gap=gap, coverage=max(coverages, default=0.0),
        rare_coverage=max(rare_coverages, default=0.0), agreement=agreement,
    )


def rare_half(idf: Mapping[str, float]) -> dict[str, float]:
    """The rarer half of the keywords by IDF (at least one): the terms a passage must hold."""
    if not idf:
        return {}
    ranked = sorted(idf.items(), key=lambda kv: -kv[1])
    return dict(ranked[: max(1, math.ceil(len(ranked) / 2))])


def clip_logodds(value: float | None) -> float:
    if value is None or math.isnan(value):
        return 0.0
    return float(max(-LOGODDS_CLIP, min(LOGODDS_CLIP, value)))


@dataclass(frozen=True, slots=True)
class DecisionModel:
    """Weights of the logistic model plus the probability threshold; stored per collection."""

    weights: tuple[float, ...]
    intercept: float
    mean: tuple[float, ...]  # standardisation of each feature (fitted on the training rows)
    scale: tuple[float, ...]
    threshold: float
    features: tuple[str, ...] = FEATURES
    fitted_on: tuple[str, ...] = ()  # the corpora (golden sets) it was fitted on
    report: dict[str, float] = field(default_factory=dict)  # out-of-fold figures at the threshold

    def probability(self, signals: Signals) -> float:
        """P(the shown answer is right | signals)."""
        x = (signals.vector() - np.asarray(self.mean)) / np.asarray(self.scale)
        z = float(np.dot(np.asarray(self.weights), x) + self.intercept)
        return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0

    def answers(self, signals: Signals) -> bool:
        return self.probability(signals) >= self.threshold

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DecisionModel:
        raw = json.loads(text)
        if tuple(raw.get("features", ())) != FEATURES:
            raise ValueError(f"decision model features {raw.get('features')} differ from {FEATURES}: refit it")
        return cls(
            weights=tuple(raw["weights"]), intercept=float(raw["intercept"]), mean=tuple(raw["mean"]),
            scale=tuple(raw["scale"]), threshold=float(raw["threshold"]), features=tuple(raw["features"]),
            fitted_on=tuple(raw.get("fitted_on", ())), report=dict(raw.get("report", {})),
        )


@dataclass(frozen=True, slots=True)
class Example:
    """One golden query: its signals, whether answering it is right, and its corpus."""

    signals: Signals
    answerable: bool  # the evidence is visible to the asker: answering (correctly) is right
    correct: bool  # the answer that would be shown cites the evidence (False for unanswerable)
    corpus: str


def choose_threshold(probabilities: Sequence[float], examples: Sequence[Example], max_bluff: float = 0.10) -> float:
    """The probability threshold with the fewest lost answers whose bluff rate stays <= max_bluff.

    A bluff: an unanswerable query (or an answerable one whose shown answer is wrong) that is
    answered. Lost: an answerable, correctly answerable query that is refused. Rates are over
    the unanswerable and the answerable queries respectively. When no threshold keeps bluffs
    within the bound, the one with the fewest bluffs wins.
    """
    if len(probabilities) != len(examples):
        raise ValueError("one probability per example")
    scored = [(t, outcome_rates(probabilities, examples, t)) for t in sorted({0.0, 1.0, *probabilities})]
    feasible = [(r["lost"], -r["answered_correct"], t) for t, r in scored if r["bluff"] <= max_bluff]
    if feasible:
        return min(feasible)[2]
    return min((r["bluff"], r["lost"], t) for t, r in scored)[2]


def outcome_rates(probabilities: Sequence[float], examples: Sequence[Example], threshold: float) -> dict[str, float]:
    """Bluff, lost and answered-and-correct rates at ``threshold``, and the coverage/risk pair."""
    answered = [p >= threshold for p in probabilities]
    negatives = [e for e in examples if not e.answerable]
    positives = [e for e in examples if e.answerable]
    bluffs = sum(a for a, e in zip(answered, examples, strict=True) if not e.answerable)
    lost = sum(not a for a, e in zip(answered, examples, strict=True) if e.answerable)
    right = sum(a and e.correct for a, e in zip(answered, examples, strict=True) if e.answerable)
    shown = sum(answered)
    wrong = sum(a and not (e.answerable and e.correct) for a, e in zip(answered, examples, strict=True))
    return {
        "bluff": bluffs / len(negatives) if negatives else 0.0,
        "lost": lost / len(positives) if positives else 0.0,
        "answered_correct": right / len(positives) if positives else 0.0,
        "coverage": shown / len(examples) if examples else 0.0,
        "risk": wrong / shown if shown else 0.0,
    }


def coverage_risk_curve(probabilities: Sequence[float], examples: Sequence[Example]) -> list[dict[str, float]]:
    """(threshold, coverage, risk) at every distinct probability: the selective-answering curve
    (El-Yaniv & Wiener 2010): share of questions answered vs share of the answered that are wrong."""
    points = []
    for t in sorted({*probabilities}):
        rates = outcome_rates(probabilities, examples, t)
        points.append({"threshold": t, "coverage": rates["coverage"], "risk": rates["risk"]})
    return points


def _label(example: Example) -> int:
    return int(example.answerable and example.correct)


def fit_decision(
    examples: Sequence[Example], max_bluff: float = 0.10, c: float = 1.0, out_of_fold_sink: list[float] | None = None
) -> DecisionModel:
    """Fit the logistic model on ``examples``; the threshold and report come from
    leave-one-corpus-out predictions when there are two corpora or more (else from the fit)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import LeaveOneGroupOut

    if len({_label(e) for e in examples}) < 2:
        raise ValueError("fitting the decision needs questions to answer and questions to refuse")
    x = np.stack([e.signals.vector() for e in examples])
    y = np.array([_label(e) for e in examples])
    corpora = np.array([e.corpus for e in examples])
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale == 0] = 1.0

    def fitted(rows: np.ndarray) -> LogisticRegression:
        model = LogisticRegression(C=c, max_iter=1000)
        model.fit((x[rows] - mean) / scale, y[rows])
        return model

    out_of_fold = np.zeros(len(examples))
    if len(set(corpora)) >= 2:
        for train, test in LeaveOneGroupOut().split(x, y, corpora):
            if len(set(y[train])) < 2:
                out_of_fold[test] = y[train][0]
                continue
            out_of_fold[test] = fitted(train).predict_proba((x[test] - mean) / scale)[:, 1]
    else:
        out_of_fold = fitted(np.arange(len(examples))).predict_proba((x - mean) / scale)[:, 1]
    if out_of_fold_sink is not None:
        out_of_fold_sink.extend(float(p) for p in out_of_fold)
    threshold = choose_threshold(list(out_of_fold), examples, max_bluff)
    final = fitted(np.arange(len(examples)))
    report = outcome_rates(list(out_of_fold), examples, threshold)
    return DecisionModel(
        weights=tuple(float(w) for w in final.coef_[0]), intercept=float(final.intercept_[0]),
        mean=tuple(float(m) for m in mean), scale=tuple(float(s) for s in scale), threshold=float(threshold),
        fitted_on=tuple(sorted(set(corpora))), report=report,
    )


# ---------------------------------------------------------------------------------------------
# The policy ask() applies: two fitted models, one before the language model runs, one after


RETRIEVAL_FEATURES = ("distance", "gap", "coverage", "rare_coverage", "agreement")
MODES = ("auto", "off")  # settings.decision
META_KEY = "decision:"  # + collection name: the collection's fitted policy in the meta table


@dataclass(frozen=True, slots=True)
class Policy:
    """The answer-or-refuse decision of one collection.

    ``before`` sees only the retrieval signals (the language-model features are 0 when it is
    fitted and applied) and decides whether the model is called at all, so that no text streams
    for a question that will be refused. ``after`` sees every signal and decides, when the model
    wrote no verified sentence, between a quote of the best passage and *not found*.
    """

    before: DecisionModel
    after: DecisionModel
    source: str = ""  # "bundled" or the collection it was fitted for
    # The calibration report: per corpus, leave-one-corpus-out figures and coverage-risk points
    # (rag.evaluate_answers.calibration_report); shown on the Evaluation page.
    report: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"before": json.loads(self.before.to_json()), "after": json.loads(self.after.to_json()),
                           "source": self.source, "report": self.report}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Policy:
        raw = json.loads(text)
        before, after = (DecisionModel.from_json(json.dumps(raw[key])) for key in ("before", "after"))
        return cls(before, after, str(raw.get("source", "")), dict(raw.get("report", {})))


def retrieval_only(signals: Signals) -> Signals:
    """The signals as the ``before`` model sees them: the language model has not run."""
    return Signals(signals.distance, signals.gap, signals.coverage, signals.rare_coverage, signals.agreement)


def fit_policy(
    examples_before: Sequence[Example],
    examples_after: Sequence[Example],
    max_bluff: float = 0.10,
    source: str = "",
    joint: Callable[[list[float], list[float]], tuple[float, float]] | None = None,
) -> Policy:
    """Fit both models with leave-one-corpus-out thresholds.

    ``examples_before``: one per query, ``correct`` = a kept passage holds the evidence (answering
    can be right); ``examples_after``: the queries the language model ran on, ``correct`` = the
    shown answer (verified sentences, or the quote) cites the evidence. ``joint``: given both
    models' out-of-fold probabilities (in the examples' order), the pair of thresholds to use
    instead of each model's own (``rag.evaluate_answers`` passes the end-to-end choice).
    """
    oof_before: list[float] = []
    oof_after: list[float] = []
    before = fit_decision([dataclasses.replace(e, signals=retrieval_only(e.signals)) for e in examples_before],
                          max_bluff, out_of_fold_sink=oof_before)
    after = fit_decision(examples_after, max_bluff, out_of_fold_sink=oof_after)
    if joint is not None:
        t_before, t_after = joint(oof_before, oof_after)
        before = dataclasses.replace(before, threshold=t_before)
        after = dataclasses.replace(after, threshold=t_after)
    return Policy(before, after, source)


def joint_thresholds(
    p_before: np.ndarray, p_after: np.ndarray, answerable: np.ndarray, right: np.ndarray, max_bluff: float
) -> tuple[float, float]:
    """The pair of thresholds with the fewest lost answers whose end-to-end bluff rate stays
    within ``max_bluff`` (else the fewest bluffs), over every query.

    A query is answered when ``p_before >= t1`` and ``p_after >= t2`` (NaN: never answered, e.g.
    refused by the gate). ``right``: answering it shows a correct answer. A bluff: a query that
    must be refused (not ``answerable``) is answered; lost: an answerable query is refused.
    Choosing the two thresholds together lets the cheap first model stay lenient when the second
    one, which sees what the language model did, catches the rest.
    """
    candidates_b = np.unique(np.concatenate([[0.0], p_before[~np.isnan(p_before)]]))
    candidates_a = np.unique(np.concatenate([[0.0], p_after[~np.isnan(p_after)]]))
    pb = np.nan_to_num(p_before, nan=-1.0)
    pa = np.nan_to_num(p_after, nan=-1.0)
    negatives = max(1, int((~answerable).sum()))
    positives = max(1, int(answerable.sum()))
    best: tuple[float, float, float, float, float] | None = None  # (infeasible, bluff|lost, -right, t1, t2)
    for t1 in candidates_b:
        passed = pb >= t1
        shown = passed[None, :] & (pa[None, :] >= candidates_a[:, None])  # one row per t2
        bluff = (shown & ~answerable).sum(axis=1) / negatives
        lost = (~shown & answerable).sum(axis=1) / positives
        good = (shown & answerable & right).sum(axis=1) / positives
        for i, t2 in enumerate(candidates_a):
            feasible = bluff[i] <= max_bluff
            key = (0.0 if feasible else 1.0, lost[i] if feasible else bluff[i], -good[i], float(t1), float(t2))
            if best is None or key < best:
                best = key
    assert best is not None
    return best[3], best[4]


# What the answer to decide on was made of, which decides the policy that reads it:
# "model" (the language model wrote or failed, and a quote stood in), "examined" (the same with the
# answer examiner's log-odds), "quotes" (no language model: `rag ask --no-generate`; its ``after``
# model saw no model signal, where the "model" policy reads "nothing verified" as a failure).
POLICY_KINDS = ("model", "examined", "quotes")
BUNDLED_POLICIES = {"model": "decision_default.json", "examined": "decision_examiner.json",
                    "quotes": "decision_quotes.json"}
QUOTES_META_KEY = "decision-quotes:"  # + collection name: its policy for answers without the model


def policy_kind(generate: bool, examined: bool) -> str:
    """The kind of policy (``POLICY_KINDS``) for an answer made with or without the language model."""
    return "quotes" if not generate else ("examined" if examined else "model")


def meta_key(collection: str, kind: str) -> str:
    """Where a collection's own fitted policy of ``kind`` is stored (the meta table). One slot
    serves "model" and "examined", as before: ``rag eval answers --calibrate`` fits it with the
    examiner setting in force."""
    return (QUOTES_META_KEY if kind == "quotes" else META_KEY) + collection


@functools.cache
def bundled_policy(kind: str = "model") -> Policy | None:
    """The policy of ``kind`` fitted on the project's visible golden sets (``BUNDLED_POLICIES``:
    ``rag/decision_default.json``, the one fitted with the answer examiner's log-odds, the one
    fitted on answers without the language model), used by a collection that has none of its
    own; None when the file is absent."""
    from importlib import resources

    path = resources.files("rag").joinpath(BUNDLED_POLICIES[kind])
    if not path.is_file():
        return None
    return Policy.from_json(path.read_text(encoding="utf-8"))


NOT_FOUND = {
    "en": "The documents you can read do not answer this question.",
    "vi": "Các tài liệu bạn được xem không trả lời câu hỏi này.",
}


def not_found_message(language: str) -> str:
    return NOT_FOUND.get(language, NOT_FOUND["en"])


__all__ = [
    "BUNDLED_POLICIES",
    "FEATURES",
    "MODES",
    "POLICY_KINDS",
    "QUOTES_META_KEY",
    "DecisionModel",
    "Example",
    "Policy",
    "Signals",
    "bundled_policy",
    "choose_threshold",
    "clip_logodds",
    "coverage_risk_curve",
    "fit_decision",
    "fit_policy",
    "meta_key",
    "not_found_message",
    "outcome_rates",
    "policy_kind",
    "rare_half",
    "retrieval_only",
    "retrieval_signals",
]
