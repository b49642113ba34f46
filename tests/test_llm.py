"""The language-model seam: the protocol, chat formats, and the llama-cpp adapter (real Gemma: slow)."""

from __future__ import annotations

import itertools
import math
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from rag.errors import ModelLoadError
from rag.llm import (
    GEMMA_STOP,
    GEMMA_TURNS,
    PREFILL_BLOCK,
    PREFIX_BLOCK,
    PREFIX_SPAN,
    LanguageModel,
    LlamaCppModel,
    TurnFormat,
    _openmp_waits,
    format_chat,
    load_language_model,
    prefill_blocks,
)

from .fakes import FailingLLM, FakeLLM

MESSAGES = [
    {"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"}
]
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


# --- the protocol


def test_the_fakes_satisfy_the_protocol() -> None:
    assert isinstance(FakeLLM(), LanguageModel)
    assert isinstance(FailingLLM(), LanguageModel)

    class NotAModel:
        model_path = ""

        def tokenize(self, text: str) -> list[int]:
            return []

    assert not isinstance(NotAModel(), LanguageModel)



# --- chat formats


def test_gemma_turn_format() -> None:
    assert GEMMA_TURNS.render(MESSAGES) == (
        "<start_of_turn>user\nQ1<end_of_turn>\n<start_of_turn>model\nA1<end_of_turn>\n"
        "<start_of_turn>user\nQ2<end_of_turn>\n<start_of_turn>model\n"
    )


def test_no_template_gets_the_turn_format_with_bos_added() -> None:
    chat = format_chat(MESSAGES, template=None, bos_token="<bos>", eos_token="<eos>")
    assert (chat.chat_format, chat.add_bos, chat.stop, chat.note) == ("gemma-turns", True, GEMMA_STOP, "")
    other = TurnFormat("chatml", "<|im_start|>user\n", "<|im_start|>assistant\n", "<|im_end|>\n", ("<|im_end|>",))
    chat = format_chat(MESSAGES[:1], template=None, bos_token="", eos_token="", turns=other)
    assert chat.text == "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\n" and chat.chat_format == "chatml"


def test_a_gguf_template_writes_its_own_bos_and_keeps_the_family_stops() -> None:
    chat = format_chat(MESSAGES[:1], template=TEMPLATE, bos_token="<bos>", eos_token="<eos>")
    assert chat.text == "<bos><|user|>Q1<|end|><|assistant|>"
    assert chat.chat_format == "gguf-template" and chat.add_bos is False
    assert chat.stop[0] == "<eos>" and set(GEMMA_STOP) <= set(chat.stop)


def test_a_failing_template_falls_back_with_a_note() -> None:
    chat = format_chat(MESSAGES[:1], template="{{ raise_exception('no assistant turns') }}", bos_token="",
                       eos_token="")
    assert chat.chat_format == "gemma-turns" and "no assistant turns" in chat.note and "Gemma turns" in chat.note


# --- the adapter around a stand-in for llama_cpp.Llama's public methods (no native library)


class StubLlama:
    """``tokenize``, ``n_ctx``, ``create_completion`` and ``close`` of ``llama_cpp.Llama``."""

    model_path = "/models/stub.gguf"

    def __init__(self) -> None:
        self.metadata: dict[str, str] = {}
        self.adapter: LlamaCppModel | None = None
        self.held: list[bool] = []
        self.closed = False
        self.input_ids = [0] * 512  # the KV cache's tokens: positions [0, n_tokens) are valid
        self.n_tokens = 0
        self.evals: list[tuple[int, int]] = []  # (first position, batch size) of every eval()

    def reset(self) -> None:
        self.n_tokens = 0

    def eval(self, tokens: Sequence[int]) -> None:
        self.evals.append((self.n_tokens, len(tokens)))
        self.input_ids[self.n_tokens : self.n_tokens + len(tokens)] = list(tokens)
        self.n_tokens += len(tokens)

    def n_ctx(self) -> int:
        return 512

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        return ([2] if add_bos else []) + list(range(10, 10 + len(text.split())))

    def create_completion(self, prompt: list[int], **kwargs: Any) -> Iterator[dict[str, Any]]:
        assert self.adapter is not None
        self.kwargs = kwargs
        for i, word in enumerate(["a", " b", " c"]):
            self.held.append(self.adapter.lock.locked())
            yield {"choices": [{"text": word, "finish_reason": "stop" if i == 2 else None}]}

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def stub() -> tuple[StubLlama, LlamaCppModel]:
    llama = StubLlama()
    model = LlamaCppModel(llama)
    llama.adapter = model
    return llama, model


