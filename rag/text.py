"""Text normalisation shared by ingest, retrieval, verification and evaluation.

Vietnamese note: a letter such as "ệ" carries two marks (circumflex + dot below). SQLite's
unicode61 tokenizer folds such letters inconsistently, and never maps "đ" to "d", so the
project folds text itself (``fold``) and indexes the folded form in FTS5.
"""

from __future__ import annotations

import re
import unicodedata

FOLD_VERSION = "1"  # bump when fold() changes: FTS text must then be rebuilt

_WHITESPACE = re.compile(r"\s+")
_EXTRA_FOLDS = str.maketrans({"đ": "d", "Đ": "d", "ð": "d", "ø": "o", "ł": "l", "ı": "i"})


def nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def fold(text: str) -> str:
    """Casefold and strip every diacritic: "Lỗi xử lý ĐƯỜNG" -> "loi xu ly duong".

    Length is not preserved; use only for matching, never for offsets.
    """
    decomposed = unicodedata.normalize("NFD", text.casefold())
    stripped = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
    return unicodedata.normalize("NFC", stripped.translate(_EXTRA_FOLDS))


def relevance_norm(text: str) -> str:
    """The golden-set relevance normalisation: NFC, casefold, collapse whitespace, strip."""
    return _WHITESPACE.sub(" ", unicodedata.normalize("NFC", unicodedata.normalize("NFC", text).casefold())).strip()


_VI_SPECIFIC = set("ăâđêôơưĂÂĐÊÔƠƯ")
_VI_TONE_MARKS = {"\u0300", "\u0301", "\u0303", "\u0309", "\u0323"}  # grave, acute, tilde, hook, dot below


def vietnamese_share(text: str) -> float:
    """Share of letters that are distinctly Vietnamese (ă â đ ê ô ơ ư or a tone mark)."""
    letters = 0
    marked = 0
    for ch in unicodedata.normalize("NFC", text):
        if not ch.isalpha():
            continue
        letters += 1
        if ch in _VI_SPECIFIC:
            marked += 1
            continue
        parts = unicodedata.normalize("NFD", ch)
        if any(p in _VI_TONE_MARKS for p in parts[1:]) or any(p in _VI_SPECIFIC for p in parts):
            marked += 1
    return marked / letters if letters else 0.0


_VI_TONELESS_WORDS = frozenset(
    "la cua va cho khong nhung mot cac duoc trong khi nao sao gi lam the nhu tai vi neu thi "
    "co ban toi minh ai dau bao nhieu xu ly loi".split()
)


def detect_language(text: str) -> str:
    """"vi" or "en": Vietnamese letters, or (typed without tones) common Vietnamese words."""
    if vietnamese_share(text) >= 0.05:
        return "vi"
    words = re.findall(r"[a-z]+", fold(text))
    if words and sum(w in _VI_TONELESS_WORDS for w in words) / len(words) >= 0.3:
        return "vi"
    return "en"
