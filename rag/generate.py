"""Generation over a ``LanguageModel`` (``rag.llm``; bundled: Gemma-3-270M Q4_K_M), and the
answer stream: generate, release verified sentences as they complete, then the final ``Answer``.

The bundled GGUF is the BASE Gemma-3-270M and carries no chat template, so its prompt is written
in Gemma's turn format; a user's GGUF that has a template in its metadata is formatted with that
template (``LanguageModel.format_chat``). Either way the prompt holds one worked example (a user
turn and a model turn) before the real question, and the model turn is primed with the example's
opening words ("According to [") so that a small base model answers in the example's shape,
starting with a citation, instead of echoing its sources.

Decoding is greedy (temperature 0, fixed seed), capped at ``max_tokens``, and stopped by stop
strings and by a repetition guard (a small model at temperature 0 tends to loop on one line).

The worked example is the same for every question of a language, so it is a constant prompt
prefix, whose KV cache the llama-cpp adapter keeps between questions (see ``rag.llm``).

``answer_stream`` is the one generate -> verify loop: ``rag.ask`` (and through it the CLI and
the Ask page), ``generate_answer`` and the benchmark's generation measurement all run it.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from rag.chunking import split_sentences
from rag.config import Settings
from rag.embedding import Embedder
from rag.errors import RagError
from rag.llm import LanguageModel, Message
from rag.llm import bundled_gguf_path as bundled_gguf_path  # re-exported: its old home
from rag.records import Answer, Hit
from rag.rerank import yes_no_log_odds
from rag.text import detect_language
from rag.verify import (
    MARKER,
    Draft,
    Verified,
    content_words,
    draft_answer,
    introduces,
    judge_sentences,
    prompt_content,
    shown_piece,
    verify_answer,
)

# ---------------------------------------------------------------------------------------------
# Prompts: rag/prompts/<name>.txt, loaded by name

_PROMPT_NAME = re.compile(r"[a-z0-9_]+")
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
LANGUAGE_NAMES = {"en": "English", "vi": "Vietnamese"}


def load_prompt(name: str) -> str:
    """The text of ``rag/prompts/<name>.txt``."""
    if not _PROMPT_NAME.fullmatch(name):
        raise ValueError(f"prompt names are lower-case letters, digits and '_' (got {name!r})")
    try:
        return resources.files("rag").joinpath("prompts", f"{name}.txt").read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise RagError(f"no prompt template rag/prompts/{name}.txt") from e


def prompt_exists(name: str) -> bool:
    """Whether ``rag/prompts/<name>.txt`` ships (a per-language prompt is optional)."""
    return resources.files("rag").joinpath("prompts", f"{name}.txt").is_file()


def prompt_parts(name: str, required: Iterable[str]) -> dict[str, str]:
    """``rag/prompts/<name>.txt`` split at its ``## part`` lines: part name -> text (outer blank
    lines stripped). Raises RagError when one of ``required`` is missing."""
    parts: dict[str, list[str]] = {}
    current = None
    for line in load_prompt(name).splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            parts[current] = []
        elif current is not None:
            parts[current].append(line)
    text = {key: "\n".join(lines).strip("\n") for key, lines in parts.items()}
    missing = sorted(set(required) - set(text))
    if missing:
        raise RagError(f"rag/prompts/{name}.txt lacks its '## {missing[0]}' part")
    return text


def render(template: str, **values: str) -> str:
    """Fill ``{name}`` placeholders in ONE pass, so braces inside a value are never expanded."""

    def fill(match: re.Match[str]) -> str:
        if match.group(1) not in values:
            raise ValueError(f"prompt placeholder {{{match.group(1)}}} has no value")
        return values[match.group(1)]

    return _PLACEHOLDER.sub(fill, template)


@dataclass(frozen=True, slots=True)
class Example:
    """A worked example shown to the model before the real question."""

    sources: str
    question: str
    answer: str
    lead: str  # the opening words of every answer: the model turn is primed with them


def load_example(language: str) -> Example:
    """``answer_example_<language>.txt`` (English when there is none), split on ``## part`` lines."""
    name = f"answer_example_{language}"
    if not prompt_exists(name):
        name = "answer_example_en"
    text = prompt_parts(name, ("sources", "question", "answer", "lead"))
    return Example(text["sources"], text["question"], text["answer"], text["lead"])


