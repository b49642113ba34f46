from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag.config import Settings
from rag.errors import ModelLoadError
from rag.records import Hit
from rag.rerank import (
    CrossEncoderReranker,
    LlmReranker,
    NoReranker,
    Reranker,
    ScoringReranker,
    fall_back,
    load_reranker,
    order_by_scores,
    rerank_hits,
    rerank_text,
    yes_no_log_odds,
)

from .fakes import FakeLLM


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
    # log(e^2 + e^0) - log(e^1) = log(e + e^-1)
    assert yes_no_log_odds([2.0, 0.0], [1.0]) == pytest.approx(math.log(math.e + 1 / math.e))
    assert yes_no_log_odds([1.0], [1.0]) == 0.0
    # log-probabilities and raw logits give the same log-odds: the softmax normaliser cancels
    assert yes_no_log_odds([2.0 - 7.5, 0.0 - 7.5], [1.0 - 7.5]) == pytest.approx(yes_no_log_odds([2.0, 0.0], [1.0]))


# ---------------------------------------------------------------------------------------------
# LlmReranker against a fake LanguageModel


def passage_of(prompt: str) -> str:
    return prompt.split("Passage:")[1].split("Does the passage")[0]


def test_llm_reranker_scores_by_yes_no_log_odds() -> None:
    llm = FakeLLM(judge=lambda text: 3.0 if "twelve" in passage_of(text) else -1.0)
    hits = make_hits("Sign commits with gpg.", "You must work twelve weeks after leave.", "Parking is free.")
    ranked = LlmReranker(llm).rank("how long must I stay after parental leave", hits)
    assert [h.chunk_id for h in ranked] == [2, 1, 3]
    assert ranked[0].rerank_score == pytest.approx(3.0)  # three yes and three no spellings: the counts cancel
    assert ranked[1].rerank_score == pytest.approx(-1.0)


def test_llm_prompt_uses_gemma_turns_with_the_question_first() -> None:
    reranker = LlmReranker(FakeLLM())
    prompt = reranker.prompt("  Q?  ", "the passage")
    assert prompt.startswith("<start_of_turn>user\nQuestion: Q?\n\nPassage:\nthe passage\n\n")
    assert prompt.endswith("<end_of_turn>\n<start_of_turn>model\n")


def test_llm_reranker_asks_the_model_once_per_passage_with_one_spelling_per_token() -> None:
    llm = FakeLLM()
    reranker = LlmReranker(llm)
    # " yes" is the same word token as "yes" for the fake: counted once, not twice
    assert reranker.yes_words == ["yes", "Yes", "YES"] and reranker.no_words == ["no", "No", "NO"]
    hits = make_hits("one two three", "one two", "one")
    reranker.rank("a question", hits)
    assert llm.scored == [reranker.prompt("a question", rerank_text(h)) for h in hits]


def test_llm_reranker_falls_back_when_the_model_fails() -> None:
    class Broken(FakeLLM):
        def next_token_logprobs(self, prompt: str, candidates: Sequence[str]) -> dict[str, float]:
            raise RuntimeError("decode failed")

    ranked = LlmReranker(Broken()).rank("q", make_hits("a", "b"))
    assert [h.chunk_id for h in ranked] == [1, 2]
    assert all(h.rerank_fallback == "error: RuntimeError: decode failed" for h in ranked)


def test_llm_without_single_token_yes_is_refused() -> None:
    with pytest.raises(ModelLoadError):
        LlmReranker(FakeLLM(split_yes=True))


# ---------------------------------------------------------------------------------------------
# load_reranker


def test_load_reranker_none(settings: Settings) -> None:
    assert isinstance(load_reranker(settings), NoReranker)


def test_load_reranker_llm_uses_the_loader(settings: Settings) -> None:
    calls: list[tuple[Any, ...]] = []
    model = FakeLLM()

    def loader(*args: Any) -> FakeLLM:
        calls.append(args)
        return model

    reranker = load_reranker(settings.replace(rerank="llm", rerank_budget_ms=123.0), llm_loader=loader)
    assert isinstance(reranker, LlmReranker) and reranker.budget_ms == 123.0 and reranker.llm is model
    assert calls == [(settings.llm_path, settings.n_ctx, settings.threads, settings.seed)]


# ---------------------------------------------------------------------------------------------
# rerank_hits: the one rerank stage


def test_rerank_hits_reranks_the_top_depth_and_keeps_the_rest_in_rrf_order(settings: Settings) -> None:
    hits = make_hits("x", "pay", "pay leave", "leave", "annual leave pay", "pay")
    reranker = WordOverlap()
    out = rerank_hits("annual leave pay", hits, settings=settings.replace(rerank_depth=4, top_k=5), reranker=reranker)
    assert [h.chunk_id for h in out] == [3, 2, 4, 1, 5]  # the first 4 reranked, then RRF order, cut to top_k
    assert reranker.batches == [2, 2]
    assert [h.chunk_id for h in rerank_hits("q", hits, settings=settings, reranker=reranker, k=2)] == [1, 2]


def test_rerank_hits_falls_back_to_rrf_order_past_the_budget(settings: Settings) -> None:
    ticks = iter(range(0, 100, 3))
    hits = make_hits("x", "leave", "pay leave")
    reranker = WordOverlap(clock=lambda: float(next(ticks)), budget_ms=4000.0)
    out = rerank_hits("pay leave", hits, settings=settings.replace(rerank_depth=3, top_k=3), reranker=reranker)
    assert [h.chunk_id for h in out] == [1, 2, 3]
    assert all(h.rerank_fallback and h.rerank_fallback.startswith("timeout") for h in out)


def test_rerank_hits_builds_the_settings_reranker_when_none_is_given(settings: Settings) -> None:
    hits = make_hits("a", "b", "c")
    assert rerank_hits("q", hits, settings=settings.replace(rerank="none", top_k=2)) == hits[:2]
    model = FakeLLM(judge=lambda text: 1.0 if "c" in passage_of(text) else 0.0)
    out = rerank_hits("q", hits, settings=settings.replace(rerank="llm", top_k=3), llm_loader=lambda *_: model)
    assert [h.chunk_id for h in out] == [3, 1, 2]


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


@pytest.mark.slow
def test_llm_reranker_on_the_bundled_gguf(real_llm: Any) -> None:
    reranker = LlmReranker(real_llm)
    turn = real_llm.tokenize("<start_of_turn>", add_bos=False, special=True)
    assert len(turn) == 1  # the turn markers are special tokens, not text
    ranked = reranker.rank("how much annual leave", make_hits("Employees earn leave.", "Sign commits with gpg."))
    assert all(h.rerank_fallback is None and math.isfinite(h.rerank_score or math.nan) for h in ranked)
    again = reranker.rank("how much annual leave", make_hits("Employees earn leave.", "Sign commits with gpg."))
    assert [h.rerank_score for h in again] == [h.rerank_score for h in ranked]  # reproducible
