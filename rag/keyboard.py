"""Vietnamese typed with the input method switched off: one Telex or VNI word decoded into the
syllable the user meant ("mays" -> "máy", "ddeer" -> "để", "ma1y" -> "máy", "d9e63" -> "để").

Telex: aa â, aw ă, ee ê, oo ô, ow ơ, uw or w ư, uow ươ, dd đ; tone keys s (sắc), f (huyền),
r (hỏi), x (ngã), j (nặng), z (none). VNI: digits 6 (â ê ô), 7 (ơ ư, uo7 ươ), 8 (ă), 9 (đ) and
1 to 5 for the same tones in that order, 0 for none. A tone key may come anywhere after the first
vowel, as input methods take it (most users type it at the end of the word: "nguoiwf", "nguoi72");
"w", "6", "7" and "8" act on the nearest vowel before them that they can mark.

A word is decoded only into one well-formed syllable (``split_syllable``): an onset of the
standard spelling (c/k/q, g/gh, ng/ngh before the vowels they go with), a rime of the language
(nucleus and coda together), and a tone that its coda allows (after c, ch, p, t only sắc or nặng).
The tone goes on the vowel the standard rule picks (``tone_position``); for oa, oe, uy without a
coda that is the "new" placement, hoà, khoẻ, thuý (as most of corpus_vi writes them: hoá 7 to
hóa 2). Anything else decodes to None: an English word typed the same way ("keys", "class") is
no syllable at all, or keeps its letters when it is (the question-level rules in ``rag.spelling``
decide when a word is rewritten).

Written by hand: PyPI's one Telex/VNI engine, bogo 1.1 (2014, LGPL, an sdist built with
distutils), is an input method: it turns any key sequence into some text ("does" -> "dóe",
"box" -> "bõ") and never says that the result is no Vietnamese syllable, which is the part needed
here; with the validation written anyway, the key handling left is a few lines.
"""

from __future__ import annotations

import re
import unicodedata

TONE_MARKS = {"s": "\u0301", "f": "\u0300", "r": "\u0309", "x": "\u0303", "j": "\u0323", "z": ""}
VNI_TONES = {"1": "s", "2": "f", "3": "r", "4": "x", "5": "j", "0": "z"}  # VNI digit -> the Telex key
VOWELS = "aăâeêioôơuưy"
ONSETS = ("ngh", "ng", "nh", "ch", "gh", "gi", "kh", "ph", "qu", "th", "tr",
          "b", "c", "d", "đ", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "x", "")
STOP_CODAS = frozenset(["c", "ch", "p", "t"])  # after these only sắc and nặng
_OPEN_ONLY = ("ai ao au ay âu ây eo êu ia iu oi ôi ơi ua ui ưa ưi ưu iêu yêu uôi ươi ươu oai oay oao oeo uây uya "
              "uyu uơ")