def focus(content: str, question: str, max_chars: int) -> str:
    """The sentences of ``content`` around its best match for ``question``, at most ``max_chars``
    (whole sentences; ``content`` itself when it is short enough).

    Prefill dominates an answer's time on a laptop CPU (~75-100 prompt tokens/s for a 0.5B
    model): sending the matched sentence and its neighbours instead of whole chunks cuts the
    prompt several-fold. The best sentence is the one holding most of the question's content
    words (folded, so toneless Vietnamese matches), rarer-in-the-chunk words weighing more; it
    grows by its neighbours, the next sentence first, while they fit.
    """
    if len(content) <= max_chars:
        return content
    spans = split_sentences(content) or [(0, len(content))]
    wanted = content_words(question)
    words = [content_words(content[a:b]) for a, b in spans]
    frequency = Counter(w for ws in words for w in ws & wanted)
    scores = [sum(1.0 / frequency[w] for w in ws & wanted) for ws in words]
    best = max(range(len(spans)), key=lambda i: (scores[i], -i))
    first = last = best
    size = spans[best][1] - spans[best][0]
    while True:
        grown = False
        for candidate in (last + 1, first - 1):
            if 0 <= candidate < len(spans):
                a, b = spans[candidate]
                if size + (b - a) + 1 <= max_chars:
                    first, last = min(first, candidate), max(last, candidate)
                    size += (b - a) + 1
                    grown = True
        if not grown:
            break
    text = content[spans[first][0] : spans[last][1]].strip()
    if len(text) > max_chars:  # one sentence longer than the budget
        text = text[:max_chars].rstrip()
    return ("… " if spans[first][0] > 0 else "") + text + (" …" if spans[last][1] < len(content.rstrip()) else "")


def source_heading(hit: Hit) -> str:
    """``Document — Section`` without repeating the title that opens the section path."""
    section = hit.section or ""
    prefix = f"{hit.title} > "
    if section.startswith(prefix):
        section = section[len(prefix) :]
    elif section == hit.title:
        section = ""
    return f"{hit.title} — {section}" if section else hit.title


def format_sources(hits: Sequence[Hit], contents: Sequence[str] | None = None) -> str:
    """``[n] Document — Section`` followed by the chunk's content, for every source."""
    bodies = contents if contents is not None else [prompt_content(h.content) for h in hits]
    numbered = enumerate(zip(hits, bodies, strict=True), start=1)
    return "\n\n".join(f"[{n}] {source_heading(h)}\n{body}" for n, (h, body) in numbered)


def user_message(sources: str, question: str, language: str) -> str:
    return render(
        load_prompt("answer").strip(), sources=sources, question=question.strip(),
        language=LANGUAGE_NAMES.get(language, "English"),
    )


PROMPT_STYLES = ("example", "instruct")


def prompt_style(llm: LanguageModel, settings: Settings) -> str:
    """``settings.prompt_style``, or for "auto" the model's own (``LanguageModel.prompt_style``:
    "instruct" for a GGUF with a chat template, "example" for a base model without one)."""
    if settings.prompt_style in PROMPT_STYLES:
        return settings.prompt_style
    style = getattr(llm, "prompt_style", "example")
    return style if style in PROMPT_STYLES else "example"


def instruct_messages(
    question: str, hits: Sequence[Hit], language: str, contents: Sequence[str] | None = None
) -> list[dict[str, str]]:
    """System rules (constant per language: a cached prompt prefix), then sources and question.

    An instruct model follows rules without a worked example. A worked exchange (a constant user
    and assistant turn, in the cached prefix) made the 0.5B copy more whole sentences, but more
    often from a passage without the answer: fewer right outcomes on all three visible sets
    (README, thirteenth round). The rules do not ask for a fixed refusal ("NOT IN SOURCES" made
    it refuse most answerable questions); ``rag.verify.declined`` still recognises one.
    """
    system = render(load_prompt(_per_language("instruct_system", language)).strip(),
                    language=LANGUAGE_NAMES.get(language, "English"))
    user = render(load_prompt("instruct_user").strip(), sources=format_sources(hits, contents),
                  question=question.strip())
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def instruct_lead(language: str = "en") -> str:
    """The opening words the instruct model's turn is primed with, in the answer's language
    (``instruct_lead_<language>.txt``, else ``instruct_lead.txt``; may be empty).

    The lead decides the answer's language more than the rules do: primed with "According to [",
    Qwen2.5 0.5B answered Vietnamese questions in English whatever the system prompt asked.
    "Theo [" copies some headings after the number; "Theo nguồn [" and no lead wrote fewer
    verified answers on golden_vi (7 -> 3 and 2 of 28; README, session 18).
    """
    return load_prompt(_per_language("instruct_lead", language)).strip("\n")


