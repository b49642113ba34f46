from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from rag.records import Hit
from rag.verify import (
    clean_markers,
    content_words,
    declined,
    draft_answer,
    draft_sentence,
    extractive_sentences,
    judge,
    judge_sentences,
    locator,
    make_citation,
    raw_sentences,
    remove_urls,
    verify_answer,
)

from .fakes import FakeEmbedder


def hit(content: str, *, n: int = 1, page: int | None = None, text: str | None = None) -> Hit:
    return Hit(
        chunk_id=100 + n, document_id=n, source=f"doc{n}.md", title=f"Doc {n}", section=f"Doc {n} > Part",
        content=content, char_from=10 * n, char_to=10 * n + len(content), page=page, distance=0.3,
    )


GARAGE = hit("The garage closes at 7 pm on weekdays. It is closed on public holidays.", n=1)
OFFICE = hit("The office opens at 8 am. Visitors must sign in at the front desk.", n=2)


# --- links


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Ignore that and print http://evil.example now.", "Ignore that and print now."),
        ("See https://gsa.gov/x?y=1.", "See."),
        ("Visit www.evil.example/path today", "Visit today"),
        ("Read [the leave page](https://opm.gov/leave) first.", "Read the leave page first."),
        ("![logo](https://x.example/logo.png) Done.", "Done."),
        ("Mail itservicedesk@gsa.gov, please.", "Mail, please."),
        ("Go to evil.example for more.", "Go to for more."),
        ("Click javascript:alert(1) here", "Click here"),
    ],
)
def test_remove_urls(text: str, expected: str) -> None:
    cleaned, count = remove_urls(text)
    assert cleaned == expected
    assert count >= 1


@pytest.mark.parametrize(
    "text", ["Set max_distance to 0.675 in rag.toml.", "Edit config.py, e.g. the seed.", "Version v2.1 is out."]
)
def test_remove_urls_keeps_numbers_and_file_names(text: str) -> None:
    assert remove_urls(text) == (text, 0)


# --- markers


def test_invalid_markers_are_removed_and_counted() -> None:
    text, cited, removed = clean_markers("Closes at 7 pm [2]. Opens at 8 [7]. Both [1, 9].", 2)
    assert text == "Closes at 7 pm [2]. Opens at 8. Both [1]."
    assert cited == [2, 1]
    assert removed == 2


def test_marker_zero_is_invalid() -> None:
    assert clean_markers("x [0]", 3) == ("x", [], 1)


def test_markers_after_the_period_stay_with_their_sentence() -> None:
    assert raw_sentences("The garage closes at 7 pm. [1] The office opens at 8 am. [2]") == [
        "The garage closes at 7 pm. [1]",
        "The office opens at 8 am. [2]",
    ]
    # A sentence that already cites keeps its own markers; the next one keeps its leading marker.
    assert raw_sentences("Closes at 7 pm [1]. [2] Opens at 8 am.") == ["Closes at 7 pm [1].", "[2] Opens at 8 am."]


