from __future__ import annotations

from collections.abc import Mapping, Sequence

from rag.spelling import (
    Spelling,
    apply_changes,
    choose_correction,
    mend_question,
    one_edit_away,
    replace_tokens,
    suspect_words,
)


def table(counts: Mapping[str, int]):  # type: ignore[no-untyped-def]
    """A ``doc_freq`` over a fixed vocabulary that records what it was asked."""
    asked: list[list[str]] = []

    def doc_freq(words: Sequence[str]) -> dict[str, int]:
        asked.append(list(words))
        return {w: counts[w] for w in words if w in counts}

    doc_freq.asked = asked  # type: ignore[attr-defined]
    return doc_freq


VOCAB = {"password": 12, "passwords": 3, "expires": 4, "laptop": 7, "separately": 2, "weird": 1, "which": 40}


def test_suspects_are_long_english_content_words() -> None:
    assert suspect_words("Can I reuse an old laptop pasword when it expires?") == [
        "reuse", "laptop", "pasword", "expires"]
    assert suspect_words("what is it? is it a pw b4 9am") == []  # short words, stopwords, digits
    assert suspect_words("Làm sao để đổi mật khẩu?") == []  # Vietnamese with tones
    assert suspect_words("lam sao de doi mat khau may tinh") == []  # Vietnamese typed without tones
    assert suspect_words("Pasword PASWORD pasword") == ["pasword"]  # casefolded, once


def test_one_edit_away_lists_the_four_kinds_of_edit() -> None:
    near = one_edit_away("pasword")
    assert {"password", "asword", "apsword", "pasxword"} <= near  # insert, delete, transpose, insert
    assert "pasvord" in near  # replace
    assert "passwords" not in near  # two edits


def test_choose_correction_by_hand() -> None:
    assert choose_correction({"password": 12, "passwords": 3, "pastword": 0}) == "password"
    assert choose_correction({"b": 2, "a": 2}) == "a"  # ties by spelling
    assert choose_correction({"password": 12, "passwords": 3}, accept=lambda w: w != "password") == "passwords"
    assert choose_correction({"x": 0}) is None
    assert choose_correction({"password": 12}, accept=lambda w: False) is None


def test_apply_changes_replaces_whole_words_in_any_case() -> None:
    assert apply_changes("Pasword? my paswords, pasword_old, pasword2 and PASWORD.", [("pasword", "password")]) == (
        "password? my paswords, password_old, password2 and password.")
    assert apply_changes("no change", []) == "no change"


def test_mend_question_mends_only_misspelt_words() -> None:
    doc_freq = table(VOCAB)
    mended = mend_question("can i reuse an old laptop pasword when it expires, or is that wierd?", doc_freq)
    assert mended == Spelling("can i reuse an old laptop password when it expires, or is that weird?",
                              (("pasword", "password"), ("wierd", "weird")))
    # "reuse" is in no chunk but is an English word: a question about what the documents lack
    # keeps its words. Only the two typos' neighbours were looked up after the first call.
    assert "reuse" not in dict(mended.changes)
    assert doc_freq.asked[0] == ["reuse", "laptop", "pasword", "expires", "wierd"]
    assert len(doc_freq.asked) == 2 and "password" in doc_freq.asked[1]


def test_mend_question_leaves_a_clean_or_unknown_question_alone() -> None:
    assert mend_question("laptop password expires", table(VOCAB)) == Spelling("laptop password expires")
    assert mend_question("what is the zyxwvut code", table(VOCAB)) == Spelling("what is the zyxwvut code")
    assert mend_question("doi mat khau laptop", table(VOCAB)) == Spelling("doi mat khau laptop")


def test_mend_question_asks_accept_for_each_candidate() -> None:
    seen: list[str] = []

    def hidden_password(word: str) -> bool:
        seen.append(word)
        return word != "password"

    mended = mend_question("old pasword", table(VOCAB), hidden_password)
    assert seen == ["password"]  # the only neighbour held by a chunk, refused
    assert mended == Spelling("old pasword")


