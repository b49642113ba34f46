"""The distance gate: the one part of the pipeline that can say "no" before the model is called.

A retriever always returns something; the gate keeps at most ``max_sources`` hits whose cosine
distance to the question is under a threshold (seed 000 starts at 0.675; a new collection is
stamped with its embedding model's calibrated default from ``rag.registry``, and ``rag eval
--calibrate`` may replace it). When nothing passes, the answer is ``no_answer`` and the language
model is never called: a comparison between two numbers is a cheaper and more reliable refusal
than any instruction in a prompt.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rag.config import Settings
from rag.records import Collection, Hit

REASON_DISTANCE = "distance"  # prefix of the reason given to a hit that is too far
REASON_CAPACITY = "capacity"  # prefix of the reason given to a close hit beyond max_sources


def kept_indices(distances: Sequence[float], max_distance: float, max_sources: int) -> list[int]:
    """The gate rule over plain numbers: indices of the hits the gate keeps.

    Kept are the first ``max_sources`` hits, in rank order, whose cosine distance is strictly below
    ``max_distance`` (a NaN distance is never below, so it is turned away). ``apply_gate`` (the
    answer path) and the evaluation's gate sweep (``rag.metrics.gate_outcome``) both call this,
    so what is measured is what answers.

    Raises:
        ValueError: when ``max_sources`` is below 1.
    """
    if max_sources < 1:
        raise ValueError(f"max_sources must be at least 1 (got {max_sources})")
    return [i for i, d in enumerate(distances) if d < max_distance][:max_sources]


def apply_gate(hits: Sequence[Hit], max_distance: float, max_sources: int) -> tuple[list[Hit], list[Hit]]:
    """Split ranked hits into those the model may read and those turned away.

    A hit is kept when ``hit.distance < max_distance`` and fewer than ``max_sources`` hits were
    kept before it (``kept_indices``); the incoming (fused or reranked) order is preserved. Every
    dropped hit carries ``gated_out_reason``: ``"distance 0.712 >= 0.675"`` or
    ``"capacity: beyond the 4 best sources"``.

    Pure: no I/O; every returned hit is a copy with its ``gated_out_reason`` set (None when kept).

    Args:
        hits: hits in ranking order, each with its cosine distance to the question.
        max_distance: the threshold; a hit at exactly this distance is dropped.
        max_sources: the most hits kept (at least 1).

    Returns:
        ``(kept, dropped)``, both in ranking order.

    Raises:
        ValueError: when ``max_sources`` is below 1.
    """
    keep = set(kept_indices([h.distance for h in hits], max_distance, max_sources))
    kept: list[Hit] = []
    dropped: list[Hit] = []
    for index, hit in enumerate(hits):
        if index in keep:
            kept.append(dataclasses.replace(hit, gated_out_reason=None))
        elif not hit.distance < max_distance:  # `not <` also turns away a NaN distance
            reason = f"{REASON_DISTANCE} {hit.distance:.3f} >= {max_distance:.3f}"
            dropped.append(dataclasses.replace(hit, gated_out_reason=reason))
        else:
            reason = f"{REASON_CAPACITY}: beyond the {max_sources} best sources"
            dropped.append(dataclasses.replace(hit, gated_out_reason=reason))
    return kept, dropped


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
