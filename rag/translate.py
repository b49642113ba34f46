"""Question translation for retrieval across languages: an English question over Vietnamese
passages is also searched in Vietnamese.

``rag.retrieval.search`` asks a ``Translator`` when one of the dense branch's first passages is
Vietnamese and the question is English (``rag.retrieval.translation_target``) and fuses the two
wordings' rankings (``fuse_wordings``). Neither branch reads across languages well: keywords
match only the words both languages share, and e5-small's cross-lingual matching is weak
(libreoffice_vi, English-asked: dense R@4 0.32, keywords 0.29), while the same questions in
Vietnamese are found (toned Vietnamese questions: 0.97).

``ModelTranslator`` asks the instruct language model (``rag/prompts/translate.txt``: the rule
and two worked examples in ChatML turns, greedy, one line). No translation model ships offline
on PyPI, so the answer model does it; a base model (Gemma) cannot follow the instruction and
is not asked. A translation that is empty, overlong, the question itself or not in the target
language is not used (``clean_translation``); the question is then searched as typed.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from rag.errors import RagError
from rag.generate import prompt_parts, render
from rag.llm import LanguageModel, complete_line
from rag.text import detect_language, fold

TRANSLATE_MAX_TOKENS = 64  # one question; a longer reply is an answer, not a translation
MAX_LENGTH_RATIO = 3.0  # a translation more than 3x the question's length is refused
CACHE_SIZE = 256  # translations kept per translator (an eval asks each query in several stages)
LANGUAGE_NAMES = {"vi": "Vietnamese", "en": "English"}


@runtime_checkable
class Translator(Protocol):
    """Turns a question into another language for retrieval."""

    def translate(self, text: str, target: str) -> str | None:
        """``text`` in ``target`` ("vi" or "en"), or None when no usable translation was made."""
        ...


def _prompt_parts() -> dict[str, str]:
    return prompt_parts("translate", ("instruction", "example_en", "example_vi", "example2_en", "example2_vi"))


def translate_messages(text: str, target: str) -> list[dict[str, str]]:
    """The translation prompt: the rule as the system turn, two worked examples in the direction
    asked for, then the question."""
    if target not in LANGUAGE_NAMES:
        raise ValueError(f"no translation into {target!r}; choose one of {', '.join(LANGUAGE_NAMES)}")
    parts = _prompt_parts()
    source = "en" if target == "vi" else "vi"
    messages = [{"role": "system", "content": render(parts["instruction"], language=LANGUAGE_NAMES[target])}]
    for example in ("example", "example2"):
        messages += [{"role": "user", "content": parts[f"{example}_{source}"]},
                     {"role": "assistant", "content": parts[f"{example}_{target}"]}]
    return [*messages, {"role": "user", "content": text.strip()}]


def clean_translation(raw: str, question: str, target: str) -> str | None:
    """The model's reply as a searchable translation of ``question``, or None: its first line,
    unquoted; refused when empty, more than ``MAX_LENGTH_RATIO`` times the question's length,
    the question itself, or not written in ``target`` (``rag.text.detect_language``)."""
    line = next((part.strip() for part in raw.strip().splitlines() if part.strip()), "")
    line = line.strip("\"'“”").strip()
    if not line or len(line) > MAX_LENGTH_RATIO * max(len(question.strip()), 1):
        return None
    if fold(line).rstrip("?. ") == fold(question).rstrip("?. "):
        return None
    if detect_language(line) != target:
        return None
    return line


class ModelTranslator:
    """A ``Translator`` on an instruct language model, loaded only when a question needs it.

    Keeps the last ``CACHE_SIZE`` translations (a refused one too), so a question asked again, or
    in every stage of an eval, costs one generation. ``translated(text)`` reads the cache for
    the trace. A model that fails to load, or a base model, translates nothing.
    """

    def __init__(self, loader: Callable[[], LanguageModel]) -> None:
        self._loader = loader
        self._cache: OrderedDict[tuple[str, str], str | None] = OrderedDict()
        self._lock = threading.Lock()

    def translated(self, text: str) -> str | None:
        """The last usable translation made of ``text`` (into any language), for the trace."""
        with self._lock:
            return next((found for (asked, _), found in reversed(self._cache.items()) if asked == text and found),
                        None)

    def translate(self, text: str, target: str) -> str | None:
        key = (text, target)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        result = self._generate(text, target)
        with self._lock:
            self._cache[key] = result
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return result

    def _generate(self, text: str, target: str) -> str | None:
        if target not in LANGUAGE_NAMES:
            return None
        try:
            llm = self._loader()
        except RagError:  # no model to translate with: the question is searched as typed
            return None
        if getattr(llm, "prompt_style", "") != "instruct":
            return None
        return clean_translation(complete_line(llm, translate_messages(text, target), TRANSLATE_MAX_TOKENS), text,
                                 target)
