from __future__ import annotations

import re
import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from rag.text import (
    ENGLISH_STOPWORDS,
    MAX_KEYWORDS,
    VIETNAMESE_STOPWORDS,
    build_fts_query,
    content_tokens,
    fold,
    is_stopword,
    keywords,
    quote_fts,
    vietnamese_share,
)


def test_fold_removes_tones_and_d_bar() -> None:
    assert fold("Lỗi xử lý ĐƯỜNG") == "loi xu ly duong"


def test_toneless_and_toned_questions_give_the_same_keywords() -> None:
    assert keywords("loi VPN-403 xu ly sao") == ["loi", "vpn-403", "xu", "ly"]
    assert keywords("lỗi VPN-403 xử lý sao?") == ["loi", "vpn-403", "xu", "ly"]


def test_nfd_input_is_normalised_first() -> None:
    toned = "Nghỉ phép năm được bao nhiêu ngày?"
    assert keywords(unicodedata.normalize("NFD", toned)) == keywords(toned) == ["nghi", "phep", "nam", "ngay"]


def test_codes_and_decimals_stay_one_keyword() -> None:
    assert keywords("Is 0.675 the gate for VPN-403, v1.2.3 and max_distance?") == [
        "0.675", "gate", "vpn-403", "v1.2.3", "max_distance",
    ]
    assert keywords("salary/26 and/or") == ["salary", "26"]


def test_trailing_punctuation_is_not_part_of_a_keyword() -> None:
    assert keywords("restart. -x (VPN-) 403.") == ["restart", "x", "vpn", "403"]


def test_english_and_vietnamese_stopwords_are_dropped_and_duplicates_removed() -> None:
    assert keywords("How many days of paid vacation do employees get? Vacation days!") == [
        "many", "days", "paid", "vacation", "employees",
    ]
    assert keywords("Tôi được nghỉ phép bao nhiêu ngày?") == ["nghi", "phep", "ngay"]


def test_all_stopword_question_falls_back_to_its_tokens() -> None:
    assert keywords("What is it?") == ["what", "is", "it"]
    assert keywords("là gì vậy") == ["la", "gi", "vay"]


def test_no_letter_or_digit_gives_no_keyword() -> None:
    assert keywords("?!  — ...") == []
    assert build_fts_query("?!") == ""


def test_toned_content_word_is_kept_where_its_toneless_twin_is_a_stopword() -> None:
    # "mà" (but) is a stopword; "mã" (code) is not, and toneless "ma" is ambiguous, so it stays.
    assert is_stopword("mà")
    assert not is_stopword("mã")
    assert not is_stopword("ma")
    assert keywords("mã lỗi là gì") == ["ma", "loi"]
    # An unambiguous toneless function word is dropped.
    assert is_stopword("khong")


def test_stopword_lists_are_nfc_and_casefolded() -> None:
    for word in ENGLISH_STOPWORDS | VIETNAMESE_STOPWORDS:
        assert word == unicodedata.normalize("NFC", word).casefold()


def test_keywords_are_capped() -> None:
    text = " ".join(f"word{i}" for i in range(200))
    assert len(keywords(text)) == MAX_KEYWORDS


def test_every_keyword_is_quoted_and_or_joined() -> None:
    assert build_fts_query('NEAR(vacation OR "days" * ^x AND -y a:b)') == (
        '"near" OR "vacation" OR "days" OR "x" OR "y" OR "b"'
    )


def test_quote_fts_doubles_inner_quotes() -> None:
    assert quote_fts('a"b') == '"a""b"'


_QUERY_SHAPE = re.compile(r'"[^"]+"(?: OR "[^"]+")*')


@given(st.text(alphabet=st.sampled_from(list('abcĐđệỗ0-.:*^"()_ NEAROR\u0301')), max_size=40) | st.text(max_size=40))
def test_fts_query_is_only_quoted_tokens(text: str) -> None:
    query = build_fts_query(text)
    assert query == "" or _QUERY_SHAPE.fullmatch(query)
    for token in keywords(text):
        assert token == fold(token)
        assert '"' not in token


def test_content_tokens_keep_tones_and_drop_stopwords() -> None:
    assert content_tokens("How do I start the app on another port?") == ["start", "app", "another", "port"]
    assert content_tokens("Làm sao để chạy ứng dụng trên cổng khác?") == [
        "làm", "chạy", "ứng", "dụng", "trên", "cổng", "khác"
    ]
    assert content_tokens("What is it?") == []  # no fallback to stopwords, unlike keywords()


def test_query_language_tells_toned_toneless_and_english() -> None:
    from rag.text import query_language

    assert query_language("Làm sao để chạy ứng dụng trên cổng khác?") == "vi"
    assert query_language("lam sao de chay ung dung tren cong khac") == "vi-toneless"
    assert query_language("How do I start the app on another port?") == "en"
    assert query_language("VPN-403") == "en"


def test_vietnamese_share_counts_marked_letters_by_hand() -> None:
    assert vietnamese_share("Lỗi xử lý") == 3 / 7  # ỗ ử ý of L ỗ i x ử l ý
    assert vietnamese_share("ăn đi") == 2 / 4 and vietnamese_share("plain words") == 0.0
    assert vietnamese_share("e\u0301") == 1.0  # decomposed é is composed first
    assert vietnamese_share("x\u0301") == 0.0  # no precomposed form: x is an unmarked letter
    assert vietnamese_share("ά") == 1.0  # Greek with tonos decomposes to an acute, as before
    assert vietnamese_share("") == vietnamese_share("123 !") == 0.0


def test_every_marked_letter_is_in_the_table() -> None:
    from rag.text import _VI_MARKED_LETTERS, _is_marked

    assert len(_VI_MARKED_LETTERS) == 369 and {"ệ", "Đ", "ư", "ý"} <= _VI_MARKED_LETTERS
    # the table stops at U+2000: no letter above it decomposes to a Vietnamese mark
    assert not any(chr(c).isalpha() and _is_marked(chr(c)) for c in range(0x2000, 0x110000))
