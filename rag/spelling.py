"""Query spelling: an English question's misspelt words are mended against the collection's own
vocabulary before it is searched ("can i reuse an old laptop pasword" -> "... password").

Support-ticket questions are typed fast ("pasword", "seperately", "wierd"). A misspelt keyword
matches no chunk in the keyword branch, and the embedder splits it into word pieces that no longer
mean the word, so both branches lose the one term that mattered. A word is mended only when all of
these hold, so a correct word is never rewritten:

- the question is English (``rag.text.query_language``): Vietnamese, toned or not, is left alone;
- the word is letters only and at least ``MIN_LENGTH`` long (a four-letter word is one edit away
  from too many others to guess), and not a stopword;
- no chunk of the database holds it (the FTS5 vocabulary), and it is not an English word
  (pyspellchecker's frequency list): a real word the documents do not use is a question about
  something they lack, and must stay as asked so the gate can refuse it;
- it is not a word the documents use with an "s" added (British "neighbours", absent from the
  American list, is the plural of their "neighbour", not a typo);
- a word one edit away (Norvig's deletes, transposes, replaces and inserts, as pyspellchecker's
  ``edit_distance_1`` lists them) is in the vocabulary, is an English word itself (the tokenizer's
  "doesn" of "doesn't" is no mend for "doesnt") and starts with the same letter (a first letter
  is seldom the one mistyped, Yannakoudakis & Fawthrop 1983, while a name that prefixes a common
  word is: "zstandard" is not "standard"); the one in most chunks wins, and the caller
  may reject a candidate (``rag.retrieval`` takes only words that a chunk the reader may see holds,
  so a correction never reveals a word of a restricted document).

pyspellchecker is used for its English word list and its edit generator; the choice among the
candidates is ours because the vocabulary that decides is the collection's, not English at large.

Vietnamese typed with the input method switched off ("mays in bij ketj", VNI "ma1y in bi5 ke5t")
is searched decoded, "máy in bị kẹt", before any English mend (``decode_question``): each word is
decoded by ``rag.keyboard`` into one well-formed syllable or left as typed, and the question is
decoded as a whole only when

- a decoded word is one that no chunk holds as typed, whose decoded form a chunk the reader may
  see holds (``accept``), and that is no English word ("box", "ex", "does" never decide it);
- such words outnumber the question's other words that may be English (typed in ASCII, no
  stopword or number, and an English word or neither a Vietnamese syllable nor one typed in Telex
  or VNI): "cachs caif vpn treen laptop", three to two, is decoded, "how do I configure aws des
  credentials", one to two, is not; or the question so decoded, its tones folded, reads as
  Vietnamese (``rag.text.detect_language``: "lam sao de doi mat khaaur", typed mostly without tones).

Then every such word is decoded, an English one too ("mays" -> "máy" beside "bij" -> "bị"); a word
the documents use as typed and a word that spells no syllable ("vpn", "wifi") stay as typed.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rag.keyboard import decode_word, split_syllable
from rag.text import ENGLISH_STOPWORDS, detect_language, fold, is_stopword, nfc, query_language

MIN_LENGTH = 5  # letters; shorter words have too many neighbours one edit away
_LETTERS = re.compile(r"[^\W\d_]+")
_TOKENS = re.compile(r"[^\W_]+")  # letters and digits, as the FTS5 index splits words ("ma1y" is one)


@dataclass(frozen=True, slots=True)
class Spelling:
    """A question as searched: ``text`` with each ``(typed, mended)`` pair of ``changes`` applied."""

    text: str
    changes: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    # decoded from Telex or VNI keystrokes (``decode_question``): ``text`` is what was asked, where the
    # typed question is no words at all ("mays in bij ketj"), not a question with a typo in it
    keyboard: bool = False


@functools.cache
def _english() -> Any:
    """pyspellchecker's English list (~160k words, ~0.5 s to load once per process)."""
    from spellchecker import SpellChecker

    return SpellChecker(language="en", distance=1)


def is_english_word(word: str) -> bool:
    return word in _english()


def one_edit_away(word: str) -> set[str]:
    """Every string one insert, delete, replace or transpose away from ``word`` (Norvig 2007)."""
    return set(_english().edit_distance_1(word))


def suspect_words(text: str) -> list[str]:
    """The words of an English question that could be misspelt: casefolded letters-only tokens of at
    least ``MIN_LENGTH`` that are not stopwords, in order, once each. [] for any other language."""
    if query_language(text) != "en":
        return []
    words = (w for w in _LETTERS.findall(nfc(text).casefold()) if len(w) >= MIN_LENGTH and w.isascii())
    return list(dict.fromkeys(w for w in words if not is_stopword(w)))


def choose_correction(candidates: Mapping[str, int], accept: Callable[[str], bool] | None = None) -> str | None:
    """The candidate held by most chunks (``candidates`` maps word -> chunk count; ties by spelling),
    the first that ``accept`` takes; None when none is held or accepted."""
    for word, docs in sorted(candidates.items(), key=lambda wd: (-wd[1], wd[0])):
        if docs > 0 and (accept is None or accept(word)):
            return word
    return None


