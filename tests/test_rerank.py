from __future__ import annotations

import ctypes
import dataclasses
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag.config import Settings
from rag.errors import ModelLoadError
from rag.models import Hit
from rag.rerank import (
    CrossEncoderReranker,
    LlmReranker,
    NoReranker,
    Reranker,
    ScoringReranker,
    fall_back,
    load_reranker,
    order_by_scores,
    rerank_text,
    yes_no_log_odds,
)


def make_hits(*contents: str) -> list[Hit]:
    return [
        Hit(chunk_id=i + 1, document_id=1, source="a.md", title="A", section=f"A > S{i}", content=c, char_from=0,
            char_to=len(c), page=None, distance=0.5, rrf_score=1 / (61 + i))
        for i, c in enumerate(contents)
    ]


class WordOverlap(ScoringReranker):
    name = "overlap"
    batch_size = 2

    def __init__(self, clock: Callable[[], float] | None = None, fail: bool = False, budget_ms: float = 1000.0):
        super().__init__(budget_ms, clock or (lambda: 0.0))
        self.fail = fail
        self.batches: list[int] = []

    def score_batch(self, query: str, passages: Sequence[str]) -> list[float]:
        if self.fail:
            raise RuntimeError("model exploded")
        self.batches.append(len(passages))
        words = set(query.lower().split())
        return [float(len(words & set(p.lower().split()))) for p in passages]


def test_rerank_text_is_section_and_content() -> None:
    hit = make_hits("Body text.")[0]
    assert rerank_text(hit) == "A > S0\n\nBody text."
    assert rerank_text(dataclasses.replace(hit, section="")) == "Body text."


def test_order_by_scores_sorts_and_keeps_ties_in_incoming_order() -> None:
    hits = make_hits("a", "b", "c", "d")
    ranked = order_by_scores(hits, [0.5, 2.0, 0.5, -1.0])
    assert [h.chunk_id for h in ranked] == [2, 1, 3, 4]
    assert [h.rerank_score for h in ranked] == [2.0, 0.5, 0.5, -1.0]
    with pytest.raises(ValueError):
        order_by_scores(hits, [1.0])


def test_no_reranker_keeps_order() -> None:
    hits = make_hits("a", "b")
    assert NoReranker().rank("q", hits) == hits
    assert isinstance(NoReranker(), Reranker)


def test_scoring_reranker_reorders_in_batches() -> None:
    hits = make_hits("nothing here", "annual leave per pay period", "leave", "pay")
    reranker = WordOverlap()
    ranked = reranker.rank("annual leave pay", hits)
    assert [h.chunk_id for h in ranked] == [2, 3, 4, 1]
    assert [h.rerank_score for h in ranked] == [3.0, 1.0, 1.0, 0.0]
    assert all(h.rerank_fallback is None for h in ranked)
    assert reranker.batches == [2, 2]
    assert reranker.rank("q", []) == []


def test_timeout_falls_back_to_incoming_order_with_the_reason() -> None:
    ticks = iter(range(0, 100, 3))  # seconds: 0, 3, 6, ...: the second batch starts past a 4 s budget
    hits = make_hits("x", "leave", "pay leave")
    reranker = WordOverlap(clock=lambda: float(next(ticks)), budget_ms=4000.0)
    ranked = reranker.rank("pay leave", hits)
    assert [h.chunk_id for h in ranked] == [1, 2, 3]
    assert all(h.rerank_score is None for h in ranked)
    assert ranked[0].rerank_fallback is not None and ranked[0].rerank_fallback.startswith("timeout")
    assert "scored 2 of 3" in ranked[0].rerank_fallback
    assert reranker.batches == [2]


def test_error_falls_back_to_incoming_order_with_the_reason() -> None:
    hits = make_hits("x", "leave")
    ranked = WordOverlap(fail=True).rank("leave", hits)
    assert [h.chunk_id for h in ranked] == [1, 2]
    assert all(h.rerank_fallback == "error: RuntimeError: model exploded" for h in ranked)


def test_nan_scores_fall_back() -> None:
    class Nan(WordOverlap):
        def score_batch(self, query: str, passages: Sequence[str]) -> list[float]:
            return [math.nan] * len(passages)

    ranked = Nan().rank("q", make_hits("a", "b"))
    assert ranked[0].rerank_fallback is not None and ranked[0].rerank_fallback.startswith("error")


def test_fall_back_clears_scores() -> None:
    hit = dataclasses.replace(make_hits("a")[0], rerank_score=3.0)
    assert fall_back([hit], "why")[0] == dataclasses.replace(hit, rerank_score=None, rerank_fallback="why")


