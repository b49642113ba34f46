"""The distance gate: the one part of the pipeline that can say "no" before the model is called.

A retriever always returns something; the gate keeps at most ``max_sources`` hits whose cosine
distance to the question is under a threshold (seed 000 starts at 0.675; a new collection is
stamped with its embedding model's calibrated default, and ``rag eval --calibrate`` may replace
it). When nothing passes, the answer is ``no_answer`` and the language model is never called: a
comparison between two numbers is a cheaper and more reliable refusal than any instruction in a
prompt.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rag.config import Settings
from rag.embedding import E5_ID, E5_INT8_ID, MINILM_ID, MINILM_INT8_ID
from rag.models import Collection, Hit

REASON_DISTANCE = "distance"  # prefix of the reason given to a hit that is too far
REASON_CAPACITY = "capacity"  # prefix of the reason given to a close hit beyond max_sources


def apply_gate(hits: Sequence[Hit], max_distance: float, max_sources: int) -> tuple[list[Hit], list[Hit]]:
    """Split ranked hits into those the model may read and those turned away.

    A hit is kept when ``hit.distance < max_distance`` and fewer than ``max_sources`` hits were
    kept before it; the incoming (fused or reranked) order is preserved. Every dropped hit carries
    ``gated_out_reason``: ``"distance 0.712 >= 0.675"`` or ``"capacity: beyond the 4 best sources"``.

    Pure: no I/O, the input hits are not changed (dropped ones are copies).

    Args:
        hits: hits in ranking order, each with its cosine distance to the question.
        max_distance: the threshold; a hit at exactly this distance is dropped.
        max_sources: the most hits kept (at least 1).

    Returns:
        ``(kept, dropped)``, both in ranking order.

    Raises:
        ValueError: when ``max_sources`` is below 1.
    """
    if max_sources < 1:
        raise ValueError(f"max_sources must be at least 1 (got {max_sources})")
    kept: list[Hit] = []
    dropped: list[Hit] = []
    for hit in hits:
        if not hit.distance < max_distance:  # `not <` also turns away a NaN distance
            reason = f"{REASON_DISTANCE} {hit.distance:.3f} >= {max_distance:.3f}"
            dropped.append(dataclasses.replace(hit, gated_out_reason=reason))
        elif len(kept) >= max_sources:
            reason = f"{REASON_CAPACITY}: beyond the {max_sources} best sources"
            dropped.append(dataclasses.replace(hit, gated_out_reason=reason))
        else:
            kept.append(dataclasses.replace(hit, gated_out_reason=None))
    return kept, dropped


# Calibrated default thresholds, stamped on a new collection of that model (issue 9). Each model puts
# its distances in its own range (multilingual-e5 compresses everything under ~0.25), so one number
# cannot serve both. Source: the hybrid-stage gate sweep (grid + quantiles + a fine grid, max_sources 4)
# POOLED over docs/golden_vi.json on corpus_vi and golden_handbook.json on the English handbook, 194
# queries per model, and 500 bootstrap resamples of the golden items. Rule: keep the seed value when
# it lies inside the interquartile range of the bootstrapped recommended threshold, else take its
# median (2 decimals).
#   all-MiniLM-L6-v2: bootstrap median 0.700, IQR 0.650-0.725; the pooled curve is flat from 0.65
#     to 0.75 (84-88 errors), so seed 000's 0.675 stays. Its int8 ONNX build: median 0.724, IQR
#     0.650-0.750, so 0.675 as well.
#   multilingual-e5-small: bootstrap median 0.166, IQR 0.152-0.191 -> 0.17 (75 errors pooled against
#     81 with no working gate at 0.675; flat from 0.155 to 0.195).
#     Its int8 ONNX build (E5_INT8_ID) keeps 0.17: its vectors are the 4-bit engine's to cosine ~0.997.
# `rag eval --calibrate` still overrides the value per collection; a model given by path has none.
CALIBRATED_MAX_DISTANCE: dict[str, float] = {
    MINILM_ID: 0.675,
    MINILM_INT8_ID: 0.675,
    E5_ID: 0.17,
    E5_INT8_ID: 0.17,
}


def calibrated_threshold(model_id: str) -> float | None:
    """The calibrated default gate threshold of an embedding model, or None when it has none."""
    return CALIBRATED_MAX_DISTANCE.get(model_id)


def gate_threshold(settings: Settings, collection: Collection | None = None) -> float:
    """The collection's calibrated threshold when it has one, else ``settings.max_distance``."""
    if collection is not None and collection.max_distance is not None:
        return float(collection.max_distance)
    return settings.max_distance


def best_distance(hits: Sequence[Hit]) -> float | None:
    """The smallest distance among ``hits`` (None when there are none)."""
    return min((h.distance for h in hits), default=None)


def no_answer_message(language: str, best: float | None, threshold: float) -> str:
    """Why there is no answer, in the question's language ("vi" or anything else for English)."""
    if language == "vi":
        if best is None:
            return "Không tìm thấy đoạn nào trong các tài liệu bạn được xem, nên không có gì để trả lời."
        return (
            f"Không có đoạn nào trong tài liệu đủ gần với câu hỏi: đoạn gần nhất có khoảng cách cosine "
            f"{best:.3f}, trong khi ngưỡng là {threshold:.3f}. Mô hình ngôn ngữ không được gọi."
        )
    if best is None:
        return "No passage was found in the documents you can read, so there is nothing to answer from."
    return (
        f"No passage in the documents is close enough to the question: the best match is at cosine "
        f"distance {best:.3f} and the threshold is {threshold:.3f}. The language model was not called."
    )