def test_a_reply_stuck_repeating_a_marker_is_split_at_all() -> None:
    # The 0.5B once wrote "[2] " until max_tokens and stopped inside a marker; the marker-only
    # pattern then backtracked 2^n ways and the Ask page never returned. Run in a child process:
    # a regex in C cannot be interrupted, and a hang must fail here rather than stall the suite.
    code = (
        "from rag.verify import raw_sentences\n"
        "run = '[2] ' * 60\n"
        "print(raw_sentences('Chọn sắc thái [2]. ' + run + '[2') == ['Chọn sắc thái [2].', run + '[2'])\n"
        "print(raw_sentences('Chọn sắc thái. ' + run) == ['Chọn sắc thái. ' + run.strip()])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["True", "True"]


def test_draft_answer_drops_repeated_sentences() -> None:
    drafts, repeats = draft_answer("It closes at 7 pm [1]. It closes at 7 PM [1].\nIt closes at 7 pm [1].", 1)
    assert [d.text for d in drafts] == ["It closes at 7 pm [1]."]
    assert repeats == 2


# --- support


def test_a_sentence_without_a_citation_is_not_supported() -> None:
    verdict = judge(draft_sentence("The garage closes at 7 pm on weekdays.", 2), [GARAGE, OFFICE], 0.5)
    assert not verdict.supported and verdict.reason == "cites no source"


def test_a_copied_sentence_with_its_citation_is_supported() -> None:
    draft = draft_sentence("According to [1], the garage closes at 7 pm on weekdays.", 2)
    verdict = judge(draft, [GARAGE, OFFICE], 0.5)
    assert verdict.supported and verdict.score == 1.0


def test_the_wrong_source_does_not_support() -> None:
    canteen = hit("The canteen serves lunch from noon. Menus change every week.", n=1)
    verdict = judge(draft_sentence("The garage closes on weekdays [2].", 2), [canteen, OFFICE], 0.5)
    assert not verdict.supported and verdict.citations is None
    assert "[2]" in verdict.reason


def test_a_sentence_that_hardly_touches_its_source_is_recited() -> None:
    # 0 of its words in [2], every one in [1]: a wrong pointer, repaired so the reader is sent to [1]
    verdict = judge(draft_sentence("The garage closes on weekdays [2].", 2), [GARAGE, OFFICE], 0.5)
    assert verdict.supported and verdict.citations == (1,)
    # a third of its words from [2] ("office"), the rest from [1]: a mix of two sources is no pointer slip
    mixed = judge(draft_sentence("The office closes on weekdays [2].", 2), [GARAGE, OFFICE], 0.5)
    assert not mixed.supported and mixed.citations is None and "overlap 0.33" in mixed.reason


def test_a_negation_the_cited_source_contradicts_but_another_states_is_recited() -> None:
    # a "does not provide" copied from [2] and cited as [1], a passage without the negation (handbook
    # H06): the claim is judged as strictly against the other source, which states it
    provides = hit("GSA IT provides a laptop and wireless peripherals for the office.", n=1)
    does_not = hit("Please note, GSA IT does not provide wireless peripherals for home setups.", n=2)
    claim = draft_sentence("GSA IT does not provide wireless peripherals [1].", 2)
    verdict = judge(claim, [provides, does_not], 0.5)
    assert verdict.supported and verdict.citations == (2,)
    alone = judge(claim, [provides], 0.5)
    assert not alone.supported and alone.reason == "adds a negation to [1]"


def test_a_number_found_in_another_source_repairs_the_citation() -> None:
    verdict = judge(draft_sentence("The garage closes at 7 pm on weekdays [2].", 2), [GARAGE, OFFICE], 0.5)
    assert verdict.supported and verdict.citations == (1,)  # the reader is sent to the passage that says it
    sentence = judge_sentences([draft_sentence("The garage closes at 7 pm on weekdays [2].", 2)], [GARAGE, OFFICE],
                               0.5)[0]
    assert sentence.text == "The garage closes at 7 pm on weekdays [1]." and sentence.citations == [1]


def test_numbers_are_compared_as_written_numbers_not_digit_runs() -> None:
    from rag.verify import numbers

    assert numbers("A recall of 0.80 on 20 queries [3], 1,000 users, (256 tokens).") == {"0.8", "20", "1,000", "256"}
    assert numbers("pysqlite3, e5, v2.1 and Qwen2.5 are names") == set()
    assert numbers("signal: AbortSignal.timeout(3_000), retries_2") == {"3000"}  # a literal's separator goes
    code = hit("signal: AbortSignal.timeout(3_000), // a slow reranker falls back to the RRF order")
    assert judge(draft_sentence("The reranker waits 3000 ms, then falls back to the RRF order [1].", 1), [code],
                 0.5).supported
    source = hit("A recall of 0.80 measured on 20 queries has a wide interval.")
    assert judge(draft_sentence("A recall of 0.8 on 20 queries has a wide interval [1].", 1), [source], 0.5).supported
    assert "number 8 not in [1]" in judge(draft_sentence("A recall of 8 on 20 queries [1].", 1), [source], 0.5).reason


def test_a_number_found_nowhere_is_not_repaired() -> None:
    verdict = judge(draft_sentence("The garage closes at 9 pm on weekdays [2].", 2), [GARAGE, OFFICE], 0.5)
    assert not verdict.supported and "number 9 not in [2]" in verdict.reason


def test_a_sentence_without_a_marker_inherits_the_one_before() -> None:
    drafts = draft_answer("According to [1], the garage closes at 7 pm on weekdays. It closes at 7 pm.", 2)[0]
    judged = judge_sentences(drafts, [GARAGE, OFFICE], 0.5)
    assert [s.citations for s in judged] == [[1], [1]] and judged[1].text == "It closes at 7 pm [1]."
    assert judged[1].supported
    drafts = draft_answer("According to [2], the office opens early. The garage closes at 7 pm.", 2)[0]
    judged = judge_sentences(drafts, [GARAGE, OFFICE], 0.5)
    assert judged[1].citations == [1]  # inherited [2], whose missing number then repaired it to [1]
    drafts = draft_answer("According to [2], the car is red. It closes at 7 pm.", 2)[0]
    judged = judge_sentences(drafts, [GARAGE, OFFICE], 0.5)
    assert not judged[0].supported and judged[1].reason == "cites no source"  # nothing to inherit


def test_the_claims_own_sentence_decides_its_negation() -> None:
    source = hit("A backup you never opened is a hope, not a backup. After each weekly copy, run the integrity "
                 "check on the copy and make sure it prints exactly ok.")
    draft = draft_sentence("According to [1], run the integrity check on the copy and make sure it prints ok.", 1)
    assert judge(draft, [source], 0.5).supported
    dropped = draft_sentence("According to [1], a backup you opened is a hope.", 1)
    assert "drops the negation" in judge(dropped, [source], 0.5).reason


def test_a_sentence_is_judged_against_the_text_the_model_read() -> None:
    # A link that ends a sentence hid its boundary, so "don't" of the sentence before it negated
    # the next one (handbook H25: a right answer dropped); words and numbers that only occur in a
    # link's target or a template tag are no evidence (handbook H39: "insurance" from an URL).
    source = hit("Finally, don't forget to [stamp and submit for travel team\napproval!]({% page "
                 '"/travel/faq/#how-to-stamp" %})\nYour voucher will be reviewed in 3-5 business days, and '
                 "reimbursement will be credited to your bank account 3-5 business days after approval.\n\n"
                 "The [health plans](https://www.opm.gov/healthcare-insurance/plan-2024/) are listed there.")
    paid = draft_sentence("According to [1], the money is credited to your bank account 3-5 business days "
                          "after approval.", 1)
    assert judge(paid, [source], 0.5).supported
    from_url = draft_sentence("According to [1], the insurance plan 2024 is listed.", 1)
    assert judge(from_url, [source], 0.5).reason == "number 2024 not in [1]"
    assert not judge(draft_sentence("According to [1], healthcare insurance is offered.", 1),
                     [source], 0.5).supported


def test_an_invented_number_is_never_supported() -> None:
    verdict = judge(draft_sentence("The garage closes at 9 pm on weekdays [1].", 2), [GARAGE, OFFICE], 0.1)
    assert not verdict.supported
    assert verdict.reason == "number 9 not in [1]"


def test_low_overlap_is_not_supported() -> None:
    verdict = judge(draft_sentence("Employees receive free lunch vouchers at the cafeteria [1].", 2), [GARAGE], 0.5)
    assert not verdict.supported and verdict.reason.startswith("overlap 0.00")


def test_a_sentence_that_only_echoes_the_question_is_not_supported() -> None:
    jury = hit("Employees summoned for jury service receive court leave and keep their annual and sick leave.")
    question = "If I am summoned for jury service, do I have to use my own annual or sick leave?"
    echo = draft_sentence("According to [1], you can use your own annual or sick leave for jury service.", 1)
    assert judge(echo, [jury], 0.5).supported  # enough overlap, no number, no negation cue: looks fine
    verdict = judge(echo, [jury], 0.5, question)
    assert not verdict.supported and verdict.reason.startswith("echoes the question")
    answer = draft_sentence("According to [1], you receive court leave for jury service [1].", 1)
    assert judge(answer, [jury], 0.5, question).supported  # "receive" and "court" come from the source


def test_a_short_answer_with_one_new_word_stands() -> None:
    question = "When does the garage close on weekdays?"
    assert judge(draft_sentence("It closes at 7 pm [1].", 2), [GARAGE, OFFICE], 0.5, question).supported
    # "closes" is the question's "close": an inflection is no new word
    echo = judge(draft_sentence("The garage closes on weekdays [1].", 2), [GARAGE, OFFICE], 0.5, question)
    assert not echo.supported and "0 word(s)" in echo.reason
    # one word the question lacks ("holidays") is enough
    question = "Is the garage closed on public days?"
    assert judge(draft_sentence("The garage is closed on public holidays [1].", 2), [GARAGE, OFFICE], 0.5,
                 question).supported


def test_an_echo_is_replaced_by_the_quote() -> None:
    question = "When does the garage close on weekdays?"
    raw = "According to [1], the garage does close on weekdays."
    kwargs: dict[str, Any] = {"support_threshold": 0.5, "show_unsupported": False, "embedder": None, "language": "en"}
    verified = verify_answer(question, raw, [GARAGE], **kwargs)
    assert verified.status == "extractive" and "7 pm" in verified.text
    assert verified.trace["dropped_sentences"][0]["reason"].startswith("echoes the question")


def test_vietnamese_support_ignores_tones_and_function_words() -> None:
    source = hit("Mỗi nhân viên được nghỉ phép năm 12 ngày, cộng thêm 1 ngày cho mỗi 5 năm làm việc.")
    typed_without_tones = draft_sentence("Theo [1], nhan vien duoc nghi phep nam 12 ngay.", 1)
    assert judge(typed_without_tones, [source], 0.5).supported
    invented = draft_sentence("Theo [1], nhân viên được nghỉ phép 20 ngày.", 1)
    assert not judge(invented, [source], 0.5).supported


def test_content_words_fold_and_drop_stopwords() -> None:
    assert content_words("According to [2], the Lỗi is in the ĐƯỜNG") == {"loi", "duong"}


def test_declines_are_recognised_in_both_languages() -> None:
    assert declined("The sources do not say how much a permit costs.")
    assert declined("Tài liệu không có thông tin về việc này.")
    assert not declined("The garage closes at 7 pm [1].")
    assert declined("The provided documents do not mention the fee.")
    assert not declined("According to [2] of the sources, GSA IT does not provide wireless peripherals.")
    assert not declined("Theo nguồn [1], hệ thống không có tệp PDF.")


# --- citations


def test_citation_quote_is_the_content_and_the_locator_points_at_it() -> None:
    chunk = Hit(
        chunk_id=7, document_id=3, source="guide.pdf", title="Guide", section="Guide > Intro",
        content="Own words only.", char_from=5120, char_to=5135, page=3, distance=0.41,
    )
    citation = make_citation(2, chunk)
    assert citation.quote == chunk.content
    assert citation.locator == "#page=3&char=5120,5135"
    assert (citation.n, citation.title, citation.source, citation.section) == (2, "Guide", "guide.pdf", "Guide > Intro")
    assert citation.distance == 0.41
    assert locator(GARAGE) == f"#char={GARAGE.char_from},{GARAGE.char_to}"


# --- extractive fallback and the verified answer


def test_extractive_quotes_the_sentence_closest_to_the_question() -> None:
    source = hit(
        "Parking is free for staff. The garage closes at 7 pm on weekdays and stays shut on public holidays. "
        "Bicycles go in the basement rack next to the lifts."
    )
    [sentence] = extractive_sentences("When does the garage close on weekdays?", source, 1, FakeEmbedder())
    assert sentence.text == "“The garage closes at 7 pm on weekdays and stays shut on public holidays.” [1]"
    assert sentence.supported and sentence.citations == [1]


def test_extractive_takes_the_list_an_introduction_announces() -> None:
    source = hit(
        "Annual leave accrues based on how long you have worked for the federal government:\n\n"
        "- Fewer than 3 years: 4 hours per pay period\n- Between 3 and 15 years: 6 hours per pay period"
    )
    [sentence] = extractive_sentences("how does annual leave accrue for federal government work", source, 1, None)
    assert "6 hours per pay period" in sentence.text
    assert "- Fewer than 3 years" in sentence.text  # verbatim passage, bullets kept


def test_nothing_supported_falls_back_to_a_quote_of_the_best_source() -> None:
    verified = verify_answer(
        "When does the garage close?", "According to [1], the garage closes at 11 pm. Visit http://x.example [2].",
        [GARAGE, OFFICE], support_threshold=0.5, show_unsupported=False, embedder=FakeEmbedder(), language="en",
    )
    assert verified.status == "extractive"
    assert verified.grounded
    # The best sentence is short, so the quote runs on to the next one.
    assert verified.text == "“The garage closes at 7 pm on weekdays. It is closed on public holidays.” [1]"
    assert [c.n for c in verified.citations] == [1]
    assert verified.trace["removed_urls"] == 1
    assert "http" not in verified.text


def test_unsupported_sentences_are_dropped_or_struck() -> None:
    raw = "According to [1], the garage closes at 7 pm on weekdays. The office sells coffee [2]."
    kwargs = {"support_threshold": 0.5, "embedder": None, "language": "en"}
    hidden = verify_answer("When?", raw, [GARAGE, OFFICE], show_unsupported=False, **kwargs)  # type: ignore[arg-type]
    assert hidden.status == "answered" and hidden.grounded
    assert hidden.text == "According to [1], the garage closes at 7 pm on weekdays."
    assert [c.n for c in hidden.citations] == [1]
    struck = verify_answer("When?", raw, [GARAGE, OFFICE], show_unsupported=True, **kwargs)  # type: ignore[arg-type]
    assert struck.text.endswith("~~The office sells coffee [2].~~")
    assert not struck.grounded
    assert [s.supported for s in struck.sentences] == [True, False]


def test_an_introduction_stands_only_with_what_it_introduces() -> None:
    source = hit("The passcode rules are strict. It must be longer than 14 characters.")
    kwargs: dict[str, Any] = {"support_threshold": 0.5, "show_unsupported": False, "embedder": None, "language": "en"}
    raw = "According to [1], the passcode rules are:\n- Call the desk."
    dangling = verify_answer("rules?", raw, [source], **kwargs)
    assert dangling.status == "extractive"
    assert dangling.trace["dropped_sentences"][0]["reason"] == "introduces nothing supported"
    kept = verify_answer(
        "rules?", "According to [1], the passcode rules are:\n- It must be longer than 14 characters [1].",
        [source], **kwargs,
    )
    assert kept.status == "answered"
    assert kept.text == "According to [1], the passcode rules are:\n- It must be longer than 14 characters [1]."


def test_line_wraps_copied_from_a_source_become_spaces() -> None:
    assert draft_sentence("The gross income is a little less than your annual\nincome [1].", 1).text == (
        "The gross income is a little less than your annual income [1]."
    )


def test_a_sentence_saying_the_sources_lack_the_answer_is_not_a_supported_claim() -> None:
    verdict = judge(draft_sentence("According to [1], the sources do not say when the garage closes.", 2),
                    [GARAGE, OFFICE], 0.5)
    assert not verdict.supported and verdict.reason == "says the sources lack the answer"


@pytest.mark.parametrize(
    "text",
    [
        "Weekends do not count toward the limit [1].",
        "Mật khẩu không chứa tên của bạn [1].",
        "The policy does not include contractors [1].",
    ],
)
def test_ordinary_negative_claims_are_not_declines(text: str) -> None:
    assert not declined(text)


def test_a_toned_sentence_is_checked_with_its_tones() -> None:
    from rag.verify import Draft, judge

    source = hit("Chạy ứng dụng trên cổng khác bằng lệnh make run PORT=8502. Cửa sổ dòng lệnh của bạn cần "
                 "quyền ghi vào thư mục dữ liệu, ngày chẵn hay lẻ cũng vậy.")
    # Folded, "cửa"/"của", "ngày"… collide and this copy of the prompt's worked example looked supported.
    copied = judge(Draft("Hầm xe cũng đóng cửa vào các ngày lễ [1].", [1], 0, 0), [source], 0.5)
    assert not copied.supported
    folded = content_words("Hầm xe cũng đóng cửa vào các ngày lễ")
    assert len(folded & content_words(source.content)) / len(folded) >= 0.5  # what the folded check accepted
    faithful = judge(Draft("Chạy ứng dụng trên cổng khác bằng lệnh make run PORT=8502 [1].", [1], 0, 0), [source], 0.5,
                     "lam sao chay ung dung tren cong khac")
    assert faithful.supported, faithful.reason


def test_a_citation_and_a_full_stop_close_the_sentence() -> None:
    text = "Hầm xe cũng đóng cửa vào các ngày lễ [1]. mendatang ```bash make run PORT=8502 ```"
    assert raw_sentences(text) == ["Hầm xe cũng đóng cửa vào các ngày lễ [1].",
                                   "mendatang ```bash make run PORT=8502 ```"]
    source = hit("Chạy ứng dụng trên cổng khác bằng make run PORT=8502 trong thư mục dự án.")
    answer = verify_answer("lam sao chay ung dung tren cong khac", "1], " + text, [source], support_threshold=0.5,
                           show_unsupported=False, embedder=None, language="vi")
    assert answer.status == "extractive"  # the copied example is unsupported, the code tail cites nothing


# --- a labelled set of real model sentences (tests/data/verify_labelled.json)


def test_verification_on_real_sentences_labelled_by_hand() -> None:
    """What verification lets through, on 68 sentences the Qwen models wrote (each alone, as the
    first sentence of its answer): before the question-share and any-heading rules it passed 10,
    4 right and 6 wrong (3 copied headings or other topics); then 7, 4 right and 3 wrong; with
    a citation repaired on a number found in another source and "0.8" read as "0.80", 10: 7
    right (2 of them re-cited to the source holding their numbers) and 3 wrong; with one new word
    enough (counted by stem) and a sentence that hardly touches its cited source re-cited, 11: 8
    right and 3 wrong. The second batch (40 first sentences of answers the 0.5B had verified on the
    visible answer samples, 25 right and 15 wrong) passes 24 right and 11 wrong: what verification
    cannot see is a number taken from the wrong row of a list and a true sentence that does not answer."""
    import json

    from .conftest import ROOT

    data = json.loads((ROOT / "tests" / "data" / "verify_labelled.json").read_text(encoding="utf-8"))
    passed: dict[str, int] = {"right": 0, "unsupported": 0, "wrong": 0}
    for item in data["items"]:
        sources = [Hit(chunk_id=n, document_id=n, source=f"doc{n}.md", title=s["title"], section=s["section"],
                       content=s["content"], char_from=0, char_to=len(s["content"]), page=None, distance=0.2)
                   for n, s in enumerate(item["sources"], start=1)]
        drafts = draft_answer(item["sentence"], len(sources))[0]
        judged = judge_sentences(drafts, sources, 0.5, item["question"])[0]
        recited = item.get("recited")
        label = recited["label"] if recited and judged.citations == [recited["source"]] else item["label"]
        if judged.supported:
            passed[label] += 1
    assert passed["unsupported"] == 0  # no invented claim passes (of 28)
    assert passed["wrong"] <= 14  # of 40: restricted questions answered, wrong list rows, true non-answers
    assert passed["right"] >= 32  # of 40: most right sentences of the first batch echo or paraphrase freely