# Each nucleus -> the codas it takes ("" = an open syllable). From the rime tables of Vietnamese
# orthography (Đoàn Thiện Thuật, "Ngữ âm tiếng Việt", 1977), the rare loan rimes left out.
RIMES: dict[str, frozenset[str]] = {
    **{nucleus: frozenset([""]) for nucleus in _OPEN_ONLY.split()},
    "a": frozenset(["", "c", "ch", "m", "n", "ng", "nh", "p", "t"]),
    "ă": frozenset(["c", "m", "n", "ng", "p", "t"]),
    "â": frozenset(["c", "m", "n", "ng", "p", "t"]),
    "e": frozenset(["", "c", "m", "n", "ng", "p", "t"]),
    "ê": frozenset(["", "ch", "m", "n", "nh", "p", "t"]),
    "i": frozenset(["", "ch", "m", "n", "nh", "p", "t"]),
    "y": frozenset([""]),
    "o": frozenset(["", "c", "m", "n", "ng", "p", "t"]),
    "ô": frozenset(["", "c", "m", "n", "ng", "p", "t"]),
    "ơ": frozenset(["", "m", "n", "p", "t"]),
    "u": frozenset(["", "c", "m", "n", "ng", "p", "t"]),
    "ư": frozenset(["", "c", "m", "n", "ng", "t"]),
    "oa": frozenset(["", "c", "ch", "m", "n", "ng", "nh", "p", "t"]),
    "oă": frozenset(["c", "m", "n", "ng", "t"]),
    "oe": frozenset(["", "n", "t"]),
    "uâ": frozenset(["n", "ng", "t"]),
    "uê": frozenset(["", "ch", "nh"]),
    "uy": frozenset(["", "ch", "n", "nh", "t"]),
    "iê": frozenset(["c", "m", "n", "ng", "p", "t"]),
    "yê": frozenset(["m", "n", "t"]),
    "uô": frozenset(["c", "m", "n", "ng", "t"]),
    "ươ": frozenset(["c", "m", "n", "ng", "p", "t"]),
    "uyê": frozenset(["n", "t"]),
}
_CIRCUMFLEX = {"a": "â", "e": "ê", "o": "ô"}
_BREVE = {"a": "ă"}
_HORN = {"o": "ơ", "u": "ư"}
_SYLLABLE_SHAPE = re.compile(r"([^aăâeêioôơuưy]*)([aăâeêioôơuưy]+)([^aăâeêioôơuưy]*)")


def split_syllable(spelled: str) -> tuple[str, str, str] | None:
    """``(onset, nucleus, coda)`` of a toneless, lowercase syllable, or None when it is none.

    "gi" and "qu" are onsets ("giữ" = gi + ư, "quốc" = qu + ôc), but "gì"/"gìn" are g + i(n).
    """
    shape = _SYLLABLE_SHAPE.fullmatch(spelled)
    if shape is None:
        return None
    onset, nucleus, coda = shape.groups()
    if onset == "g" and nucleus.startswith("i") and len(nucleus) > 1:
        onset = "gi"  # "gia", "giữ"; but "giêng" = gi + iêng, written with one i
        nucleus = nucleus if nucleus.startswith("iê") else nucleus[1:]
    elif onset == "q" and nucleus.startswith("u") and len(nucleus) > 1:
        onset, nucleus = "qu", nucleus[1:]
    # after qu the rime's own u is the onset's ("quý", "quýt" of uyt, "quyền" of uyên)
    rime = "u" + nucleus if onset == "qu" and "u" + nucleus in RIMES else nucleus
    if onset not in ONSETS or rime not in RIMES or coda not in RIMES[rime]:
        return None
    first = nucleus[0]
    if onset in ("k", "gh", "ngh") and first not in "ieêy":
        return None
    if (onset in ("c", "g", "ng") and first in "eêy") or (onset in ("c", "ng") and first == "i"):
        return None
    if onset == "qu" and first in "uưo":
        return None
    # yê opens a syllable (yên, yêu) or follows qu (quyền); after a consonant it is written iê
    if nucleus.startswith("yê") and onset not in ("", "qu"):
        return None
    if nucleus.startswith("iê") and not onset:
        return None
    return onset, nucleus, coda


def tone_position(nucleus: str, coda: str) -> int:
    """The index in ``nucleus`` of the vowel that carries the tone.

    A vowel with its own mark (ă â ê ô ơ ư; the last of them: ươ -> ơ) takes it; else a lone
    vowel; else, before a coda, the last vowel (hoàn, thuýt); else the middle of three (hoài,
    khuỷu); else the second of oa, oe, uy (the new placement: hoà, khoẻ, thuý) and the first of
    any other pair (mía, múa, hài, sáo).
    """
    marked = [i for i, vowel in enumerate(nucleus) if vowel in "ăâêôơư"]
    if marked:
        return marked[-1]
    if len(nucleus) == 1:
        return 0
    if coda:
        return len(nucleus) - 1
    if len(nucleus) == 3:
        return 1
    return 1 if nucleus in ("oa", "oe", "uy") else 0


