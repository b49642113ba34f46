"""Recorded replies played back: a language model that answers with what a model already wrote.

``rag eval answers --replay ROWS.json`` asks every golden query again (retrieval, gate, decision,
verification, scoring all run as shipped) but the answer comes from the ``raw`` reply recorded in
``ROWS.json`` instead of from decoding (both replies, in order, when the run made a second
attempt: ``rag.generate.retry_lead``). A change to verification or to the decision is then
measured on the very replies it is meant to judge, in seconds instead of ~10-20 s of generation
per query, and two variants differ only in what they are meant to change (the model would
otherwise be run twice and must be deterministic for that).

Everything else still goes to the real model (loaded as for a normal run): its tokenizer and
chat template build the prompt exactly as before, and a question's translation
(``rag.translate``) is decoded for real, so the sources the recorded reply cites are found
again. A query with no recorded reply is generated, and so is a second attempt that was not
recorded (the verification being measured failed a reply the recording's had passed). The
timings of a replayed run measure retrieval and verification, not the model.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from rag.errors import RagError
from rag.generate import LANGUAGE_NAMES, instruct_lead, load_example, retry_lead
from rag.llm import ChatPrompt, LanguageModel, Message, TextDelta


def strip_lead(raw: str, leads: Sequence[str]) -> str:
    """``raw`` without the longest of ``leads`` it starts with: a recorded reply holds the lead the
    model's turn was primed with, which the pipeline writes again before the replayed text."""
    for lead in sorted((lead for lead in leads if lead), key=len, reverse=True):
        if raw.startswith(lead):
            return raw[len(lead):]
    return raw


class ReplayModel:
    """A ``rag.llm.LanguageModel`` that answers with ``reply`` (set per query) and hands every other
    call to the real model ``inner``.

    An answer is the stream asked for ``answer_tokens`` tokens (``settings.max_tokens``); the other
    streams (a translation, a rewrite) ask for fewer and are decoded by the real model. Set the
    current query's recorded replies with ``play``; each answer stream takes the next one.
    """

    def __init__(self, inner: LanguageModel, answer_tokens: int, leads: Sequence[str]) -> None:
        self.inner = inner
        self.model_path = inner.model_path
        self.prompt_style = inner.prompt_style
        self.answer_tokens = answer_tokens
        self.leads = tuple(leads)
        self.replies: list[str] = []  # the current query's recorded replies not played yet; none: generate
        self.replayed = 0  # queries whose answer was played back so far
        self._counted = True

    def play(self, replies: Sequence[str]) -> None:
        """The recorded replies of the next query (first attempt, then a second one), [] to generate."""
        self.replies = list(replies)
        self._counted = False

    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = False) -> list[int]:
        return self.inner.tokenize(text, add_bos=add_bos, special=special)

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def context_size(self) -> int:
        return self.inner.context_size()

    def format_chat(self, messages: Sequence[Message]) -> ChatPrompt:
        return self.inner.format_chat(messages)

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
        if max_tokens == self.answer_tokens and self.replies:
            reply = self.replies.pop(0)
            if not self._counted:
                self.replayed, self._counted = self.replayed + 1, True
            yield TextDelta(strip_lead(reply, self.leads), "stop")
            return
        yield from self.inner.stream(tokens, max_tokens=max_tokens, stop=stop, temperature=temperature, seed=seed,
                                     repeat_penalty=repeat_penalty)

    def next_token_logprobs(self, prompt: str, candidates: Sequence[str]) -> dict[str, float]:
        return self.inner.next_token_logprobs(prompt, candidates)

    def continuation_logprobs(self, tokens: Sequence[int], candidates: Sequence[str]) -> dict[str, float]:
        return self.inner.continuation_logprobs(tokens, candidates)

    def close(self) -> None:
        self.inner.close()


def recorded_replies(path: str) -> dict[str, list[str]]:
    """Query id -> the model's replies in order (one, or two with a second attempt), from a
    ``rag eval answers --json`` file (rows the model answered; a row without a reply is generated
    again when replayed)."""
    from rag.evaluate_answers import load_rows  # here: evaluate_answers imports this module

    try:
        rows = load_rows(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RagError(f"cannot read recorded replies from {path}: {e}") from e
    return {row.id: list(row.replies) or [row.raw] for row in rows if row.raw}


def answer_leads() -> tuple[str, ...]:
    """Every lead an answer prompt may prime the model's turn with (instruct, a second attempt's
    and worked example, every language with a prompt)."""
    leads = {lead for language in LANGUAGE_NAMES
             for lead in (instruct_lead(language), retry_lead(language) or "", load_example(language).lead)}
    return tuple(sorted(leads))


__all__ = ["ReplayModel", "answer_leads", "recorded_replies", "strip_lead"]
