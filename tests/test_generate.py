from __future__ import annotations

from typing import Any

import pytest

from rag.config import Settings
from rag.errors import RagError
from rag.generate import (
    ANSWER_STOP,
    ANSWER_TIMINGS,
    Generation,
    answer_stream,
    fit_prompt,
    format_sources,
    load_example,
    load_prompt,
    render,
    render_prompt,
    repeats_itself,
    source_heading,
    start_generation,
    stream_tokens,
)
from rag.llm import GEMMA_STOP
from rag.records import Answer, Hit

from .fakes import FakeLLM


def hit(n: int, content: str, *, title: str = "Parking", section: str = "Parking > Garage") -> Hit:
    return Hit(
        chunk_id=n, document_id=n, source=f"doc{n}.md", title=title, section=section, content=content,
        char_from=0, char_to=len(content), page=None, distance=0.3,
    )


# --- prompt files


def test_render_fills_placeholders_in_one_pass() -> None:
    # A value that looks like a placeholder (a document quoting "{question}") is never expanded.
    assert render("{sources} / {question}", sources="see {question}", question="Q?") == "see {question} / Q?"
    with pytest.raises(ValueError, match="language"):
        render("{language}", sources="")


def test_prompts_are_loaded_by_name() -> None:
    answer = load_prompt("answer")
    for placeholder in ("{sources}", "{question}", "{language}"):
        assert placeholder in answer
    assert "ONLY" in answer and "[1]" in answer and "say so and stop" in answer
    with pytest.raises(ValueError):
        load_prompt("../config")
    with pytest.raises(RagError, match="no prompt template"):
        load_prompt("no_such_prompt")


def test_examples_exist_per_language_with_a_cited_answer_that_starts_with_the_lead() -> None:
    for language, lead in (("en", "According to ["), ("vi", "Theo [")):
        example = load_example(language)
        assert example.lead == lead
        assert example.answer.startswith(lead)
        assert "[1]" in example.answer and "[1]" in example.sources
    assert load_example("fr") == load_example("en")


# --- sources


def test_sources_are_numbered_with_document_and_section_and_lose_link_targets() -> None:
    hits = [
        hit(1, "Closes at 7 pm. See [the rules](https://evil.example/x) and {% page \"/a\" %}."),
        hit(2, "Opens at 8 am.", title="Office", section="Office"),
    ]
    assert format_sources(hits) == (
        "[1] Parking — Garage\nCloses at 7 pm. See the rules and.\n\n[2] Office\nOpens at 8 am."
    )


def test_source_heading_keeps_a_section_that_does_not_start_with_the_title() -> None:
    assert source_heading(hit(1, "x", title="Leave", section="Other > Part")) == "Leave — Other > Part"


# --- prompt formats


def test_a_model_without_a_chat_template_gets_gemma_turns_and_the_lead() -> None:
    llm = FakeLLM()
    prompt = start_generation(llm, "When does the garage close?", [hit(1, "Closes at 7 pm.")], settings=Settings())
    assert prompt.prompt.chat_format == "gemma-turns"
    assert prompt.prompt.text.endswith("When does the garage close?<end_of_turn>\n<start_of_turn>model\nAccording to [")
    assert prompt.prompt.text.count("<start_of_turn>user") == 2  # the worked example, then the question
    assert prompt.prompt.tokens[0] == 2  # BOS once
    assert set(GEMMA_STOP) <= set(prompt.prompt.stop)
    assert set(ANSWER_STOP) <= set(prompt.prompt.stop)


def test_a_vietnamese_question_gets_the_vietnamese_example() -> None:
    prompt = start_generation(FakeLLM(), "Hầm xe đóng cửa lúc mấy giờ?", [hit(1, "Đóng cửa lúc 7 giờ.")],
                              settings=Settings())
    assert "Answer in Vietnamese" in prompt.prompt.text
    assert prompt.prompt.text.endswith("<start_of_turn>model\nTheo [")


TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_a_gguf_chat_template_is_used_when_present() -> None:
    llm = FakeLLM(metadata={"tokenizer.chat_template": TEMPLATE})
    prompt = render_prompt(llm, [{"role": "user", "content": "Q"}], "Lead [")
    assert prompt.chat_format == "gguf-template"
    assert prompt.text == "<bos><|user|>Q<|end|><|assistant|>Lead ["
    assert prompt.tokens[0] != 2  # the template wrote BOS itself; none is added
    assert "<eos>" in prompt.stop


def test_a_failing_chat_template_falls_back_to_gemma_turns() -> None:
    llm = FakeLLM(metadata={"tokenizer.chat_template": "{{ raise_exception('no assistant turns') }}"})
    prompt = render_prompt(llm, [{"role": "user", "content": "Q"}], "")
    assert prompt.chat_format == "gemma-turns"
    assert "no assistant turns" in prompt.note