def test_the_adapter_satisfies_the_protocol(stub: tuple[StubLlama, LlamaCppModel]) -> None:
    _, model = stub
    assert isinstance(model, LanguageModel)
    assert model.model_path == "/models/stub.gguf" and model.context_size() == 512 and model.chat_template is None
    assert model.tokenize("a b", add_bos=True) == [2, 10, 11] and model.count_tokens("a b c") == 3


def test_the_adapter_holds_its_lock_for_the_whole_stream(stub: tuple[StubLlama, LlamaCppModel]) -> None:
    llama, model = stub
    deltas = list(model.stream([2, 10], max_tokens=3, stop=["\n\n"], seed=7))
    assert [d.text for d in deltas] == ["a", " b", " c"] and [d.finish for d in deltas] == [None, None, "stop"]
    assert llama.held == [True, True, True] and not model.lock.locked()
    assert llama.kwargs == {"max_tokens": 3, "temperature": 0.0, "seed": 7, "stop": ["\n\n"], "repeat_penalty": 1.0,
                            "stream": True}


def test_a_closed_stream_releases_the_lock_and_another_thread_waits_for_it(
    stub: tuple[StubLlama, LlamaCppModel],
) -> None:
    _, model = stub
    stream = model.stream([2], max_tokens=3, stop=[])
    next(stream)
    waited: list[float] = []
    other = threading.Thread(target=lambda: waited.append(model.count_tokens("x y")))
    other.start()
    other.join(timeout=0.2)
    assert other.is_alive()  # blocked: the stream holds the model
    stream.close()
    other.join(timeout=5)
    assert waited == [2] and not model.lock.locked()


def test_calling_the_model_from_inside_its_own_stream_is_an_error_not_a_deadlock(
    stub: tuple[StubLlama, LlamaCppModel],
) -> None:
    _, model = stub
    stream = model.stream([2], max_tokens=3, stop=[])
    next(stream)
    with pytest.raises(RuntimeError, match="stream"):
        model.tokenize("x")
    stream.close()
    assert model.tokenize("x") == [10]


def test_prefill_blocks_are_fine_over_the_prefix_span_then_coarse() -> None:
    fine = [(i, i + PREFIX_BLOCK) for i in range(0, PREFIX_SPAN, PREFIX_BLOCK)]
    assert prefill_blocks(1) == [] and prefill_blocks(PREFIX_BLOCK) == []
    assert prefill_blocks(PREFIX_BLOCK + 1) == [(0, PREFIX_BLOCK)]
    assert prefill_blocks(PREFIX_SPAN + PREFILL_BLOCK) == fine  # a whole block needs one token after it
    assert prefill_blocks(PREFIX_SPAN + PREFILL_BLOCK + 1) == [*fine, (PREFIX_SPAN, PREFIX_SPAN + PREFILL_BLOCK)]
    for length in range(1, 700):
        blocks = prefill_blocks(length)
        end = blocks[-1][1] if blocks else 0
        assert all(a[1] == b[0] for a, b in itertools.pairwise(blocks)) and (not blocks or blocks[0][0] == 0)
        assert 1 <= length - end <= (PREFIX_BLOCK if end < PREFIX_SPAN else PREFILL_BLOCK)
        assert blocks == prefill_blocks(length + 1)[: len(blocks)]  # a longer prompt: the same cuts


