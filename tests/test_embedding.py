"""The int8 ONNX MiniLM: exported locally from the bundled weights, close to fp32, its own model id."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rag.embedding import (
    MINILM_ID,
    MINILM_INT8_ID,
    OnnxEmbedder,
    check_build,
    load_embedder,
    max_tokens_for,
)

TEXTS = [
    "Employees earn annual leave every pay period; sick leave is separate.",
    "Leave > Annual leave\n\nYou can carry over up to 240 hours of annual leave into the next leave year.",
    "lỗi VPN-403 xử lý sao: khởi động lại ứng dụng rồi đăng nhập lại.",
    "x",
    " ".join(["word"] * 400),  # longer than the 256-token window: truncated like sentence-transformers
]


def test_model_ids_and_windows() -> None:
    assert MINILM_INT8_ID != MINILM_ID and MINILM_INT8_ID.startswith(MINILM_ID)
    assert max_tokens_for(MINILM_INT8_ID) == max_tokens_for(MINILM_ID) == 256


@pytest.mark.slow
def test_int8_onnx_is_built_once_and_stays_close_to_fp32(tmp_path: Path, real_embedder) -> None:  # type: ignore[no-untyped-def]
    cache = tmp_path / "models"
    fast = load_embedder("minilm", cache_dir=cache)
    assert isinstance(fast, OnnxEmbedder) and fast.model_id == MINILM_INT8_ID
    assert len(list(cache.rglob("model.onnx"))) == 1
    # the pinned onnx / onnxruntime export the build every README figure was measured with
    assert check_build("all-MiniLM-L6-v2", next(cache.rglob("model.onnx")))
    again = load_embedder(MINILM_INT8_ID, cache_dir=cache)  # cached: no second export
    assert len(list(cache.rglob("*.onnx"))) == 1
    fp32 = load_embedder("minilm-fp32")
    a, b = fast.embed_passages(TEXTS), fp32.embed_passages(TEXTS)
    assert a.shape == b.shape == (len(TEXTS), 384)
    assert np.linalg.norm(a, axis=1) == pytest.approx(1.0, abs=1e-5)
    assert ((a * b).sum(axis=1) >= 0.97).all()
    # a text's vector does not depend on the other texts of the call, nor on their order
    assert np.allclose(again.embed_queries(TEXTS[:2]), a[:2], atol=1e-6)
    assert np.allclose(fast.embed_passages(TEXTS[::-1])[::-1], a, atol=1e-6)
    assert [fast.count_tokens(t) for t in TEXTS] == [fp32.count_tokens(t) for t in TEXTS]
    assert fast.embed_passages([]).shape == (0, 384)


@pytest.mark.slow
def test_parallel_sessions_give_each_text_its_own_vector(tmp_path: Path) -> None:
    cache = tmp_path / "models"
    two = load_embedder("minilm", threads=2, cache_dir=cache)
    one = load_embedder("minilm", threads=1, cache_dir=cache)
    assert isinstance(two, OnnxEmbedder) and isinstance(one, OnnxEmbedder)
    assert (len(two.sessions), len(one.sessions)) == (2, 1)
    texts = TEXTS * 3  # more texts than sessions, of mixed lengths
    alone = np.vstack([one.embed_passages([t]) for t in texts])
    together = two.embed_passages(texts)
    assert together.shape == alone.shape
    assert np.allclose(together, alone, atol=1e-6)  # every row is its own text's vector, in place
    assert not np.allclose(together[0], together[1], atol=1e-3)


def test_a_different_build_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    other = tmp_path / "model.onnx"
    other.write_bytes(b"not the pinned export")
    with caplog.at_level("WARNING", logger="rag.embedding"):
        assert not check_build("all-MiniLM-L6-v2", other)
    assert "different build" in caplog.text and "all-MiniLM-L6-v2" in caplog.text
