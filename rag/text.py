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


def _is_marked(ch: str) -> bool:
    """A letter that is distinctly Vietnamese: ă â đ ê ô ơ ư, or one carrying a tone mark."""
    parts = unicodedata.normalize("NFD", ch)
    return ch in _VI_SPECIFIC or any(p in _VI_TONE_MARKS for p in parts[1:]) or any(p in _VI_SPECIFIC for p in parts)


# Every such letter, found once: 369 of them, all below U+2000 (checked over every code point: no
# letter above decomposes to a Vietnamese mark). Counting through a set is done in C: the
# per-letter Python loop it replaces took 35 % of a hybrid search at 100k chunks (the language of
# the first passages is read for every question).
_VI_MARKED_LETTERS = frozenset(c for c in map(chr, range(0x2000)) if c.isalpha() and _is_marked(c))


def vietnamese_share(text: str) -> float:
    """Share of letters that are distinctly Vietnamese (ă â đ ê ô ơ ư or a tone mark)."""
    text = unicodedata.normalize("NFC", text)
    letters = sum(map(str.isalpha, text))
    return sum(map(_VI_MARKED_LETTERS.__contains__, text)) / letters if letters else 0.0


# Frequent Vietnamese syllables, written without tones, that are not also common English words
# ("the", "to", "an", "can", "may", "ban", "van", "ai" are left out for that reason).
_VI_TONELESS_WORDS = frozenset(
    [
        "bang", "bao", "bi", "biet", "cac", "cach", "cau", "cham", "chay", "cho", "chua", "chu", "co", "cong", "cu",
        "cua", "cung", "dai", "dang", "dat", "dau", "dc", "den", "diem", "doc", "doi", "dong", "duoc", "dung", "duoi",
        "gi", "gia", "giay", "giu", "giua", "ghi", "hoac", "hoi", "hon", "khi", "kho", "khong", "ko", "lai", "lam",
        "lan", "lau", "len", "lieu", "loi", "lon", "luu", "ly", "mat", "minh", "moi", "mot", "muc", "muon", "nam",
        "nao", "nay", "neu", "nen", "ngan", "ngay", "nguoi", "nguon", "nhanh", "nhan", "nhat", "nho", "nhu", "nhung",
        "nhieu", "phai", "phong", "phut", "ra", "roi", "sai", "sao", "sau", "se", "sua", "tai", "tao", "thang",
        "thay", "them", "theo", "thi", "tien", "tieng", "toi", "tot", "tra", "trong", "tren", "tri", "truoc", "tu",
        "ty", "va", "vao", "vay", "ve", "vi", "viet", "vien", "voi", "xem", "xoa", "xu"
    ]
)

# A toneless Vietnamese syllable: onset, vowel nucleus, coda (unaccented spelling). Many short
# English words fit too ("the", "long", "pin"), so this only backs up the word list above.
_VI_SYLLABLE = re.compile(
    r"(?:ngh|ng|nh|ch|gh|gi|kh|ph|qu|th|tr|[bcdghklmnprstvx])?"
    r"(?:uye|uya|ieu|yeu|uoi|uou|oai|oay|oao|oeo|uay|ai|ao|au|ay|eo|eu|ia|ie|iu|oa|oe|oi|oo|ua|ue|ui|uo|uu|uy|ye"
    r"|[aeiouy])"
    r"(?:ch|ng|nh|[cmnpt])?"
)


def detect_language(text: str) -> str:
    """"vi" or "en": Vietnamese letters, or (typed without tones) Vietnamese words and syllables.

    Toneless text is Vietnamese when 30 % of its words are frequent Vietnamese syllables, or 10 %
    are and 60 % are shaped like Vietnamese syllables. Measured on sentences of the project's
    corpora: 1 of 4,324 English sentences (handbook + user guide) is called Vietnamese, and 94 %
    of corpus_vi sentences with their tones stripped are recognised.
    """
    if vietnamese_share(text) >= 0.05:
        return "vi"
    words = re.findall(r"[a-z]+", fold(text))
    if not words:
        return "en"
    common = sum(w in _VI_TONELESS_WORDS for w in words) / len(words)
    shaped = sum(_VI_SYLLABLE.fullmatch(w) is not None for w in words) / len(words)
    return "vi" if common >= 0.3 or (common >= 0.1 and shaped >= 0.6) else "en"


QUERY_LANGUAGES = ("vi", "vi-toneless", "en")  # the labels of eval/*/golden_tags.json


def query_language(text: str) -> str:
    """How a question is written: "vi" (Vietnamese with its tones), "vi-toneless" (Vietnamese typed
    without diacritics, ``detect_language`` on the words) or "en" (anything else)."""
    if vietnamese_share(text) >= 0.05:
        return "vi"
    return "vi-toneless" if detect_language(text) == "vi" else "en"


# ---------------------------------------------------------------------------------------------
# Keywords for the FTS5 branch
#
# The FTS5 columns hold fold()ed text (see db/migrations/0001_initial.sql), so query tokens are
# folded the same way: "lỗi", "LỖI" and "loi" all become "loi" and find each other.

# Letters/digits, kept whole across an inner "-", ".", "_" or apostrophe so that VPN-403, 0.675,
# v1.2.3 and max_distance stay one keyword. unicode61 splits them at index time, so each keyword
# is later quoted as a phrase ("vpn 403" matches the token run vpn, 403). A "/" separates: in
# questions it mostly means "or"/"per" ("salary/26", "and/or").
_KEYWORD = re.compile(r"[^\W_]+(?:[-._'’][^\W_]+)*")

MAX_KEYWORDS = 64  # a pasted page must not become a 1,000-term OR query; the first 64 distinct words

