"""Deterministic test doubles for the model seams (embedder, language model)."""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag.llm import ChatPrompt, Message, TextDelta, format_chat
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


class FakeLLM:
    """A ``rag.llm.LanguageModel`` with canned replies, one token per whitespace word.

    Stop strings are honoured as llama.cpp does (the reply is cut before the first one). Like the
    real adapter it holds its own lock during every stream; ``lock_held_during_call`` records
    whether it was held when each stream started. For the LLM reranker, the next-token
    log-probability of every "yes" spelling is ``judge(prompt)`` and of every other candidate 0
    (log-probabilities up to a shared constant, which the reranker's log-odds cancel).
    """

    model_path = "/models/fake.gguf"
    prompt_style = "example"  # scripted replies are written for the worked-example prompt

    def __init__(
        self,
        *replies: str,
        metadata: dict[str, str] | None = None,
        judge: Callable[[str], float] | None = None,
        split_yes: bool = False,
        n_ctx: int = 8192,
    ) -> None:
        self.replies = list(replies) or [""]
        self.metadata = metadata or {}
        self.judge = judge or (lambda prompt: 0.0)
        self.split_yes = split_yes  # "yes" takes two tokens: the reranker must refuse the model
        self.n_ctx = n_ctx
        self.prompts: list[str] = []  # every text tokenized, in order
        self.calls: list[dict[str, Any]] = []  # keyword arguments of each stream
        self.scored: list[str] = []  # every prompt given to next_token_logprobs
        self.lock = threading.Lock()
        self.lock_held_during_call: list[bool] = []
        self.closed = False
        self.verdict: float | None = None  # log P(yes) - log P(no) of continuation_logprobs; None: no verdict
        self.verdict_asks = 0

    # --- tokenizer
    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = False) -> list[int]:
        self.prompts.append(text)
        if self.split_yes and text.strip().lower() == "yes":
            return [11, 12]
        return ([2] if add_bos else []) + [int.from_bytes(hashlib.blake2b(w.encode(), digest_size=4).digest(),
                                                          "little") % 1000 + 10 for w in text.split()]

    def count_tokens(self, text: str) -> int:
        return len(self.tokenize(text, special=True))

    def context_size(self) -> int:
        return self.n_ctx

    def format_chat(self, messages: Sequence[Message]) -> ChatPrompt:
        return format_chat(messages, template=self.metadata.get("tokenizer.chat_template"), bos_token="<bos>",
                           eos_token="<eos>")

    # --- generation
    def stream(
        self,
        tokens: Sequence[int],
        *,
        max_tokens: int,
        stop: Sequence[str],
        temperature: float = 0.0,
        seed: int = 1337,
        repeat_penalty: float = 1.0,
    ) -> Iterator[TextDelta]:
        with self.lock:
            self.calls.append({"max_tokens": max_tokens, "stop": list(stop), "temperature": temperature,
                               "seed": seed, "repeat_penalty": repeat_penalty})
            self.lock_held_during_call.append(self.lock.locked())
            reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
            for s in stop:
                if s in reply:
                    reply = reply[: reply.index(s)]
            words = reply.split(" ")
            cap = max_tokens or len(words)
            pieces = [w if i == 0 else " " + w for i, w in enumerate(words)][:cap]
            for i, piece in enumerate(pieces):
                last = i == len(pieces) - 1
                yield TextDelta(piece, ("length" if len(words) > cap else "stop") if last else None)

    # --- scoring
    def next_token_logprobs(self, prompt: str, candidates: Sequence[str]) -> dict[str, float]:
        self.scored.append(prompt)
        single = [c for c in candidates if len(self.tokenize(c)) == 1]
        return {c: self.judge(prompt) if c.strip().lower() == "yes" else 0.0 for c in single}

    def continuation_logprobs(self, tokens: Sequence[int], candidates: Sequence[str]) -> dict[str, float]:
        self.verdict_asks += 1
        if self.verdict is None:
            return {}  # no verdict: the decision reads 0 (unknown)
        return {"yes": self.verdict, "no": 0.0}

    def close(self) -> None:
        self.closed = True


class FailingLLM(FakeLLM):
    """Fails the test as soon as anything tries to use the model."""

    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = False) -> list[int]:
        pytest.fail("the language model was used although the gate should have refused")

    def format_chat(self, messages: Sequence[Message]) -> ChatPrompt:
        pytest.fail("the language model was used although the gate should have refused")

    def stream(self, tokens: Sequence[int], **kwargs: Any) -> Iterator[TextDelta]:
        pytest.fail("the language model was called although the gate should have refused")

    def next_token_logprobs(self, prompt: str, candidates: Sequence[str]) -> dict[str, float]:
        pytest.fail("the language model was called although the gate should have refused")


def old_install_models() -> tuple[Path, Path]:
    """``<data dir>/models`` as an install from before the assembled 0.5B was removed leaves it: the
    assembled file (2 MB of filler here) beside its stamped Q4_0 copy (1 MB). Returns (source, copy)."""
    from rag import assets

    asset = assets.QWEN_CODER_05B
    source, copy = assets.asset_path(asset), assets.quantized_path(asset)
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_bytes(b"k" * 2_000_000)
    copy.write_bytes(b"0" * 1_000_000)
    assets._write_stamp(copy, assets._copy_origin(asset))
    return source, copy