def test_prompts_are_evaluated_in_the_same_aligned_blocks_whatever_the_cache_holds(
    stub: tuple[StubLlama, LlamaCppModel],
) -> None:
    llama, model = stub
    prompt = list(range(100, 100 + PREFIX_SPAN + 2 * PREFILL_BLOCK + 5))  # 2 coarse blocks after the fine ones
    every = [(start, end - start) for start, end in prefill_blocks(len(prompt))]
    assert len(every) == PREFIX_SPAN // PREFIX_BLOCK + 2
    list(model.stream(prompt, max_tokens=3, stop=[]))
    assert llama.evals == every and llama.n_tokens == PREFIX_SPAN + 2 * PREFILL_BLOCK
    llama.evals.clear()
    list(model.stream(prompt, max_tokens=3, stop=[]))  # the same prompt: every block reused
    assert llama.evals == [] and llama.n_tokens == PREFIX_SPAN + 2 * PREFILL_BLOCK
    last = PREFIX_SPAN + PREFILL_BLOCK
    changed = [*prompt[: last + 3], 7, *prompt[last + 4 :]]  # differs inside the last block
    list(model.stream(changed, max_tokens=3, stop=[]))
    assert llama.evals == [(last, PREFILL_BLOCK)]  # every block before it reused
    llama.evals.clear()
    at = 3 * PREFIX_BLOCK + 5  # differs inside the fourth fine block: kept up to it
    list(model.stream([*prompt[:at], 7, *prompt[at + 1 :]], max_tokens=3, stop=[]))
    assert llama.evals == every[3:]
    llama.evals.clear()
    list(model.stream([1, *prompt], max_tokens=3, stop=[]))  # differs at once: evaluated from an empty cache
    assert llama.evals == [(start, end - start) for start, end in prefill_blocks(len(prompt) + 1)]
    llama.evals.clear()
    list(model.stream(prompt[:PREFIX_BLOCK], max_tokens=3, stop=[]))  # one block or less: none evaluated here
    assert llama.evals == [] and llama.n_tokens == 0


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({}, {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "1000"}),  # passive after a short spin
        ({"GOMP_SPINCOUNT": "50"}, {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "50"}),
        # the user's policy wins, and with it libgomp's own spin count
        ({"OMP_WAIT_POLICY": "ACTIVE"}, {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": None}),
        ({"OMP_WAIT_POLICY": "PASSIVE"}, {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None}),
    ],
)
def test_openmp_waits_passively_after_a_short_spin_unless_the_user_chose(
    monkeypatch: pytest.MonkeyPatch, given: dict[str, str], expected: dict[str, str | None]
) -> None:
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    _openmp_waits()
    assert {name: os.environ.get(name) for name in expected} == expected


def test_close_frees_the_model(stub: tuple[StubLlama, LlamaCppModel]) -> None:
    llama, model = stub
    model.close()
    assert llama.closed


def test_a_missing_gguf_is_a_model_load_error(tmp_path: Any) -> None:
    with pytest.raises(ModelLoadError, match="no GGUF model file"):
        load_language_model(str(tmp_path / "missing.gguf"))


# --- the real bundled Gemma-3-270M (slow)


@pytest.mark.slow
def test_bundled_gemma_tokenizes_with_its_own_tokenizer(real_llm: Any) -> None:
    assert isinstance(real_llm, LlamaCppModel) and isinstance(real_llm, LanguageModel)
    assert real_llm.context_size() == 4096 and real_llm.model_path.endswith(".gguf")
    marker = real_llm.tokenize("<start_of_turn>", special=True)
    assert len(marker) == 1  # a special token ...
    assert len(real_llm.tokenize("<start_of_turn>", special=False)) > 1  # ... unless read as text
    bos = real_llm.tokenize("", add_bos=True)
    assert len(bos) == 1 and real_llm.tokenize("Hello world", add_bos=True)[0] == bos[0]
    assert real_llm.count_tokens("<start_of_turn>user\nHello world") == len(
        real_llm.tokenize("<start_of_turn>user\nHello world", special=True))