ENGLISH_STOPWORDS = frozenset(
    [
        "a", "about", "above", "after", "again", "against", "all", "am", "an", "and", "any", "are", "as", "at",
        "be", "because", "been", "before", "being", "below", "between", "both", "but", "by", "can", "could",
        "did", "do", "does", "doing", "down", "during", "each", "few", "for", "from", "further", "had", "has",
        "have", "having", "he", "her", "here", "hers", "herself", "him", "himself", "his", "how", "i", "if",
        "in", "into", "is", "it", "its", "itself", "just", "me", "more", "most", "my", "myself", "no", "nor",
        "not", "now", "of", "off", "on", "once", "only", "or", "other", "our", "ours", "ourselves", "out",
        "over", "own", "same", "she", "should", "so", "some", "such", "than", "that", "the", "their", "theirs",
        "them", "themselves", "then", "there", "these", "they", "this", "those", "through", "to", "too",
        "under", "until", "up", "very", "was", "we", "were", "what", "when", "where", "which", "while", "who",
        "whom", "why", "will", "with", "would", "you", "your", "yours", "yourself", "yourselves", "i'm", "i've",
        "i'd", "it's", "don't", "doesn't", "can't", "get", "got", "please", "tell", "know", "want", "need",
        "us", "let", "also"
    ]
)

# Vietnamese function words, written with their tones (NFC). Vietnamese is written one syllable per
# word, so these are syllables; content words ("lỗi", "xử", "lý", "nghỉ", "phép") are not here.
VIETNAMESE_STOPWORDS = frozenset(
    [
        "à", "ạ", "ai", "anh", "ấy", "bạn", "bao", "bị", "bởi", "các", "cái", "cả", "cần", "chỉ", "chiếc",
        "cho", "chứ", "chúng", "chưa", "có", "của", "cùng", "cũng", "đã", "đang", "đâu", "để", "đến", "đều",
        "đó", "đây", "đấy", "được", "em", "gì", "hay", "hãy", "hoặc", "họ", "hỏi", "khi", "không", "là", "lại",
        "lắm", "mà", "mình", "một", "nào", "này", "nếu", "nên", "nhé", "nhỉ", "như", "nhưng", "những", "nhiêu",
        "nhiều", "nó", "nữa", "ơi", "ở", "phải", "qua", "ra", "rằng", "rất", "rồi", "sao", "sẽ", "tại", "thể",
        "thế", "thì", "tôi", "từ", "và", "vẫn", "vậy", "về", "vì", "với", "xin"
    ]
)

# Typed without tones, some function words collide with content words: "ma" is also mã (code),
# "bao" báo/bảo (report, bảo hiểm), "co" cô/cờ, "la" lá, "ban" bản/bàn, "the" thẻ (card).
# Toneless tokens are dropped only when they are unambiguous. The second row comes from corpus_vi:
# forms that fold to these are content words in at least 30 % of their occurrences there (tài
# liệu, văn bản, đo, đầu, chứng chỉ, chứa, hỗ trợ, chữ, tối đa, ví dụ, làm, một nửa).
_AMBIGUOUS_TONELESS = frozenset(
    [
        "ma", "bao", "co", "la", "ban", "the", "tu", "ve", "lai", "qua", "hay", "de", "da", "dang", "den", "ra",
        "cho", "cai", "can",
        "tai", "van", "do", "dau", "chung", "chua", "ho", "chu", "toi", "vi", "lam", "nua",
    ]
)
VIETNAMESE_STOPWORDS_TONELESS = frozenset(fold(w) for w in VIETNAMESE_STOPWORDS) - _AMBIGUOUS_TONELESS


def is_stopword(token: str) -> bool:
    """``token`` is casefolded NFC; one written with Vietnamese marks is judged by its exact form."""
    if token in ENGLISH_STOPWORDS or token in VIETNAMESE_STOPWORDS:
        return True
    return token == fold(token) and token in VIETNAMESE_STOPWORDS_TONELESS


def content_tokens(text: str) -> list[str]:
    """The words of ``text`` that carry meaning, as written (NFC, casefolded, NOT tone-folded),
    stopwords dropped, in order, deduplicated. ``keywords`` folds these for FTS5."""
    tokens = _KEYWORD.findall(nfc(text).casefold())
    return list(dict.fromkeys(t for t in tokens if not is_stopword(t)))


def keywords(text: str) -> list[str]:
    """Folded, deduplicated keywords of a question, stopwords dropped.

    NFC -> casefold -> tokens on letters/digits (keeping VPN-403, 0.675) -> stopwords dropped ->
    fold (tones, đ) -> deduplicated in order. A question made only of stopwords ("what is it?")
    keeps all its tokens instead, so it still searches rather than failing. Returns [] only when
    the text has no letter or digit at all.
    """
    tokens = _KEYWORD.findall(nfc(text).casefold())
    kept = [t for t in tokens if not is_stopword(t)] or tokens
    return list(dict.fromkeys(fold(t) for t in kept))[:MAX_KEYWORDS]


def quote_fts(token: str) -> str:
    """An FTS5 string: wrapped in double quotes, inner quotes doubled (as sqlite-utils quote_fts)."""
    return '"' + token.replace('"', '""') + '"'


def build_fts_query(text: str) -> str:
    """The FTS5 MATCH expression for a question: every keyword quoted, OR-joined.

    No FTS5 syntax from the user survives: ``NEAR(``, ``AND``, ``*``, ``^``, ``:``, ``-`` and
    quotes are either separators or inside a quoted string. Returns "" when there is no keyword.
    """
    return " OR ".join(quote_fts(t) for t in keywords(text))