def apply_changes(text: str, changes: Sequence[tuple[str, str]]) -> str:
    """``text`` with each typed word replaced, in any case, wherever it stands as ``suspect_words``
    found it: a run of letters (digits and "_" end a word there, as in the FTS5 index)."""
    for typed, mended in changes:
        text = re.sub(rf"(?<![^\W\d_]){re.escape(typed)}(?![^\W\d_])", mended, text, flags=re.IGNORECASE)
    return text


def replace_tokens(text: str, changes: Sequence[tuple[str, str]]) -> str:
    """``text`` with each typed token replaced, in any case, where it stands whole: a run of
    letters and digits, as ``decode_question`` reads it ("ma1y" in "ma1y," but not in "ma1y2").
    A token typed with a capital first letter keeps it ("Mays" -> "Máy")."""
    for typed, decoded in changes:
        def cased(found: re.Match[str], decoded: str = decoded) -> str:
            return decoded[:1].upper() + decoded[1:] if found.group(0)[:1].isupper() else decoded

        text = re.sub(rf"(?<![^\W_]){re.escape(typed)}(?![^\W_])", cased, text, flags=re.IGNORECASE)
    return text


def decode_question(
    text: str,
    doc_freq: Callable[[Sequence[str]], Mapping[str, int]],
    accept: Callable[[str], bool] | None = None,
) -> Spelling:
    """``text`` with its Telex or VNI words decoded when the question is one typed so (the module
    docstring says when); ``changes`` holds the ``(typed, decoded)`` pairs, empty when it is not.

    Args:
        text: the question, as ``rag.retrieval.check_query`` returns it.
        doc_freq: how many chunks hold each of the given folded words (absent: none).
        accept: may refuse a decoded word (e.g. one that no chunk the reader may see holds).
    """
    tokens = list(dict.fromkeys(_TOKENS.findall(nfc(text).casefold())))
    decoded = {t: decode_word(t) for t in tokens if t.isascii()}
    # an English stopword is never a keystroke leftover ("is", "as", "or" would be í, á, ỏ)
    typed = {t: d for t, d in decoded.items() if d is not None and d != t and t not in ENGLISH_STOPWORDS}
    if not typed:
        return Spelling(text)
    held = doc_freq(sorted({fold(t) for t in typed} | {fold(d) for d in typed.values()}))
    good = [t for t, d in typed.items()
            if held.get(fold(t), 0) == 0 and held.get(fold(d), 0) > 0 and (accept is None or accept(d))]
    deciding = [t for t in good if not is_english_word(t)]
    # the question's other words that may be English: typed in ASCII, no stopword or number, and
    # an English word or neither a Vietnamese syllable nor one typed in Telex or VNI ("vpn",
    # "laptop"; not "sao", "mat", nor "thuwowngr" that no chunk the reader may see holds)
    others = [t for t in tokens if t not in good and t.isascii() and not t.isdigit() and not is_stopword(t)
              and (is_english_word(t) or (split_syllable(t) is None and t not in typed))]
    if not deciding:
        return Spelling(text)
    changes = tuple((t, typed[t]) for t in good)
    decoded_text = replace_tokens(text, changes)
    if len(good) <= len(others) and detect_language(fold(decoded_text)) != "vi":
        return Spelling(text)
    return Spelling(decoded_text, changes, keyboard=True)


def mend_question(
    text: str,
    doc_freq: Callable[[Sequence[str]], Mapping[str, int]],
    accept: Callable[[str], bool] | None = None,
    *,
    english: bool = True,
    telex: bool = True,
) -> Spelling:
    """``text`` with its misspelt words mended (the module docstring says which words and how).

    Args:
        text: the question, as ``rag.retrieval.check_query`` returns it.
        doc_freq: how many chunks hold each of the given folded words (absent: none).
        accept: may refuse a candidate (e.g. one that no chunk the reader may see holds).
        english: mend misspelt English words.
        telex: decode a question typed in Telex or VNI with the input method off (``decode_question``).

    Returns:
        The question as it should be searched; ``changes`` is empty when nothing was mended.
    """
    if telex:
        typed = decode_question(text, doc_freq, accept)
        if typed.changes:
            return typed
    if not english:
        return Spelling(text)
    suspects = suspect_words(text)
    if not suspects:
        return Spelling(text)
    held = doc_freq([fold(w) for w in suspects])
    typos = [w for w in suspects if held.get(fold(w), 0) == 0 and not is_english_word(w)]
    if not typos:
        return Spelling(text)
    neighbours = {typo: [c for c in one_edit_away(typo) if c[0] == typo[0] and is_english_word(c)] for typo in typos}
    singulars = {typo: typo[:-1] for typo in typos if typo.endswith("s")}
    counts = doc_freq(sorted({fold(c) for near in neighbours.values() for c in near} | set(singulars.values())))
    changes = []
    for typo in typos:
        if counts.get(singulars.get(typo, ""), 0) > 0:
            continue  # the plural of a word the documents use ("neighbours": a spelling the list lacks)
        mended = choose_correction({c: counts.get(fold(c), 0) for c in neighbours[typo]}, accept)
        if mended is not None:
            changes.append((typo, mended))
    return Spelling(apply_changes(text, changes), tuple(changes)) if changes else Spelling(text)
