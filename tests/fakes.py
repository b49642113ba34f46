"""Deterministic test doubles for the model seams (embedder, LLM)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np

from rag.text import fold

_WORD = re.compile(r"\w+")


class FakeEmbedder:
    """Feature-hashed bag of folded words: texts sharing words get close vectors.

    Tokens are whitespace words; the window is small so truncation paths get exercised.
    """

    model_id = "fake/hash-bow-64"
    dimension = 64
    max_tokens = 256

    def __init__(self, model_id: str | None = None, dimension: int = 64) -> None:
        if model_id:
            self.model_id = model_id
        self.dimension = dimension
        self.calls = 0

    def _vector(self, text: str) -> np.ndarray:
        v = np.zeros(self.dimension, dtype=np.float32)
        for word in _WORD.findall(fold(text)):
            h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
            v[h % self.dimension] += 1.0 if (h >> 32) & 1 else -1.0
        norm = float(np.linalg.norm(v))
        if norm == 0:
            v[0] = 1.0
            norm = 1.0
        return v / norm

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        return np.stack([self._vector(t) for t in texts]) if texts else np.zeros((0, self.dimension), np.float32)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed_passages(texts)

    def count_tokens(self, text: str) -> int:
        return len(text.split()) + 2
