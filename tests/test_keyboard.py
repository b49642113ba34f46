from __future__ import annotations

import unicodedata

import pytest

from rag.keyboard import compose, decode_telex, decode_vni, decode_word, split_syllable, tone_position


@pytest.mark.parametrize(("typed", "meant"), [
    ("mays", "máy"), ("bij", "bị"), ("ketj", "kẹt"), ("ddeer", "để"), ("nghir", "nghỉ"), ("pheps", "phép"),
    ("thuyeenf", "thuyền"), ("quoocs", "quốc"), ("giuwx", "giữ"), ("nguwowif", "người"), ("dduwowcj", "được"),
    ("xoawns", "xoắn"), ("tw", "tư"), ("nhw", "như"), ("gif", "gì"), ("gieengs", "giếng"), ("quyts", "quýt"),
    ("khuyru", "khuỷu"), ("thuowr", "thuở"), ("yeeu", "yêu"), ("baz", "ba"),
])
def test_telex_words_decode_to_their_syllable(typed: str, meant: str) -> None:
    assert decode_telex(typed) == meant
    assert decode_telex(typed.upper()) == meant  # casefolded
    assert unicodedata.is_normalized("NFC", decode_telex(typed) or "")


def test_telex_tone_and_marks_may_come_later_in_the_word() -> None:
    # most users type the tone key at the end; input methods take it anywhere after the first vowel,
    # and "w" marks the nearest vowel before it (ươ for "uo")
    for typed in ("nguwowif", "nguowif", "nguoiwf", "nguwowfi", "nguoifw"):
        assert decode_telex(typed) == "người", typed
    assert decode_telex("dduwocj") == decode_telex("dduocwj") == "được"
    assert decode_telex("tieesng") == decode_telex("tieengs") == "tiếng"
    assert decode_telex("masy") == "máy"


@pytest.mark.parametrize(("typed", "meant"), [
    ("ma1y", "máy"), ("may1", "máy"), ("bi5", "bị"), ("ke5t", "kẹt"), ("ket5", "kẹt"), ("d9e63", "để"),
    ("nghi3", "nghỉ"), ("thuye6n2", "thuyền"), ("thuyen62", "thuyền"), ("quo6c1", "quốc"), ("giu74", "giữ"),
    ("ngu7o72i", "người"), ("nguoi72", "người"), ("d9u7o7c5", "được"), ("d9uoc75", "được"), ("xoa8n1", "xoắn"),
    ("mu7a", "mưa"),
])
def test_vni_words_decode_to_their_syllable(typed: str, meant: str) -> None:
    assert decode_vni(typed) == meant
    assert decode_word(typed) == meant


def test_the_tone_goes_where_the_new_rule_puts_it() -> None:
    # oa, oe, uy without a coda: on the second vowel (hoà, khoẻ, thuý), as corpus_vi mostly writes them
    assert decode_telex("hoaf") == decode_vni("hoa2") == "hoà"
    assert decode_telex("khoer") == "khoẻ" and decode_telex("thuys") == "thuý"
    assert decode_telex("hoanf") == "hoàn"  # before a coda: the last vowel
    assert decode_telex("hoaif") == "hoài"  # three vowels: the middle one
    assert decode_telex("muas") == "múa" and decode_telex("mias") == "mía" and decode_telex("caus") == "cáu"
    assert decode_telex("quas") == "quá" and decode_telex("giaf") == "già"  # qu, gi are the onset
    assert tone_position("ươ", "ng") == 1 and tone_position("uyê", "n") == 2 and tone_position("oa", "") == 1


@pytest.mark.parametrize("typed", [
    "keys", "class", "process", "vpn", "wifi", "json", "fix", "mac", "set", "aws", "ce", "kas", "ngi", "ghas",
    "bijs", "ddd", "tww", "yeenf" + "s", "mf",
])
def test_what_spells_no_syllable_is_none(typed: str) -> None:
    assert decode_telex(typed) is None


@pytest.mark.parametrize("typed", ["md5", "utf8", "ipv6", "x86", "3g", "a11", "h264", "mp3", "b2b", "k8s"])
def test_codes_with_digits_are_no_vni_syllable(typed: str) -> None:
    assert decode_vni(typed) is None


def test_words_without_keys_stay_as_they_are() -> None:
    assert decode_telex("in") == "in" and decode_telex("May") == "may" and decode_word("nghe") == "nghe"
    # English words that happen to spell a syllable decode, and rag.spelling keeps them as typed
    assert decode_telex("box") == "bõ" and decode_telex("ex") == "ẽ" and decode_telex("does") == "doé"


def test_a_stop_coda_takes_only_the_rising_or_heavy_tone() -> None:
    assert compose("kep", "j") == "kẹp" and compose("kep", "s") == "kép"
    assert compose("kep", "f") is None and compose("kep", None) is None
    assert compose("keng", None) == "keng" and compose("keng", "x") == "kẽng"


def test_split_syllable_follows_the_spelling_rules() -> None:
    assert split_syllable("nghiêng") == ("ngh", "iê", "ng")
    assert split_syllable("quyên") == ("qu", "yê", "n") and split_syllable("giư") == ("gi", "ư", "")
    assert split_syllable("gin") == ("g", "i", "n") and split_syllable("giêng") == ("gi", "iê", "ng")
    assert split_syllable("ngiêng") is None and split_syllable("kan") is None and split_syllable("ci") is None
    assert split_syllable("tyên") is None and split_syllable("iên") is None  # yê opens, iê follows a consonant