def compose(spelled: str, tone: str | None) -> str | None:
    """``spelled`` (toneless, lowercase) with ``tone`` (a Telex tone key or None), NFC, or None
    when it is no well-formed syllable or its coda does not take that tone."""
    parts = split_syllable(spelled)
    if parts is None:
        return None
    _, nucleus, coda = parts
    mark = TONE_MARKS.get(tone or "z", "")
    if coda in STOP_CODAS and tone not in ("s", "j"):
        return None
    if not mark:
        return spelled
    at = len(spelled) - len(coda) - len(nucleus) + tone_position(nucleus, coda)
    return unicodedata.normalize("NFC", spelled[: at + 1] + mark + spelled[at + 1:])


def _mark_nearest(letters: list[str], marks: dict[str, str], horn_pair: bool = False) -> bool:
    """Mark the nearest letter before the key that ``marks`` can mark (ươ for "uo" when
    ``horn_pair``); False when there is none."""
    for i in range(len(letters) - 1, -1, -1):
        if horn_pair and letters[i] in "oơ" and i > 0 and letters[i - 1] in "uư":
            letters[i - 1 : i + 1] = ["ư", "ơ"]
            return True
        if letters[i] in marks:
            letters[i] = marks[letters[i]]
            return True
    return False


def _settle(letters: list[str], tone: str | None) -> str | None:
    spelled = "".join(letters)
    # ư then o is no rime: input methods write ươ once a coda or glide follows ("dduwocj" -> được)
    spelled = re.sub(r"uơ(?=[cmnptiu])", "ươ", spelled.replace("ưo", "ươ"))
    spelled = re.sub(r"ươ$", "uơ", spelled)  # and uơ when nothing follows ("thuowr" -> thuở)
    return compose(spelled, tone)


def decode_telex(word: str) -> str | None:
    """The syllable a Telex word spells ("nguwowif" -> "người"), None when it spells none.

    Returns the word itself, casefolded, when it holds no Telex key ("in", "may").
    """
    typed = word.casefold()
    if not (typed.isascii() and typed.isalpha()):
        return None
    letters: list[str] = []
    tone: str | None = None
    voweled = False
    for key in typed:
        if voweled and key in TONE_MARKS:
            if tone is not None:
                return None
            tone = key
        elif key == "d" and letters == ["d"]:
            letters = ["đ"]
        elif key in _CIRCUMFLEX and letters and letters[-1] == key:
            letters[-1] = _CIRCUMFLEX[key]
        elif key == "w":
            if not (voweled and _mark_nearest(letters, {**_BREVE, **_HORN}, horn_pair=True)):
                if letters and letters[-1] == "ư":
                    return None
                letters.append("ư")
                voweled = True
        else:
            letters.append(key)
            voweled = voweled or key in VOWELS
    return _settle(letters, tone)


def decode_vni(word: str) -> str | None:
    """The syllable a VNI word spells ("ngu7o72i" or "nguoi72" -> "người"), None when it spells none."""
    typed = word.casefold()
    if not (typed.isascii() and typed.isalnum()) or not typed[0].isalpha():
        return None
    letters: list[str] = []
    tone: str | None = None
    voweled = False
    for key in typed:
        if key.isalpha():
            letters.append(key)
            voweled = voweled or key in VOWELS
        elif key in VNI_TONES:
            if not voweled or tone is not None:
                return None
            tone = VNI_TONES[key]
        elif key == "9":
            if letters[0] != "d":
                return None
            letters[0] = "đ"
        elif not _mark_nearest(letters, {"6": _CIRCUMFLEX, "7": _HORN, "8": _BREVE}[key], horn_pair=key == "7"):
            return None
    return _settle(letters, tone)


def decode_word(word: str) -> str | None:
    """A Telex or VNI word decoded (VNI when it holds a digit), None when it spells no syllable."""
    return decode_vni(word) if any(ch.isdigit() for ch in word) else decode_telex(word)