def test_the_plural_of_a_word_the_documents_use_is_no_typo() -> None:
    # British "neighbours" is not in the American word list; the documents say "neighbour"
    assert mend_question("nearest neighbours", table({"nearest": 2, "neighbour": 3})) == Spelling("nearest neighbours")
    assert mend_question("nearest neighbors", table({"nearest": 2, "neighbour": 3})) == Spelling("nearest neighbors")
    assert mend_question("nearest nieghbor", table({"nearest": 2, "neighbor": 3})) == Spelling(
        "nearest neighbor", (("nieghbor", "neighbor"),))


def test_a_mend_is_an_english_word_with_the_same_first_letter() -> None:
    vocab = {"doesn": 9, "standard": 30, "possible": 4, "level": 5}
    # the tokenizer's "doesn" (of "doesn't") is no word; "zstandard" is a name, not a typo of "standard"
    assert mend_question("shelve doesnt persist", table(vocab)) == Spelling("shelve doesnt persist")
    assert mend_question("zstandard default level", table(vocab)) == Spelling("zstandard default level")
    assert mend_question("is that posible", table(vocab)).changes == (("posible", "possible"),)


# Telex / VNI typed with the input method off (rag.keyboard, decode_question)

VI_VOCAB = {"may": 9, "in": 7, "bi": 5, "ket": 3, "nghi": 4, "phep": 4, "cach": 6, "cai": 5, "vpn": 2, "tren": 8,
            "laptop": 1, "loi": 3, "mat": 2, "khau": 2, "box": 1}


def test_a_telex_question_is_searched_decoded() -> None:
    doc_freq = table(VI_VOCAB)
    decoded = mend_question("Mays in bij ketj?", doc_freq)
    assert decoded == Spelling("Máy in bị kẹt?", (("mays", "máy"), ("bij", "bị"), ("ketj", "kẹt")), keyboard=True)
    assert mend_question("ma1y in bi5 ke5t", table(VI_VOCAB)).text == "máy in bị kẹt"  # VNI
    # "vpn" and "laptop" spell no syllable and stay as typed; three decoded words against two
    assert mend_question("cachs caif vpn treen laptop", table(VI_VOCAB)).text == "cách cài vpn trên laptop"
    # mostly typed without tones, one word in Telex: the decoded question reads as Vietnamese
    assert mend_question("lam sao doi mat khaaur", table(VI_VOCAB)).changes == (("khaaur", "khẩu"),)


def test_english_questions_and_words_the_documents_use_stay_as_typed() -> None:
    for question in ("does the process class keys box ex", "how do I configure aws des credentials",
                     "how do I set up ast on the mac", "is the box in ex stock"):
        assert mend_question(question, table({**VI_VOCAB, "a": 9, "de": 2, "at": 5, "e": 1, "bo": 2})) == Spelling(
            question), question
    # a chunk holds "bij" as typed: it is a word of the documents, not a keystroke leftover
    assert mend_question("mays in bij ketj", table({**VI_VOCAB, "bij": 1})).changes == (
        ("mays", "máy"), ("ketj", "kẹt"))
    # only an English word could be decoded ("mays"): nothing decides that the question is Telex
    assert mend_question("mays", table(VI_VOCAB)) == Spelling("mays")


def test_decoding_asks_accept_and_can_be_turned_off() -> None:
    seen: list[str] = []

    def hidden_ket(word: str) -> bool:
        seen.append(word)
        return word != "kẹt"

    assert mend_question("mays in bij ketj", table(VI_VOCAB), hidden_ket).changes == (("mays", "máy"), ("bij", "bị"))
    assert seen == ["máy", "bị", "kẹt"]
    assert mend_question("mays in bij ketj", table(VI_VOCAB), telex=False) == Spelling("mays in bij ketj")
    assert mend_question("laptop pasword", table({"password": 3, "laptop": 1}), english=False).changes == ()


def test_replace_tokens_replaces_whole_runs_of_letters_and_digits() -> None:
    assert replace_tokens("Ma1y, ma1y2 ma1y_x MA1Y", [("ma1y", "máy")]) == "Máy, ma1y2 máy_x Máy"
