"""Rerank stage: re-score the fused hits with a model that reads question and passage together.

``Reranker.rank(query, hits) -> hits`` is the one seam. Model rerankers score in small batches
against a time budget; when the budget runs out or the model fails, the incoming (RRF) order
stands and every hit records why in ``rerank_fallback``, so the page can say "not reranked".

The budget is checked between batches (cooperatively) rather than by abandoning a worker
thread: a language model must never be called from two threads at once, and a stray thread would
keep a CPU core busy after the answer has gone out. A single batch can therefore overrun the budget
by its own duration (one passage for the LLM, ``batch_size`` passages for the cross-encoder).

Implementations: ``NoReranker``; ``CrossEncoderReranker`` (a sentence-transformers CrossEncoder
from a local directory); ``LlmReranker`` (pointwise yes/no log-odds from a ``rag.llm``
``LanguageModel``). ``load_reranker(settings)`` picks one by ``settings.rerank``.

``rerank_hits`` is the rerank stage itself, the one place that applies a reranker to fused hits:
retrieval's "rerank" stage and ``ask`` both call it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from rag.config import Settings
from rag.errors import ModelLoadError
from rag.llm import LanguageModel, load_language_model
from rag.records import Hit

log = logging.getLogger(__name__)

RERANKERS = ("none", "cross-encoder", "llm")
MAX_PASSAGE_CHARS = 2000  # a passage longer than this is cut for the reranker (chunks are shorter)

Clock = Callable[[], float]


def rerank_text(hit: Hit) -> str:
    """What a reranker reads for a hit: the section path and the chunk content, as the reader sees them."""
    text = f"{hit.section}\n\n{hit.content}" if hit.section else hit.content
    return text[:MAX_PASSAGE_CHARS]


def order_by_scores(hits: Sequence[Hit], scores: Sequence[float]) -> list[Hit]:
    """Hits sorted by score, highest first, each carrying its ``rerank_score``; ties keep the incoming order."""
    if len(scores) != len(hits):
        raise ValueError(f"{len(scores)} scores for {len(hits)} hits")
    values = [float(s) for s in scores]
    order = sorted(range(len(hits)), key=lambda i: -values[i])  # stable: ties keep the incoming order
    return [dataclasses.replace(hits[i], rerank_score=values[i], rerank_fallback=None) for i in order]


def fall_back(hits: Sequence[Hit], reason: str) -> list[Hit]:
    """The incoming order, unscored, with the reason on every hit."""
    return [dataclasses.replace(h, rerank_score=None, rerank_fallback=reason) for h in hits]


@runtime_checkable
class Reranker(Protocol):
    name: str

    def rank(self, query: str, hits: Sequence[Hit]) -> list[Hit]:
        """The same hits, best first, with ``rerank_score`` set (or the incoming order with
        ``rerank_fallback`` set when the budget ran out or the model failed)."""
        ...


class NoReranker:
    """Keeps the fused order."""

    name = "none"

    def rank(self, query: str, hits: Sequence[Hit]) -> list[Hit]:
        return list(hits)


class ScoringReranker(ABC):
    """A model reranker: subclasses implement ``score_batch``; this class adds budget and fallback."""

    name = "model"
    batch_size = 8

    def __init__(self, budget_ms: float = 4000.0, clock: Clock = time.monotonic) -> None:
        self.budget_ms = budget_ms
        self.clock = clock

    @abstractmethod
    def score_batch(self, query: str, passages: Sequence[str]) -> list[float]:
        """One relevance score per passage (higher is more relevant)."""

    def rank(self, query: str, hits: Sequence[Hit]) -> list[Hit]:
        if not hits:
            return []
        started = self.clock()
        passages = [rerank_text(h) for h in hits]
        scores: list[float] = []
        try:
            for i in range(0, len(passages), self.batch_size):
                elapsed_ms = (self.clock() - started) * 1000.0
                if elapsed_ms > self.budget_ms:
                    reason = (
                        f"timeout: {self.name} reranker scored {i} of {len(hits)} passages in "
                        f"{elapsed_ms:.0f} ms (budget {self.budget_ms:.0f} ms)"
                    )
                    log.warning("rerank fell back to the fused order: %s", reason)
                    return fall_back(hits, reason)
                scores.extend(float(s) for s in self.score_batch(query, passages[i : i + self.batch_size]))
            if len(scores) != len(hits) or not all(np.isfinite(scores)):
                raise ValueError(f"the model returned {len(scores)} scores for {len(hits)} passages, or a NaN")
        except Exception as e:  # the stage degrades to the fused order instead of failing the question
            reason = f"error: {type(e).__name__}: {e}"
            log.warning("rerank fell back to the fused order: %s", reason, exc_info=True)
            return fall_back(hits, reason)
        return order_by_scores(hits, scores)


class CrossEncoderReranker(ScoringReranker):
    """A sentence-transformers ``CrossEncoder`` loaded from a local directory (nothing is downloaded)."""

    name = "cross-encoder"

    def __init__(
        self, path: str | Path, *, budget_ms: float = 4000.0, batch_size: int = 8, clock: Clock = time.monotonic
    ) -> None:
        super().__init__(budget_ms, clock)
        self.batch_size = batch_size
        directory = Path(path).expanduser()
        if not directory.is_dir():
            raise ModelLoadError(
                f"no cross-encoder directory at {directory}: set rerank_model to a local directory saved "
                "with CrossEncoder.save_pretrained (models cannot be downloaded here)"
            )
        from sentence_transformers import CrossEncoder

        try:
            self.model: Any = CrossEncoder(str(directory), device="cpu", local_files_only=True)
        except Exception as e:  # the library raises many types for a bad directory
            raise ModelLoadError(f"cannot load the cross-encoder in {directory}: {e}") from e
        self.path = directory

    def score_batch(self, query: str, passages: Sequence[str]) -> list[float]:
        scores = self.model.predict(
            [(query, p) for p in passages], batch_size=len(passages), show_progress_bar=False, convert_to_numpy=True
        )
        return [float(s) for s in np.asarray(scores, dtype=np.float64).reshape(len(passages), -1)[:, -1]]


# Gemma's turn format, written out: the bundled GGUF is a base model without a chat template.
LLM_RERANK_PROMPT = (
    "<start_of_turn>user\n"
    "Question: {question}\n\n"
    "Passage:\n{passage}\n\n"
    "Does the passage answer the question? Answer yes or no.<end_of_turn>\n"
    "<start_of_turn>model\n"
)
YES_WORDS = ("yes", "Yes", "YES", " yes", " Yes")
NO_WORDS = ("no", "No", "NO", " no", " No")


def yes_no_log_odds(yes_logprobs: Sequence[float], no_logprobs: Sequence[float]) -> float:
    """``log P(yes) - log P(no)`` from next-token log-probabilities, each side summed over its
    spellings: logsumexp(yes) - logsumexp(no)."""
    yes = np.asarray(yes_logprobs, dtype=np.float64)
    no = np.asarray(no_logprobs, dtype=np.float64)
    return float(np.logaddexp.reduce(yes) - np.logaddexp.reduce(no))


class LlmReranker(ScoringReranker):
    """Pointwise relevance from a ``LanguageModel``: the log-odds of "yes" over "no" as the next token.

    The model serialises its own calls (``rag.llm``), so a shared model needs no lock here.
    """

    name = "llm"
    batch_size = 1

    def __init__(self, llm: LanguageModel, *, budget_ms: float = 4000.0, clock: Clock = time.monotonic) -> None:
        super().__init__(budget_ms, clock)
        self.llm = llm
        self.yes_words = self._single_token_words(YES_WORDS)
        self.no_words = self._single_token_words(NO_WORDS)
        if not self.yes_words or not self.no_words:
            raise ModelLoadError("the language model has no single-token 'yes'/'no'; it cannot rerank")

    def _single_token_words(self, words: Sequence[str]) -> list[str]:
        """The spellings that are one token each, one spelling per token (none counted twice)."""
        kept: list[str] = []
        seen: set[int] = set()
        for word in words:
            tokens = self.llm.tokenize(word, add_bos=False, special=False)
            if len(tokens) == 1 and tokens[0] not in seen:
                seen.add(tokens[0])
                kept.append(word)
        return kept

    def prompt(self, query: str, passage: str) -> str:
        return LLM_RERANK_PROMPT.format(question=query.strip(), passage=passage.strip())

    def score_batch(self, query: str, passages: Sequence[str]) -> list[float]:
        scores = []
        for passage in passages:
            logprobs = self.llm.next_token_logprobs(self.prompt(query, passage), [*self.yes_words, *self.no_words])
            scores.append(yes_no_log_odds([logprobs[w] for w in self.yes_words], [logprobs[w] for w in self.no_words]))
        return scores


LlmLoader = Callable[[str, int, int, int], LanguageModel]  # (path, n_ctx, threads, seed), as load_language_model


def load_reranker(settings: Settings, llm_loader: LlmLoader | None = None) -> Reranker:
    """The reranker named by ``settings.rerank``: "none", "cross-encoder" (``settings.rerank_model``
    is its directory) or "llm" (the generation GGUF, built by ``llm_loader``; pass a cached loader
    to share the model with generation)."""
    choice = settings.rerank
    if choice == "none":
        return NoReranker()
    if choice == "cross-encoder":
        if not settings.rerank_model:
            raise ModelLoadError(
                "rerank = 'cross-encoder' needs rerank_model: the local directory of a sentence-transformers "
                "CrossEncoder (or set rerank = 'none')"
            )
        return CrossEncoderReranker(settings.rerank_model, budget_ms=settings.rerank_budget_ms)
    if choice == "llm":
        loader = llm_loader or load_language_model
        llm = loader(settings.llm_path, settings.n_ctx, settings.threads, settings.seed)
        return LlmReranker(llm, budget_ms=settings.rerank_budget_ms)
    raise ValueError(f"unknown reranker {choice!r}; choose one of {', '.join(RERANKERS)}")


def rerank_hits(
    query: str,
    hits: Sequence[Hit],
    *,
    settings: Settings,
    reranker: Reranker | None = None,
    k: int | None = None,
    llm_loader: LlmLoader | None = None,
) -> list[Hit]:
    """The rerank stage: the first ``settings.rerank_depth`` fused hits reordered, the rest after
    them in fused order, cut to ``k`` (default ``settings.top_k``).

    Args:
        query: the checked question text.
        hits: fused hits, best first.
        settings: ``rerank_depth`` and ``top_k``, and the reranker to build when none is given.
        reranker: used whenever given; None builds ``load_reranker(settings, llm_loader)``.
        k: how many hits to return.
        llm_loader: builds the model of an LLM reranker (pass a cached one to share it).

    A model reranker that runs out of its time budget or fails keeps the fused order of the hits it
    was given, each with ``rerank_fallback`` saying why (``ScoringReranker.rank``).
    """
    if reranker is None:
        reranker = load_reranker(settings, llm_loader)
    depth = settings.rerank_depth
    return (reranker.rank(query, hits[:depth]) + list(hits[depth:]))[: settings.top_k if k is None else k]