def test_long_sources_are_cut_to_fit_the_context_window() -> None:
    long = " ".join(f"word{i}" for i in range(3000))
    hits = [hit(1, long), hit(2, "short source")]
    settings = Settings(n_ctx=1200, max_tokens=200)
    prompt = fit_prompt(FakeLLM(), "question?", hits, "en", settings)
    assert len(prompt.tokens) <= 1000
    assert "short source" in prompt.text and "word0" in prompt.text and "word2999" not in prompt.text
    with pytest.raises(RagError, match="context window"):
        fit_prompt(FakeLLM(), "question?", hits, "en", Settings(n_ctx=300, max_tokens=200))


# --- decoding


def test_repeats_itself() -> None:
    line = "The deadline is one hour after the incident."
    assert repeats_itself(f"{line}\n{line}\nThe")
    assert not repeats_itself(f"{line}\nSomething else entirely happens here.\n")
    assert not repeats_itself("Yes.\nYes.\nThe")  # a short line may come back once more
    assert repeats_itself("Question\nAnswer\nQuestion\nAnswer\nQuestion\nAnswer")


def test_stream_tokens_yields_the_lead_then_the_model_text_with_settings_passed_through() -> None:
    llm = FakeLLM("1], the garage closes at 7 pm.<end_of_turn> and more")
    settings = Settings(max_tokens=50, temperature=0.0, seed=1337)
    generation = start_generation(llm, "When?", [hit(1, "Closes at 7 pm.")], settings=settings)
    deltas = list(stream_tokens(llm, generation.prompt, settings=settings, generation=generation))
    assert deltas[0] == "According to ["
    assert "".join(deltas) == generation.text == "According to [1], the garage closes at 7 pm."
    assert generation.finish == "stop"
    assert generation.first_token_ms is not None
    call = llm.calls[0]
    assert (call["temperature"], call["seed"], call["max_tokens"]) == (0.0, 1337, 50)
    assert call["repeat_penalty"] == settings.repeat_penalty
    assert "<end_of_turn>" in call["stop"]
    assert llm.lock_held_during_call == [True]  # the model holds its own lock while it streams ...
    assert not llm.lock.locked()  # ... and releases it when the stream ends


def test_a_loop_is_cut_short() -> None:
    line = "The deadline is fifteen days after the incident."
    llm = FakeLLM(" ".join([line] * 20))
    settings = Settings(max_tokens=500)
    generation = start_generation(llm, "When?", [hit(1, "x")], settings=settings)
    list(stream_tokens(llm, generation.prompt, settings=settings, generation=generation))
    assert generation.finish == "repeat"
    # Cut as soon as a finished sentence repeats one before it (the first one carries the lead).
    assert generation.text.count(line) == 3
    assert generation.tokens < 30  # of 160 words on offer


def test_the_token_cap_reports_length() -> None:
    llm = FakeLLM("a b c d e f g h")
    settings = Settings(max_tokens=3)
    generation = Generation(prompt=render_prompt(llm, [{"role": "user", "content": "Q"}], ""), lead="")
    list(stream_tokens(llm, generation.prompt, settings=settings, generation=generation))
    assert generation.text == "a b c"
    assert generation.finish == "length"


# --- the real model (slow)


@pytest.mark.slow
def test_bundled_model_is_a_base_model_without_chat_template(real_llm: Any) -> None:
    assert real_llm.chat_template is None
    prompt = render_prompt(real_llm, [{"role": "user", "content": "Q"}], "According to [")
    assert prompt.chat_format == "gemma-turns"
    # <start_of_turn> is one special token, not text, and BOS comes once.
    bos = real_llm.tokenize("", add_bos=True)
    assert len(bos) == 1 and prompt.tokens[:2] == [*bos, 105]
    assert prompt.tokens.count(bos[0]) == 1


def test_generate_answer_verifies_what_the_model_wrote() -> None:
    from rag.generate import generate_answer

    sources = [hit(1, "The garage closes at 7 pm on weekdays.")]
    llm = FakeLLM("1], the garage closes at 7 pm on weekdays. Parking costs 5 dollars [1].")
    answer = generate_answer(llm, "When does the garage close?", sources, settings=Settings())
    assert answer.status == "answered" and answer.llm_called and answer.grounded
    assert answer.text == "According to [1], the garage closes at 7 pm on weekdays."
    assert answer.trace["dropped_sentences"][0]["reason"] == "number 5 not in [1]"
    assert answer.trace["finish"] == "stop"
    with pytest.raises(ValueError, match="at least one source"):
        generate_answer(llm, "When?", [], settings=Settings())


# --- the answer stream


