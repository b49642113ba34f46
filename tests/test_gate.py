from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rag.config import Settings
from rag.gate import apply_gate, best_distance, gate_threshold, kept_indices, no_answer_message
from rag.records import Collection, Hit


def hit(chunk_id: int, distance: float) -> Hit:
    return Hit(
        chunk_id=chunk_id, document_id=1, source="a.md", title="A", section="A", content=f"chunk {chunk_id}",
        char_from=0, char_to=7, page=None, distance=distance,
    )


def test_keeps_close_hits_in_ranking_order_up_to_the_cap() -> None:
    hits = [hit(1, 0.60), hit(2, 0.70), hit(3, 0.30), hit(4, 0.50), hit(5, 0.10), hit(6, 0.20)]
    kept, dropped = apply_gate(hits, max_distance=0.675, max_sources=3)
    assert [h.chunk_id for h in kept] == [1, 3, 4]  # ranking order, not distance order
    assert [h.chunk_id for h in dropped] == [2, 5, 6]
    reasons = {h.chunk_id: h.gated_out_reason for h in dropped}
    assert reasons[2] == "distance 0.700 >= 0.675"
    assert reasons[5] == reasons[6] == "capacity: beyond the 3 best sources"
    assert all(h.gated_out_reason is None for h in kept)


def test_a_hit_exactly_at_the_threshold_is_dropped() -> None:
    kept, dropped = apply_gate([hit(1, 0.675)], 0.675, 4)
    assert kept == []
    assert dropped[0].gated_out_reason == "distance 0.675 >= 0.675"


def test_nan_distance_is_dropped() -> None:
    kept, dropped = apply_gate([hit(1, math.nan)], 0.675, 4)
    assert kept == [] and len(dropped) == 1


def test_gated_hits_keep_every_signal_and_get_a_fresh_reason() -> None:
    # Hits arriving with signals set and a stale reason (say, gated once at another threshold)
    # come back equal to their input but for gated_out_reason: cleared when kept, rewritten when dropped.
    signals = {"dense_rank": 2, "sparse_rank": 5, "fts_score": -3.5, "rrf_score": 0.031, "rerank_score": 0.8,
               "rerank_fallback": "timeout"}
    near = dataclasses.replace(hit(1, 0.2), gated_out_reason="distance 0.200 >= 0.100", **signals)
    far = dataclasses.replace(hit(2, 0.9), gated_out_reason="capacity: beyond the 1 best sources", **signals)
    extra = dataclasses.replace(hit(3, 0.3), **signals)
    kept, dropped = apply_gate([near, far, extra], 0.5, 1)
    assert kept == [dataclasses.replace(near, gated_out_reason=None)]
    assert dropped == [dataclasses.replace(far, gated_out_reason="distance 0.900 >= 0.500"),
                       dataclasses.replace(extra, gated_out_reason="capacity: beyond the 1 best sources")]


def test_kept_indices_first_max_sources_under_threshold() -> None:
    distances = [0.3, 0.7, 0.5, 0.2, 0.6, 0.1]
    assert kept_indices(distances, 0.65, 4) == [0, 2, 3, 4]
    assert kept_indices(distances, 0.5, 4) == [0, 3, 5]  # strictly below: 0.5 itself is dropped
    assert kept_indices(distances, 0.05, 4) == []
    assert kept_indices([math.nan, 0.1], 0.5, 4) == [1]
    with pytest.raises(ValueError, match="max_sources"):
        kept_indices(distances, 0.5, 0)


def test_max_sources_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_sources"):
        apply_gate([hit(1, 0.1)], 0.5, 0)


@given(
    distances=st.lists(st.floats(min_value=0.0, max_value=2.0), max_size=30),
    threshold=st.floats(min_value=0.0, max_value=2.0),
    cap=st.integers(min_value=1, max_value=8),
)
def test_gate_properties(distances: list[float], threshold: float, cap: int) -> None:
    hits = [hit(i, d) for i, d in enumerate(distances)]
    kept, dropped = apply_gate(hits, threshold, cap)
    assert sorted(h.chunk_id for h in kept + dropped) == list(range(len(hits)))
    assert len(kept) <= cap
    assert all(h.distance < threshold for h in kept)
    assert all(h.gated_out_reason for h in dropped)
    # The kept hits are exactly the first `cap` hits under the threshold.
    assert [h.chunk_id for h in kept] == [h.chunk_id for h in hits if h.distance < threshold][:cap]


def test_threshold_comes_from_the_collection_when_calibrated() -> None:
    settings = Settings(max_distance=0.675)
    calibrated = Collection(1, "c", "m", 384, "cosine", "E", max_distance=0.55)
    uncalibrated = Collection(1, "c", "m", 384, "cosine", "E", max_distance=None)
    assert gate_threshold(settings, calibrated) == 0.55
    assert gate_threshold(settings, uncalibrated) == 0.675
    assert gate_threshold(settings, None) == 0.675


def test_no_answer_message_names_best_distance_and_threshold_in_the_question_language() -> None:
    english = no_answer_message("en", 0.8123, 0.675)
    vietnamese = no_answer_message("vi", 0.8123, 0.675)
    assert "0.812" in english and "0.675" in english and "not called" in english
    assert "0.812" in vietnamese and "0.675" in vietnamese and "ngưỡng" in vietnamese
    assert "No passage" in no_answer_message("en", None, 0.675)
    assert "Không tìm thấy" in no_answer_message("vi", None, 0.675)


def test_best_distance() -> None:
    assert best_distance([hit(1, 0.7), hit(2, 0.4)]) == 0.4
    assert best_distance([]) is None
