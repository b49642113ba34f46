"""The answer-or-refuse decision: signals, threshold choice, the fit with leave-one-corpus-out."""

from __future__ import annotations

import math
import random

import pytest

from rag.decide import (
    FEATURES,
    DecisionModel,
    Example,
    Signals,
    choose_threshold,
    coverage_risk_curve,
    fit_decision,
    outcome_rates,
    rare_half,
    retrieval_signals,
)


def test_retrieval_signals_scale_distance_by_the_threshold_and_measure_the_gap() -> None:
    s = retrieval_signals([0.30, 0.45, 0.50], [0.8, 0.2, 0.1], [1.0, 0.0, 0.0], 1, 1, threshold=0.6)
    assert s.distance == pytest.approx(0.5) and s.gap == pytest.approx(0.25)
    assert s.coverage == 0.8 and s.rare_coverage == 1.0 and s.agreement == 1.0
    lone = retrieval_signals([0.3], [0.0], [0.0], 1, None, threshold=0.6)
    assert lone.gap == 1.0 and lone.agreement == 0.0
    assert retrieval_signals([0.3, 0.4], [0.1, 0.1], [0, 0], 2, 3, 0.6).agreement == 0.5
    with pytest.raises(ValueError):
        retrieval_signals([], [], [], None, None, 0.6)


def test_rare_half_keeps_the_rarest_keywords() -> None:
    assert rare_half({"wifi": 5.0, "password": 2.0, "office": 1.0}) == {"wifi": 5.0, "password": 2.0}
    assert rare_half({"x": 1.0}) == {"x": 1.0} and rare_half({}) == {}


def ex(p_answerable: bool, correct: bool = True, corpus: str = "a", **signals: float) -> Example:
    base = {"distance": 0.5, "gap": 0.1, "coverage": 0.5, "rare_coverage": 0.5, "agreement": 0.5}
    return Example(Signals(**{**base, **signals}), p_answerable, correct and p_answerable, corpus)


def test_outcome_rates_count_bluffs_lost_and_risk_by_hand() -> None:
    examples = [ex(True), ex(True), ex(True, correct=False), ex(False), ex(False)]
    probs = [0.9, 0.2, 0.8, 0.7, 0.1]
    rates = outcome_rates(probs, examples, 0.5)
    assert rates["bluff"] == 0.5  # 1 of 2 unanswerable answered
    assert rates["lost"] == pytest.approx(1 / 3)  # one answerable refused
    assert rates["answered_correct"] == pytest.approx(1 / 3)
    assert rates["coverage"] == pytest.approx(3 / 5) and rates["risk"] == pytest.approx(2 / 3)


def test_choose_threshold_keeps_bluffs_within_the_bound_with_fewest_lost() -> None:
    examples = [ex(True), ex(True), ex(True), ex(False), ex(False), ex(False), ex(False), ex(False)]
    probs = [0.9, 0.8, 0.4, 0.6, 0.3, 0.2, 0.1, 0.05]
    t = choose_threshold(probs, examples, max_bluff=0.10)
    assert t == 0.8  # 0.6 would answer an unanswerable one (20 % bluffs); 0.8 loses only one answer
    assert choose_threshold(probs, examples, max_bluff=0.25) == 0.4  # one bluff of five (20 %), no answer lost


def test_coverage_risk_curve_is_monotone_in_coverage() -> None:
    examples = [ex(True), ex(False), ex(True), ex(False)]
    curve = coverage_risk_curve([0.9, 0.8, 0.3, 0.1], examples)
    coverages = [p["coverage"] for p in curve]
    assert coverages == sorted(coverages, reverse=True)
    assert curve[-1] == {"threshold": 0.9, "coverage": 0.25, "risk": 0.0}


def synthetic(rng: random.Random, corpus: str, n: int) -> list[Example]:
    """Answerable questions have close, covering passages and the model does not refuse."""
    rows = []
    for _ in range(n):
        answerable = rng.random() < 0.6
        if answerable:
            rows.append(ex(True, corpus=corpus, distance=rng.uniform(0.3, 0.8), rare_coverage=rng.uniform(0.5, 1),
                           lm_refused=float(rng.random() < 0.1), verified=rng.uniform(0.5, 1)))
        else:
            rows.append(ex(False, corpus=corpus, distance=rng.uniform(0.6, 1.0), rare_coverage=rng.uniform(0, 0.5),
                           lm_refused=float(rng.random() < 0.7), verified=rng.uniform(0, 0.6)))
    return rows


def test_fit_separates_what_the_signals_separate_out_of_fold() -> None:
    rng = random.Random(7)
    examples = synthetic(rng, "en", 80) + synthetic(rng, "vi", 80)
    model = fit_decision(examples, max_bluff=0.10)
    assert model.fitted_on == ("en", "vi") and 0.0 < model.threshold <= 1.0
    assert model.report["bluff"] <= 0.10 and model.report["lost"] < 0.3  # out-of-fold, not on the training fold
    weights = dict(zip(FEATURES, model.weights, strict=True))
    assert weights["rare_coverage"] > 0 and weights["lm_refused"] < 0 and weights["distance"] < 0
    close = Signals(distance=0.3, gap=0.2, coverage=0.9, rare_coverage=1.0, agreement=1.0, verified=1.0)
    far = Signals(distance=0.95, gap=0.0, coverage=0.1, rare_coverage=0.0, agreement=0.0, lm_refused=1.0)
    assert model.answers(close) and not model.answers(far)
    assert 0.0 <= model.probability(far) < model.probability(close) <= 1.0


def test_decision_model_round_trips_through_json_and_refuses_other_features() -> None:
    model = DecisionModel(weights=(0.1,) * len(FEATURES), intercept=-0.2, mean=(0.0,) * len(FEATURES),
                          scale=(1.0,) * len(FEATURES), threshold=0.5, fitted_on=("en",), report={"bluff": 0.1})
    again = DecisionModel.from_json(model.to_json())
    assert again == model
    s = Signals(0.5, 0.1, 0.5, 0.5, 0.5)
    assert math.isclose(again.probability(s), model.probability(s))
    with pytest.raises(ValueError, match="refit"):
        DecisionModel.from_json(model.to_json().replace('"verified"', '"other"'))


def test_fit_needs_both_kinds_of_question() -> None:
    with pytest.raises(ValueError, match="answer and questions to refuse"):
        fit_decision([ex(True), ex(True)])