@pytest.mark.slow
def test_bundled_gemma_formats_chats_in_gemma_turns(real_llm: Any) -> None:
    assert real_llm.chat_template is None  # the BASE model's GGUF has no template
    chat = real_llm.format_chat(MESSAGES)
    assert chat.text == GEMMA_TURNS.render(MESSAGES) and chat.chat_format == "gemma-turns" and chat.add_bos


@pytest.mark.slow
def test_bundled_gemma_streams_greedily_and_stops(real_llm: Any) -> None:
    tokens = real_llm.tokenize(GEMMA_TURNS.render([{"role": "user", "content": "Count: one, two, three"}]),
                               add_bos=True, special=True)

    def run(stop: Sequence[str], max_tokens: int) -> tuple[str, list[str | None]]:
        deltas = list(real_llm.stream(tokens, max_tokens=max_tokens, stop=stop, seed=1337))
        return "".join(d.text for d in deltas), [d.finish for d in deltas]

    capped, finishes = run([], 12)
    # one step per token, and llama.cpp closes the stream with an empty step carrying the reason
    assert capped and finishes[-1] == "length" and len(finishes) <= 13
    assert run([], 12)[0] == capped  # greedy: the same text again
    cut = next(c for c in capped[1:] if not c.isspace())  # a character the text goes on past
    stopped, finishes = run([cut], 12)
    assert cut not in stopped and capped.startswith(stopped) and finishes[-1] == "stop"
    assert not real_llm.lock.locked()


@pytest.mark.slow
def test_the_same_question_gets_the_same_answer_cold_warm_and_on_a_fresh_model(
    real_llm: Any, tmp_path: Any
) -> None:
    # Regression: with the prompt-prefix cache, a question asked a second time on the same model
    # was evaluated in other batches and answered differently (a generated sentence cold, a quote warm).
    from rag import ask, store
    from rag.config import load_settings
    from rag.embedding import load_embedder
    from rag.ingest import ingest
    from rag.llm import load_language_model

    from .conftest import GUIDE

    settings = load_settings(db_path=tmp_path / "guide.db")
    embedder = load_embedder("minilm")
    conn = store.open_db(settings.db_path)
    try:
        ingest(conn, [GUIDE], settings=settings, embedder=embedder)
        other = "Which port does the app use by default?"
        question = "How do I start the app on another port?"

        def raw(llm: Any, q: str) -> str:
            answer = ask.ask(q, conn=conn, settings=settings, embedder=embedder, llm=llm)
            assert answer.llm_called
            return str(answer.trace["raw"])

        first = raw(real_llm, question)
        assert raw(real_llm, question) == first  # warm: the whole prompt is cached
        raw(real_llm, other)
        assert raw(real_llm, question) == first  # after another prompt shared most of the cache
        fresh = load_language_model("", n_ctx=4096, threads=0, seed=1337)
        try:
            assert raw(fresh, question) == first  # a model that never saw it
        finally:
            fresh.close()
    finally:
        conn.close()


@pytest.mark.slow
def test_bundled_gemma_scores_yes_and_no_as_finite_log_probabilities(real_llm: Any) -> None:
    prompt = GEMMA_TURNS.render([{"role": "user", "content": "Is Paris in France? Answer yes or no."}])
    logprobs = real_llm.next_token_logprobs(prompt, ["yes", "no", "Yes", "No", "certainly not"])
    assert set(logprobs) == {"yes", "no", "Yes", "No"}  # "certainly not" is more than one token
    assert all(math.isfinite(v) and v <= 0.0 for v in logprobs.values())
    assert sum(math.exp(v) for v in logprobs.values()) <= 1.0 + 1e-6
    other = real_llm.next_token_logprobs(
        GEMMA_TURNS.render([{"role": "user", "content": "Is the sea made of cheese?"}]), ["yes", "no"])
    again = real_llm.next_token_logprobs(prompt, ["yes", "no"])
    assert again == {"yes": logprobs["yes"], "no": logprobs["no"]}  # reproducible, whatever came before
    assert other != again