def test_yes_no_log_odds_by_hand() -> None:
    logits = np.array([2.0, 0.0, 1.0, -1.0])
    # log(e^2 + e^0) - log(e^1) = log(e + e^-1)
    assert yes_no_log_odds(logits, [0, 1], [2]) == pytest.approx(math.log(math.e + 1 / math.e))
    assert yes_no_log_odds(logits, [2], [2]) == 0.0


# ---------------------------------------------------------------------------------------------
# LlmReranker against a fake llama-cpp model


class FakeLlama:
    """Word-level tokenizer and a KV "cache" of token ids; the logit of every yes-spelling is judge(text)."""

    VOCAB = ("<bos>", "yes", "Yes", "YES", "no", "No", "NO")

    def __init__(self, judge: Callable[[str], float], split_yes: bool = False) -> None:
        self.judge = judge
        self.split_yes = split_yes
        self.words: list[str] = list(self.VOCAB)
        self.input_ids = np.zeros(4096, dtype=np.intc)
        self.n_tokens = 0
        self.evaluated = 0
        self._buffer = (ctypes.c_float * 4096)()
        self._ctx = self

    def _id(self, word: str) -> int:
        if word not in self.words:
            self.words.append(word)
        return self.words.index(word)

    def tokenize(self, data: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        text = data.decode()
        if self.split_yes and text.strip().lower() == "yes":
            return [self._id("y"), self._id("es")]
        return ([0] if add_bos else []) + [self._id(w) for w in text.split()]

    def n_ctx(self) -> int:
        return 4096

    def n_vocab(self) -> int:
        return 4096

    def reset(self) -> None:
        self.n_tokens = 0

    def eval(self, tokens: Sequence[int]) -> None:
        self.input_ids[self.n_tokens : self.n_tokens + len(tokens)] = tokens
        self.n_tokens += len(tokens)
        self.evaluated += len(tokens)
        text = " ".join(self.words[i] for i in self.input_ids[: self.n_tokens])
        for i in range(4096):
            self._buffer[i] = 0.0
        for word in ("yes", "Yes", "YES"):
            self._buffer[self.words.index(word)] = self.judge(text)

    def get_logits_ith(self, i: int) -> Any:
        assert i == -1
        return ctypes.cast(self._buffer, ctypes.POINTER(ctypes.c_float))


def passage_of(prompt: str) -> str:
    return prompt.split("Passage:")[1].split("Does the passage")[0]


def test_llm_reranker_scores_by_yes_no_log_odds() -> None:
    llm = FakeLlama(lambda text: 3.0 if "twelve" in passage_of(text) else -1.0)
    hits = make_hits("Sign commits with gpg.", "You must work twelve weeks after leave.", "Parking is free.")
    ranked = LlmReranker(llm).rank("how long must I stay after parental leave", hits)
    assert [h.chunk_id for h in ranked] == [2, 1, 3]
    assert ranked[0].rerank_score == pytest.approx(3.0)  # three yes and three no spellings: the counts cancel
    assert ranked[1].rerank_score == pytest.approx(-1.0)


def test_llm_prompt_uses_gemma_turns_with_the_question_first() -> None:
    reranker = LlmReranker(FakeLlama(lambda text: 0.0))
    prompt = reranker.prompt("  Q?  ", "the passage")
    assert prompt.startswith("<start_of_turn>user\nQuestion: Q?\n\nPassage:\nthe passage\n\n")
    assert prompt.endswith("<end_of_turn>\n<start_of_turn>model\n")


def test_llm_reranker_scores_each_passage_from_an_empty_context() -> None:
    llm = FakeLlama(lambda text: float(len(text.split())))  # sees the whole context, not only the prompt
    reranker = LlmReranker(llm)
    hits = make_hits("one two three", "one two", "one")
    ranked = reranker.rank("a question", hits)
    assert [h.chunk_id for h in ranked] == [1, 2, 3]
    alone = LlmReranker(llm).rank("a question", hits[1:2])
    assert alone[0].rerank_score == ranked[1].rerank_score  # no state carried over from the passage before
    assert llm.evaluated == sum(len(llm.tokenize(reranker.prompt("a question", rerank_text(h)).encode()))
                                for h in [*hits, hits[1]])


def test_llm_reranker_holds_the_lock() -> None:
    entered: list[str] = []

    class Lock:
        def __enter__(self) -> None:
            entered.append("in")

        def __exit__(self, *exc: object) -> None:
            entered.append("out")

    LlmReranker(FakeLlama(lambda text: 0.0), lock=Lock()).rank("q", make_hits("a", "b"))
    assert entered == ["in", "out", "in", "out"]


def test_llm_without_single_token_yes_is_refused() -> None:
    with pytest.raises(ModelLoadError):
        LlmReranker(FakeLlama(lambda text: 0.0, split_yes=True))


# ---------------------------------------------------------------------------------------------
# load_reranker


def test_load_reranker_none(settings: Settings) -> None:
    assert isinstance(load_reranker(settings), NoReranker)


def test_load_reranker_llm_uses_the_loader(settings: Settings) -> None:
    calls: list[tuple[Any, ...]] = []

    def loader(*args: Any) -> FakeLlama:
        calls.append(args)
        return FakeLlama(lambda text: 0.0)

    lock = threading.Lock()
    reranker = load_reranker(settings.replace(rerank="llm", rerank_budget_ms=123.0), llm_loader=loader, lock=lock)
    assert isinstance(reranker, LlmReranker) and reranker.budget_ms == 123.0 and reranker.lock is lock
    assert calls == [(settings.llm_path, settings.n_ctx, settings.threads, settings.seed)]


def test_load_reranker_cross_encoder_needs_a_directory(settings: Settings, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="rerank_model"):
        load_reranker(settings.replace(rerank="cross-encoder"))
    with pytest.raises(ModelLoadError, match="no cross-encoder directory"):
        load_reranker(settings.replace(rerank="cross-encoder", rerank_model=str(tmp_path / "missing")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="cannot load"):
        load_reranker(settings.replace(rerank="cross-encoder", rerank_model=str(tmp_path / "empty")))


def test_load_reranker_unknown_name_lists_the_choices(settings: Settings) -> None:
    with pytest.raises(ValueError, match="none, cross-encoder, llm"):
        load_reranker(dataclasses.replace(settings, rerank="colbert"))


# ---------------------------------------------------------------------------------------------
# CrossEncoderReranker with a tiny model built here (nothing can be downloaded)


@pytest.fixture(scope="module")
def tiny_cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    directory = tmp_path_factory.mktemp("tiny-ce")
    words = ["annual", "leave", "pay", "period", "how", "much", "do", "i", "get", "sign", "commits", "with", "gpg",
             "parking", "is", "free"]
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ">", *words]
    tokenizer = BertTokenizer(vocab={token: i for i, token in enumerate(tokens)})
    assert tokenizer.tokenize("annual leave") == ["annual", "leave"]
    config = BertConfig(vocab_size=len(tokens), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64, num_labels=1,
                        initializer_range=0.5)  # large random weights, so that passages get distinct scores
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    yield directory


def test_cross_encoder_loads_from_a_local_directory_and_ranks(settings: Settings, tiny_cross_encoder: Path) -> None:
    from sentence_transformers import CrossEncoder

    reranker = load_reranker(settings.replace(rerank="cross-encoder", rerank_model=str(tiny_cross_encoder)))
    assert isinstance(reranker, CrossEncoderReranker)
    reranker.batch_size = 2
    hits = make_hits("annual leave per pay period", "sign commits with gpg", "parking is free", "how much pay")
    ranked = reranker.rank("how much annual leave do i get", hits)
    assert sorted(h.chunk_id for h in ranked) == [1, 2, 3, 4]
    reference = CrossEncoder(str(tiny_cross_encoder), device="cpu", local_files_only=True).predict(
        [("how much annual leave do i get", rerank_text(h)) for h in hits])
    expected = {h.chunk_id: float(s) for h, s in zip(hits, np.asarray(reference).reshape(-1), strict=True)}
    assert {h.chunk_id: h.rerank_score for h in ranked} == pytest.approx(expected, abs=1e-5)
    scores = [h.rerank_score for h in ranked]
    assert scores == sorted(scores, reverse=True)  # type: ignore[type-var]
    assert len(set(scores)) == 4  # random weights still separate the passages, so the order is a real sort


# ---------------------------------------------------------------------------------------------
# The bundled GGUF


@pytest.fixture(scope="module")
def gemma() -> Any:
    from rag.generate import load_llm

    return load_llm("", n_ctx=1024, threads=0, seed=1337)


@pytest.mark.slow
def test_llm_reranker_on_the_bundled_gguf(gemma: Any) -> None:
    reranker = LlmReranker(gemma)
    turn = gemma.tokenize(b"<start_of_turn>", add_bos=False, special=True)
    assert len(turn) == 1  # the turn markers are special tokens, not text
    first = reranker.next_token_logits(reranker.prompt("how much annual leave", "Employees earn leave."))
    second = reranker.next_token_logits(reranker.prompt("how much annual leave", "Sign commits with gpg."))
    again = reranker.next_token_logits(reranker.prompt("how much annual leave", "Sign commits with gpg."))
    assert np.array_equal(second, again)  # reproducible, whatever was scored before
    assert not np.allclose(first, second)
    ranked = reranker.rank("how much annual leave", make_hits("Employees earn leave.", "Sign commits with gpg."))
    assert all(h.rerank_fallback is None and math.isfinite(h.rerank_score or math.nan) for h in ranked)