def _per_language(name: str, language: str) -> str:
    """``<name>_<language>`` when that prompt exists, else ``name`` (the English one)."""
    localized = f"{name}_{language}"
    return localized if prompt_exists(localized) else name


def build_messages(
    question: str, hits: Sequence[Hit], language: str, contents: Sequence[str] | None = None,
    style: str = "example",
) -> tuple[list[dict[str, str]], str]:
    """Chat messages and the lead that primes the answer: for "example" (a base model) a worked
    example, then the real question, primed with the example's opening words; for "instruct"
    the rules and the question, no lead."""
    if style == "instruct":
        return instruct_messages(question, hits, language, contents), instruct_lead(language)
    example = load_example(language)
    messages = [
        {"role": "user", "content": user_message(example.sources, example.question, language)},
        {"role": "assistant", "content": example.answer},
        {"role": "user", "content": user_message(format_sources(hits, contents), question, language)},
    ]
    return messages, example.lead


# ---------------------------------------------------------------------------------------------
# Turning messages into a prompt: the model's own chat template, else its turn format

# A base model that has finished its answer goes on with a new paragraph, a new prompt block or a
# new "[n] Title" source heading, echoing its sources: the answer ends there. The first blank
# line ends it too, unless it follows an introduction or falls inside a code block (``answer_end``).
ANSWER_STOP = ("\nQUESTION", "\nSOURCES", "\n[", "\n## ")
_BLANK_LINE = re.compile(r"\n[ \t]*\n")


def answer_end(text: str, start: int = 0) -> int | None:
    """Where the answer in ``text`` ends: at its first blank line after ``start`` (the lead's end)
    that neither follows a line ending in ":" nor falls inside a ``` code block; None while
    there is none.

    A fixed "\n\n" stop string cut every answer of the form "remove it by its source path as
    `rag status` shows it:" before the command it introduced (2 of 24 guide answers, verified as
    "introduces nothing supported"), and runbooks answer in commands.
    """
    for match in _BLANK_LINE.finditer(text, start):
        before = text[: match.start()]
        if before.count("```") % 2 == 1 or before.rstrip(" \t*_`").endswith(":"):
            continue
        return match.start()
    return None


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str  # what the model reads, the lead included
    tokens: list[int]
    stop: list[str]
    chat_format: str  # "gemma-turns" or "gguf-template"
    note: str = ""  # why the GGUF template was not used, when it was not
    messages: tuple[Message, ...] = ()  # what was formatted (the verdict continues them)


def render_prompt(llm: LanguageModel, messages: Sequence[Message], lead: str) -> Prompt:
    """Format ``messages`` for ``llm`` and append ``lead``; tokens include BOS exactly once."""
    chat = llm.format_chat(messages)
    text = chat.text + lead
    # A GGUF template writes its own BOS text when it wants one; a turn format needs it added.
    tokens = llm.tokenize(text, add_bos=chat.add_bos, special=True)
    stop = list(dict.fromkeys([*chat.stop, *ANSWER_STOP]))
    return Prompt(text, list(tokens), stop, chat.chat_format, chat.note, tuple(messages))


MIN_SOURCE_CHARS = 200  # sources are never cut below this when the prompt must shrink