def test_answer_stream_releases_verified_sentences_then_the_answer() -> None:
    sources = [hit(1, "The garage closes at 7 pm on weekdays. It is closed on public holidays.")]
    llm = FakeLLM("1], the garage closes at 7 pm on weekdays. The garage sells hot dogs [1]. "
                  "It is closed on public holidays [1]. It closes at 7 pm on weekdays [1].")
    settings = Settings()
    generation = start_generation(llm, "When does the garage close?", sources, settings=settings)
    *pieces, answer = list(answer_stream(llm, generation, settings=settings))
    assert isinstance(answer, Answer) and answer.status == "answered" and answer.llm_called
    assert all(isinstance(p, str) for p in pieces) and len(pieces) == 3  # the hot dogs never stream
    assert "".join(pieces) == answer.text  # type: ignore[arg-type]
    assert list(answer.timings_ms) == [k for k in ANSWER_TIMINGS if k != "verdict"]  # a base model: no verdict
    assert answer.timings_ms["first_token"] <= answer.timings_ms["first_text"]
    assert answer.hits == sources and answer.trace["raw"] == generation.text and answer.trace["finish"] == "stop"
    assert generation.tokens > 0 and generation.first_token_ms is not None


def test_the_first_sentence_streams_while_the_second_is_written() -> None:
    sources = [hit(1, "The garage closes at 7 pm on weekdays. It is closed on public holidays.")]
    llm = FakeLLM("1], the garage closes at 7 pm on weekdays. It is closed on public holidays [1].")
    settings = Settings()
    generation = start_generation(llm, "When does the garage close?", sources, settings=settings)
    seen_when_first = None
    for item in answer_stream(llm, generation, settings=settings):
        if isinstance(item, str) and seen_when_first is None:
            seen_when_first = generation.text
    assert seen_when_first is not None and "weekdays." in seen_when_first
    assert "holidays" not in seen_when_first  # released one sentence behind the writing, not two


def test_the_answer_ends_at_a_blank_line_unless_it_introduces_something() -> None:
    from rag.generate import answer_end

    lead = "According to ["
    assert answer_end(lead + "1], the garage closes at 7 pm.\n\n[2] Parking", len(lead)) == len(lead) + 30
    assert answer_end(lead + "1], the garage closes at 7 pm.", len(lead)) is None
    intro = lead + "1], remove it by its path as `rag status` shows it:\n\n```bash\nrag delete a.md\n\n"
    assert answer_end(intro, len(lead)) is None  # inside the code block it introduced
    assert answer_end(intro + "```\n\nMore", len(lead)) == len(intro) + 3


def test_a_command_introduced_by_a_colon_is_not_cut_off() -> None:
    sources = [hit(1, "Remove one document by its source path as `rag status` shows it:\n\n```bash\n"
                      "rag delete guide/old.md --db FILE\n```")]
    llm = FakeLLM("1], remove one document by its source path as `rag status` shows it:\n\n```bash\n"
                  "rag delete guide/old.md --db FILE\n```\n\nThe index is updated.")
    settings = Settings()
    generation = start_generation(llm, "How do I remove one document?", sources, settings=settings)
    *_, answer = list(answer_stream(llm, generation, settings=settings))
    assert isinstance(answer, Answer) and answer.status == "answered", answer.trace.get("dropped_sentences")
    assert "rag delete guide/old.md" in answer.text and "updated" not in generation.text


def test_settled_waits_for_a_letter_and_for_what_an_introduction_introduces() -> None:
    from rag.generate import settled
    from rag.verify import draft_answer

    def drafts(text: str) -> list:
        return draft_answer(text, 3)[0]

    assert settled(drafts("According to [1], the garage closes at 7 pm.")) == 0  # the last one may grow
    assert settled(drafts("According to [1], the garage closes at 7 pm. [2")) == 0  # half a marker
    assert settled(drafts("According to [1], the garage closes at 7 pm. It")) == 1
    assert len(drafts("The rules are [1]:\n- Bikes go in the yard")) == 2
    assert settled(drafts("The rules are [1]:\n- Bikes go in the yard")) == 0  # an introduction waits
    assert settled(drafts("The rules are [1]:\n- Bikes go in the yard [1].\n- Cars")) == 2


def test_answer_stream_of_an_unsupported_reply_streams_nothing() -> None:
    sources = [hit(1, "The garage closes at 7 pm on weekdays.")]
    llm = FakeLLM("1], the cafeteria serves espresso all day. Bikes go in the yard [1].")
    settings = Settings()
    generation = start_generation(llm, "When does the garage close?", sources, settings=settings)
    items = list(answer_stream(llm, generation, settings=settings))
    assert len(items) == 1 and isinstance(items[0], Answer) and items[0].status == "extractive"
