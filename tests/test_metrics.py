"""rag.metrics: hit rate, MRR, Wilson intervals and sign tests against hand-computed numbers,
and the gate sweep (whose kept hits must be the answer path's, ``rag.gate.apply_gate``)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rag.gate import apply_gate
from rag.metrics import (
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
    threshold_grid,
    threshold_quantiles,
    wilson_interval,
)
from rag.records import Hit

Z = 1.959963984540054  # the 0.975 quantile of the standard normal

# ---------------------------------------------------------------------------------------------
# Ranks, intervals, paired tests


def test_hit_rate_at_k_by_hand() -> None:
    ranks = [1, 3, None, 5]
    assert hit_rate_at_k(ranks, 1) == 1 / 4
    assert hit_rate_at_k(ranks, 4) == 2 / 4
    assert hit_rate_at_k(ranks, 5) == 3 / 4
    assert hit_rate_at_k([], 4) == 0.0
    assert hit_count(ranks, 4) == 2


def test_hit_rate_counts_queries_not_relevant_chunks() -> None:
    # Hit rate, not recall: a query is one hit at k however many relevant chunks its top k holds,
    # so three queries with a first relevant hit at rank 1 and one with none give 3/4 at every k.
    assert [hit_rate_at_k([1, 1, 1, None], k) for k in (1, 4, 20)] == [0.75, 0.75, 0.75]


def test_mrr_at_k_by_hand() -> None:
    ranks = [1, 3, None, 5]
    assert mrr_at_k(ranks, 4) == pytest.approx((1 + 1 / 3) / 4)
    assert mrr_at_k(ranks, 5) == pytest.approx((1 + 1 / 3 + 1 / 5) / 4)
    assert mrr_at_k(ranks, 1) == pytest.approx(1 / 4)
    assert mrr_at_k([], 4) == 0.0


@pytest.mark.parametrize("fn", [hit_rate_at_k, mrr_at_k, hit_count])
def test_k_must_be_positive(fn: Any) -> None:
    with pytest.raises(ValueError, match="k must be at least 1"):
        fn([1], 0)


def test_first_relevant_rank() -> None:
    assert first_relevant_rank([False, False, True, True]) == 3
    assert first_relevant_rank([False]) is None
    assert first_relevant_rank([]) is None


def test_wilson_10_of_20_by_hand() -> None:
    # p = 0.5: the centre is exactly 0.5 and half = z/(1 + z²/20) * sqrt(0.25/20 + z²/1600).
    half = Z / (1 + Z * Z / 20) * math.sqrt(0.25 / 20 + Z * Z / 1600)
    low, high = wilson_interval(10, 20)
    assert low == pytest.approx(0.5 - half, abs=1e-12)
    assert high == pytest.approx(0.5 + half, abs=1e-12)
    assert (round(low, 4), round(high, 4)) == (0.2993, 0.7007)


def test_wilson_at_the_edges_by_hand() -> None:
    # 0/n: [0, z²/(n + z²)]; n/n: [n/(n + z²), 1].
    assert wilson_interval(0, 10) == pytest.approx((0.0, Z * Z / (10 + Z * Z)), abs=1e-12)
    assert wilson_interval(20, 20) == pytest.approx((20 / (20 + Z * Z), 1.0), abs=1e-12)
    assert round(wilson_interval(0, 10)[1], 4) == 0.2775
    assert round(wilson_interval(20, 20)[0], 4) == 0.8389
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_wilson_matches_seed_000() -> None:
    # Seed 000: "Wilson interval 95 % on R@20 is [0.471, 0.705] for A and [0.718, 0.901] for E" (64 queries).
    assert tuple(round(x, 3) for x in wilson_interval(38, 64)) == (0.471, 0.705)
    assert tuple(round(x, 3) for x in wilson_interval(53, 64)) == (0.718, 0.901)


def test_wilson_rejects_impossible_counts() -> None:
    with pytest.raises(ValueError):
        wilson_interval(5, 4)
    with pytest.raises(ValueError):
        wilson_interval(1, 4, confidence=1.0)


def test_sign_test_by_hand() -> None:
    # 7 wins, 1 loss: 2 * (C(8,7) + C(8,8)) / 2^8 = 18/256.
    assert sign_test(7, 1) == 18 / 256 == 0.0703125
    assert sign_test(1, 7) == 0.0703125
    # 12/2: 2 * (C(14,12) + C(14,13) + C(14,14)) / 2^14 = 2 * (91 + 14 + 1) / 16384.
    assert sign_test(12, 2) == pytest.approx(2 * 106 / 2**14, abs=1e-15)
    assert sign_test(3, 3) == 1.0
    assert sign_test(0, 0) == 1.0


def test_sign_test_matches_seed_000() -> None:
    # E vs A +18/-3 p = 0.0015; E vs C +12/-2 p = 0.0129; B vs A +8/-6 p = 0.79; hybrid vs BM25 +10/-3 p = 0.09.
    assert round(sign_test(18, 3), 4) == 0.0015
    assert round(sign_test(12, 2), 4) == 0.0129
    assert round(sign_test(8, 6), 2) == 0.79
    assert round(sign_test(9, 7), 2) == 0.80
    assert round(sign_test(10, 3), 2) == 0.09
    assert round(sign_test(10, 6), 2) == 0.45


def test_paired_counts_by_hand() -> None:
    # A passes at k=4: T F F T; B passes: F T T T -> B wins twice, loses once.
    assert paired_counts([1, None, 5, 2], [None, 3, 1, 2], 4) == (2, 1)
    # k=5: A passes T F T T now, so only the second query is a win.
    assert paired_counts([1, None, 5, 2], [None, 3, 1, 2], 5) == (1, 1)
    assert paired_counts([1, None, 5, 2], [None, 3, 1, 2], 1) == (1, 1)
    with pytest.raises(ValueError):
        paired_counts([1], [1, 2], 1)


def test_flips() -> None:
    before = {"a": 1, "b": 9, "c": None, "d": 3, "only-before": 1}
    after = {"a": None, "b": 2, "c": None, "d": 8, "only-after": None}
    assert flips(before, after, 8) == (["a"], ["b"])
    assert flips(before, after, 4) == (["a", "d"], ["b"])


# ---------------------------------------------------------------------------------------------
# Gate sweep


CASES = [
    GateCase("unanswerable", (0.5, 0.6), (False, False)),
    GateCase("forbidden", (0.7,), (False,)),
    GateCase("answerable", (0.3, 0.45), (False, True)),
    GateCase("answerable", (0.55,), (True,)),
    GateCase("answerable", (0.2,), (False,)),  # destroyed: lost at every threshold
]


def test_sweep_gate_by_hand() -> None:
    curve = sweep_gate(CASES, [0.4, 0.5, 0.6, 0.75], max_sources=4)
    got = [(p.threshold, p.bluffs_unanswerable, p.bluffs_forbidden, p.lost) for p in curve]
    assert got == [(0.4, 0, 0, 3), (0.5, 0, 0, 2), (0.6, 1, 0, 1), (0.75, 1, 1, 1)]
    assert [p.errors for p in curve] == [3, 2, 2, 3]
    # 0.5 and 0.6 both make 2 errors; 0.5 has fewer bluffs.
    assert recommend_threshold(curve).threshold == 0.5


def test_sweep_gate_respects_max_sources() -> None:
    case = GateCase("answerable", (0.1, 0.1, 0.2), (False, False, True))
    assert sweep_gate([case], [0.25], max_sources=2)[0].lost == 1
    assert sweep_gate([case], [0.25], max_sources=3)[0].lost == 0


def test_recommend_tie_goes_to_the_lower_threshold() -> None:
    curve = [GatePoint(0.6, 1, 0, 1), GatePoint(0.45, 1, 0, 1), GatePoint(0.5, 0, 0, 3)]
    assert recommend_threshold(curve).threshold == 0.45
    with pytest.raises(ValueError):
        recommend_threshold([])


def test_threshold_grid() -> None:
    grid = threshold_grid()
    assert len(grid) == 17
    assert grid[0] == 0.4 and grid[-1] == 0.8
    assert 0.675 in grid and 0.525 in grid


def test_threshold_quantiles() -> None:
    assert threshold_quantiles([0.1, 0.2, 0.3, 0.4, 0.5], levels=(0.5, 0.25)) == [0.2, 0.3]
    assert threshold_quantiles([]) == []


def test_quantile_sweep_finds_the_range_of_a_compressed_model() -> None:
    # An e5-like model: every distance under 0.45, so the fixed 0.40-0.80 grid lets every
    # unanswerable query through, while thresholds from observed quantiles separate them.
    cases = [GateCase("answerable", (d,), (True,)) for d in (0.20, 0.22, 0.25)] + [
        GateCase("unanswerable", (d,), (False,)) for d in (0.30, 0.32, 0.35)
    ]
    by_grid = recommend_threshold(sweep_gate(cases, sweep_thresholds(cases, "grid"), 4))
    by_quantiles = recommend_threshold(sweep_gate(cases, sweep_thresholds(cases, "quantiles"), 4))
    assert by_grid.errors == 3
    assert by_quantiles.errors == 0
    assert 0.25 < by_quantiles.threshold <= 0.30


def test_sweep_thresholds_modes() -> None:
    both = sweep_thresholds(CASES, "both", 4, extra=[0.675, 0.333])
    assert [t for t, _ in both] == sorted(t for t, _ in both)
    assert dict(both)[0.4] == "grid"
    assert dict(both)[0.333] == "current"
    assert {origin for _, origin in sweep_thresholds(CASES, "quantiles", 4)} == {"quantile"}
    with pytest.raises(ValueError, match="grid, quantiles, both"):
        sweep_thresholds(CASES, "fixed")


def _hit(chunk_id: int, distance: float) -> Hit:
    return Hit(chunk_id=chunk_id, document_id=1, source="x.md", title="", section="", content="",
               char_from=0, char_to=0, page=None, distance=distance)


@given(
    kind=st.sampled_from(["answerable", "unanswerable", "forbidden"]),
    hits=st.lists(st.tuples(st.floats(min_value=0.0, max_value=1.0), st.booleans()), max_size=12),
    threshold=st.floats(min_value=0.0, max_value=1.0),
    cap=st.integers(min_value=1, max_value=6),
)
def test_gate_outcome_is_what_apply_gate_keeps(
    kind: str, hits: list[tuple[float, bool]], threshold: float, cap: int
) -> None:
    # The sweep's verdict on a query must be the answer path's: refused iff apply_gate keeps
    # nothing, and an answerable query is "ok" iff a kept hit is relevant.
    ranked = [_hit(i, d) for i, (d, _) in enumerate(hits)]
    relevant = {i for i, (_, r) in enumerate(hits) if r}
    kept, _dropped = apply_gate(ranked, threshold, cap)
    if kind == "answerable":
        expected = "ok" if any(h.chunk_id in relevant for h in kept) else "lost"
    else:
        expected = "bluff" if kept else "ok"
    case = GateCase(kind, tuple(d for d, _ in hits), tuple(r for _, r in hits))
    assert gate_outcome(case, threshold, cap) == expected


def test_gate_point_json_round_trip() -> None:
    point = GatePoint(0.55, 2, 1, 3, "quantile")
    assert point.to_json() == {"threshold": 0.55, "origin": "quantile", "bluffs": 3, "bluffs_unanswerable": 2,
                               "bluffs_forbidden": 1, "lost": 3, "errors": 6}
    assert GatePoint.from_json(point.to_json()) == point