def fit_prompt(
    llm: LanguageModel, question: str, hits: Sequence[Hit], language: str, settings: Settings, style: str = "example"
) -> Prompt:
    """The prompt, with the longest sources cut (never below ``MIN_SOURCE_CHARS``) until the
    prompt and ``max_tokens`` fit the context window. With ``settings.source_chars`` > 0 each
    source is first narrowed to the sentences around its best match (``focus``)."""
    full = [prompt_content(h.content) for h in hits]
    if settings.source_chars > 0:
        full = [focus(text, question, settings.source_chars) for text in full]
    allowed = [len(text) for text in full]
    limit = prompt_budget(llm, settings)  # the model as built
    while True:
        contents = [text if len(text) <= n else text[:n].rstrip() + " …" for text, n in zip(full, allowed, strict=True)]
        messages, lead = build_messages(question, hits, language, contents, style)
        prompt = render_prompt(llm, messages, lead)
        if len(prompt.tokens) <= limit:
            return prompt
        longest = max(range(len(allowed)), key=lambda i: allowed[i], default=None)
        if longest is None or allowed[longest] <= MIN_SOURCE_CHARS:
            raise RagError(
                f"the prompt needs {len(prompt.tokens)} tokens but the context window leaves {limit}: "
                "raise n_ctx or lower max_sources"
            )
        allowed[longest] = max(MIN_SOURCE_CHARS, allowed[longest] * 3 // 4)


# ---------------------------------------------------------------------------------------------
# Decoding


def repeats_itself(text: str, min_chars: int = 24, max_short_repeats: int = 3) -> bool:
    """A greedy loop has started: the last finished line (or sentence) repeats an earlier one.

    A line of at least ``min_chars`` may appear once more; any line may appear at most
    ``max_short_repeats`` times ("Question / Answer / Question / Answer ...").
    """
    lines = [line.strip(" -*•\t") for line in re.split(r"\n|(?<=[.!?])\s+", text)]
    finished = [line for line in lines[:-1] if line]
    if len(finished) < 2:
        return False
    last = finished[-1]
    seen = finished[:-1].count(last)
    return (len(last) >= min_chars and seen >= 1) or seen + 1 >= max_short_repeats


@dataclass(slots=True)
class Generation:
    """One generation: its inputs, and what it produced, filled in while it streams (read it
    after the stream ends)."""

    prompt: Prompt
    lead: str
    question: str = ""
    hits: list[Hit] = field(default_factory=list)  # the numbered sources of the prompt
    language: str = "en"
    style: str = "example"  # the prompt style (PROMPT_STYLES)
    text: str = ""  # the lead plus everything the model wrote
    tokens: int = 0
    finish: str = ""  # "stop" | "length" | "repeat"
    first_token_ms: float | None = None  # from the start of decoding (prefill included)
    first_token_at: float | None = None  # time.perf_counter() when the first token arrived
    generate_ms: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    no_retry: str = ""  # why a first reply with no verified sentence is not tried again ("": it is)


def stream_tokens(
    llm: LanguageModel, prompt: Prompt, *, settings: Settings, generation: Generation
) -> Generator[str, None, None]:
    """Yield the model's text deltas (the lead first), recording the run in ``generation``.

    The model is busy (its lock held) from the first delta after the lead until the iterator is
    exhausted or closed.
    """
    generation.text = generation.lead
    yield generation.lead
    started = time.perf_counter()
    stream = llm.stream(
        prompt.tokens, max_tokens=settings.max_tokens, temperature=settings.temperature, seed=settings.seed,
        stop=prompt.stop, repeat_penalty=settings.repeat_penalty,
    )
    try:
        for delta in stream:
            if generation.first_token_ms is None:
                generation.first_token_at = time.perf_counter()
                generation.first_token_ms = (generation.first_token_at - started) * 1000
            generation.tokens += 1
            if delta.finish:
                generation.finish = delta.finish
            if not delta.text:
                continue
            generation.text += delta.text
            end = answer_end(generation.text, len(generation.lead))
            if end is not None:
                generation.text = generation.text[:end]
                generation.finish = "stop"
                break
            yield delta.text
            if repeats_itself(generation.text):
                generation.finish = "repeat"
                break
    finally:
        close = getattr(stream, "close", None)
        if callable(close):
            close()
        generation.generate_ms = (time.perf_counter() - started) * 1000
    if not generation.finish:
        generation.finish = "length" if generation.tokens >= settings.max_tokens else "stop"


def start_generation(
    llm: LanguageModel, question: str, hits: Sequence[Hit], *, settings: Settings, language: str | None = None
) -> Generation:
    """Build the prompt for ``question`` over the numbered ``hits`` (run it with ``answer_stream``)."""
    language = language or detect_language(question)
    style = prompt_style(llm, settings)
    prompt = fit_prompt(llm, question, hits, language, settings, style)
    lead = load_example(language).lead if style == "example" else instruct_lead(language)
    return Generation(prompt=prompt, lead=lead, question=question, hits=list(hits), language=language, style=style)


YES, NO = ("yes", "Yes", " yes", " Yes"), ("no", "No", " no", " No")


def lm_verdict(llm: LanguageModel, generation: Generation) -> float | None:
    """The instruct model's log-odds that its answer gives what the question asks from the
    sources (``log P(yes) - log P(no)`` of its next token), asked in a new user turn after its
    own answer, so the cached prompt is reused and only the answer and the verdict question are
    new (~0.3-0.6 s with Qwen2.5 0.5B). None for a base model's prompt or when the model's
    vocabulary has neither word as one token."""
    if generation.style != "instruct" or not generation.prompt.messages:
        return None
    messages = [*generation.prompt.messages, {"role": "assistant", "content": generation.text.strip()},
                {"role": "user", "content": load_prompt("instruct_verdict").strip()}]
    chat = llm.format_chat(messages)
    tokens = llm.tokenize(chat.text, add_bos=chat.add_bos, special=True)
    logprobs = llm.continuation_logprobs(tokens, [*YES, *NO])
    yes = [v for k, v in logprobs.items() if k in YES]
    no = [v for k, v in logprobs.items() if k in NO]
    if not yes or not no:
        return None
    return yes_no_log_odds(yes, no)


def generation_trace(llm: LanguageModel, generation: Generation, settings: Settings) -> dict[str, Any]:
    """The reproducibility record shown on the dashboard."""
    return {
        "prompt": generation.prompt.text,
        "prompt_tokens": len(generation.prompt.tokens),
        "chat_format": generation.prompt.chat_format,
        "prompt_style": generation.style,
        "chat_format_note": generation.prompt.note,
        "model": llm.model_path,
        "temperature": settings.temperature,
        "seed": settings.seed,
        "max_tokens": settings.max_tokens,
        "repeat_penalty": settings.repeat_penalty,
        "n_ctx": settings.n_ctx,
        "stop": generation.prompt.stop,
        "raw": generation.text,
        "generated_tokens": generation.tokens,
        "finish": generation.finish,
        **generation.extra,
    }


# ---------------------------------------------------------------------------------------------
# The answer stream: generate, release verified sentences as they complete, then the Answer

_LETTER = re.compile(r"[^\W\d_]")


def settled(drafts: Sequence[Draft]) -> int:
    """How many leading sentences of a growing answer are final and can be judged now.

    The last draft is still being written. The one before it is final once the last holds a
    letter outside citation markers (until then a marker that opens it may still move back to
    the sentence before, see ``verify.raw_sentences``, and "[1" may be half a marker), and it
    is not an introduction ending in ":" (which is judged with the sentence that follows it,
    complete). Judging one sentence behind the writing instead of two brings a two-sentence
    answer's first text forward by a whole sentence.
    """
    ready = 0
    for i in range(len(drafts) - 1):
        nxt = drafts[i + 1]
        if not _LETTER.search(MARKER.sub(" ", nxt.text)):
            break
        if introduces(drafts[i].text) and i + 1 == len(drafts) - 1:
            break
        ready = i + 1
    return ready
ANSWER_TIMINGS = ("first_token", "first_text", "generate", "verdict", "verify")  # the stream's timings_ms, in order


def _ms_since(clock: float) -> float:
    return round((time.perf_counter() - clock) * 1000, 1)


def retry_lead(language: str) -> str | None:
    """The lead of a second attempt when an instruct answer's first reply has no verified
    sentence (``instruct_retry_lead_<language>.txt``), or None: no second attempt in that language.

    "According to source [" / "Theo nguồn [" after a failed "According to [" / "Theo [" reply:
    with the shipped decision the 0.5B wrote verified answers for 9 more of 156 answerable queries
    over five golden sets (5 of 62 held out), none fewer (README, "A second attempt, built").
    """
    name = f"instruct_retry_lead_{language}"
    if not prompt_exists(name):
        return None
    return load_prompt(name).strip("\n") or None


def retry_generation(llm: LanguageModel, generation: Generation, lead: str) -> Generation:
    """A new attempt at ``generation``'s messages primed with ``lead`` (the constant prompt
    prefix is the same, so the model's cache makes its first token cheap)."""
    prompt = render_prompt(llm, generation.prompt.messages, lead)
    return Generation(prompt=prompt, lead=lead, question=generation.question, hits=generation.hits,
                      language=generation.language, style=generation.style, extra=generation.extra)


def prompt_budget(llm: LanguageModel, settings: Settings) -> int:
    """The most prompt tokens that leave ``max_tokens`` of the context window for the answer."""
    return min(settings.n_ctx, llm.context_size()) - settings.max_tokens


def _second_attempt(
    llm: LanguageModel, generation: Generation, verified: Verified, emitted: int, settings: Settings
) -> Generation | None:
    """The second attempt at ``generation``, when it is a first instruct reply with no verified
    sentence that did not decline and streamed nothing, and its language has a second lead; else
    None (with the reason in the trace when the attempt was wanted but is not made)."""
    if not settings.answer_retry or generation.style != "instruct" or not generation.prompt.messages:
        return None
    if verified.status == "answered" or emitted or verified.trace.get("model_declined"):
        return None
    if generation.no_retry:
        generation.extra["second_attempt"] = f"not tried: {generation.no_retry}"
        return None
    lead = retry_lead(generation.language)
    if lead is None:
        return None
    retry = retry_generation(llm, generation, lead)
    if len(retry.prompt.tokens) > prompt_budget(llm, settings):
        # the first prompt was cut to fit; the longer lead would push the answer out of the window
        generation.extra["second_attempt"] = "not tried: its prompt does not fit the context window"
        return None
    return retry


def _attempt(
    llm: LanguageModel, generation: Generation, *, settings: Settings, embedder: Embedder | None,
    started: float, timings: dict[str, float], emitted: int,
) -> Generator[str, None, tuple[Verified, float, int]]:
    """One decode of ``generation``: yield its verified sentences as they complete (``emitted``
    pieces already went out), then judge the whole text and yield the sentences not released yet.
    Returns (the verdict, ms spent verifying, pieces yielded in all)."""
    hits = generation.hits
    verify_ms = 0.0
    released = 0  # sentences already judged
    tokens = stream_tokens(llm, generation.prompt, settings=settings, generation=generation)
    try:
        for _ in tokens:
            clock = time.perf_counter()
            drafts, _repeats = draft_answer(generation.text, len(hits))
            ready = settled(drafts)
            pieces: list[str] = []
            if ready > released:
                judged = judge_sentences(drafts, hits, settings.support_threshold, generation.question)
                for sentence in judged[released:ready]:
                    if sentence.supported:
                        pieces.append(shown_piece(sentence, emitted + len(pieces) == 0, strike=False))
                released = ready
            verify_ms += (time.perf_counter() - clock) * 1000
            for piece in pieces:
                emitted += 1
                timings.setdefault("first_text", _ms_since(started))  # the first verified sentence goes out
                yield piece
        # The stream is exhausted here; the rest is judged below with the whole text.
    finally:
        tokens.close()
    clock = time.perf_counter()
    verified = verify_answer(
        generation.question, generation.text, hits, support_threshold=settings.support_threshold,
        show_unsupported=settings.show_unsupported, embedder=embedder, language=generation.language,
    )
    verify_ms += (time.perf_counter() - clock) * 1000
    if verified.status == "answered" and not settings.show_unsupported:
        # Release the sentences the stream had not judged yet (the last one or two).
        pieces = [shown_piece(s, i == 0, strike=False) for i, s in enumerate(verified.sentences)]
        if len(pieces) > emitted:
            timings.setdefault("first_text", _ms_since(started))
        yield from pieces[emitted:]
        emitted = max(emitted, len(pieces))
    return verified, verify_ms, emitted


def answer_stream(
    llm: LanguageModel,
    generation: Generation,
    *,
    settings: Settings,
    embedder: Embedder | None = None,
    started: float | None = None,
) -> Iterator[str | Answer]:
    """Run ``generation`` (from ``start_generation``), yielding its verified sentences as text as
    they complete, then the ``Answer``.

    Unverified model text is never yielded: a sentence is released only once it is complete,
    cited and supported. Joined, the ``str`` items equal ``Answer.text`` of an ``answered``
    answer when ``show_unsupported`` is off; an ``extractive`` answer streams no text.

    When an instruct reply has no verified sentence (and did not decline), the model tries once
    more primed with the language's ``retry_lead`` (``settings.answer_retry``); nothing was
    streamed from the first reply, so the stream stays the final answer's text. The trace then
    holds both replies (``replies``) and the answer is the second one's.

    Args:
        llm: the model the prompt was built for.
        generation: the prompt and its sources; filled in with what the model did (its first
            attempt: a second one is a new ``Generation``, seen in the trace).
        settings: decoding and verification settings.
        embedder: passed to the verifier (picks the extractive quote's sentences).
        started: ``time.perf_counter()`` at the question's arrival, which ``first_token`` and
            ``first_text`` count from (default: now).

    Returns (as the last item):
        An ``answered`` or ``extractive`` Answer over ``generation.hits`` with ``timings_ms``
        (first_token, first_text, generate, verify; generate and verify summed over both
        attempts) and the generation and verification trace (of the attempt shown).
        Exhaust or close the iterator: the model is busy while it generates.
    """
    started = time.perf_counter() if started is None else started
    hits = generation.hits
    timings: dict[str, float] = {}
    verified, verify_ms, emitted = yield from _attempt(llm, generation, settings=settings, embedder=embedder,
                                                       started=started, timings=timings, emitted=0)
    generate_ms = generation.generate_ms
    if generation.first_token_at is not None:
        timings["first_token"] = round((generation.first_token_at - started) * 1000, 1)
    replies = [generation.text]
    retry = _second_attempt(llm, generation, verified, emitted, settings)
    if retry is not None:
        generation = retry
        verified, more_ms, emitted = yield from _attempt(llm, generation, settings=settings, embedder=embedder,
                                                         started=started, timings=timings, emitted=0)
        verify_ms += more_ms
        generate_ms += generation.generate_ms
        replies.append(generation.text)
    timings["generate"] = round(generate_ms, 1)

    if settings.lm_verdict:
        clock = time.perf_counter()
        verdict = lm_verdict(llm, generation)
        if verdict is not None:
            generation.extra["lm_logodds"] = round(verdict, 4)
            timings["verdict"] = _ms_since(clock)
    timings["verify"] = round(verify_ms, 1)
    yield Answer(
        status=verified.status, question=generation.question, text=verified.text, citations=verified.citations,
        sentences=verified.sentences, grounded=verified.grounded, llm_called=True, language=generation.language,
        message=verified.message, hits=list(hits),
        timings_ms={key: timings[key] for key in ANSWER_TIMINGS if key in timings},
        trace={**generation_trace(llm, generation, settings), **verified.trace,
               **({"replies": replies} if len(replies) > 1 else {})},
    )


def generate_answer(
    llm: LanguageModel,
    question: str,
    hits: Sequence[Hit],
    *,
    settings: Settings,
    embedder: Embedder | None = None,
) -> Answer:
    """Generate and verify an answer over already gated ``hits`` (no retrieval, no streaming).

    ``ask()`` is the full path; this is the generation stage alone, e.g. for evaluating prompts
    on fixed contexts. Returns an ``answered`` or ``extractive`` Answer with its trace.
    """
    if not hits:
        raise ValueError("generate_answer needs at least one source; gate the hits first")
    started = time.perf_counter()
    generation = start_generation(llm, question, hits, settings=settings, language=detect_language(question))
    final: Answer | None = None
    for item in answer_stream(llm, generation, settings=settings, embedder=embedder, started=started):
        if isinstance(item, Answer):
            final = item
    if final is None:  # pragma: no cover - answer_stream always ends with an Answer
        raise RuntimeError("answer_stream ended without an answer")
    return final
