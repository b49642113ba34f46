"""The structure-aware chunker: exact offsets, structure rules, strategies, sentences.

Fast tests count tokens as whitespace words (+2 special tokens, like the fake embedder);
tests marked ``slow`` use the real all-MiniLM-L6-v2 tokenizer.
"""

from __future__ import annotations

import itertools
import json
import re
import unicodedata
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rag import chunking
from rag.chunking import (
    STRATEGIES,
    chunk_document,
    compact_rules,
    default_budget,
    destroyed_needles,
    document_segments,
    split_sentences,
)
from rag.extract import canonical, extract
from rag.records import Chunk, Extracted, PageSpan

from .conftest import shared_eval_or_skip


def words(text: str) -> int:
    """Fake tokenizer: whitespace words plus [CLS] and [SEP]."""
    return len(text.split()) + 2


def chunk(doc: Extracted, strategy: str = "E", budget: int = 40, max_tokens: int = 80, **kw: int) -> list[Chunk]:
    return chunk_document(doc, strategy=strategy, budget=budget, count_tokens=words, max_tokens=max_tokens, **kw)


def markdown(text: str, title: str = "Guide", body_start: int = 0) -> Extracted:
    return Extracted(text, title, "markdown", "1", body_start)


def plain(text: str, title: str = "Notes") -> Extracted:
    return Extracted(text, title, "text", "1")


def sentences_of(text: str) -> list[str]:
    return [text[a:b] for a, b in split_sentences(text)]


def assert_exact_and_ordered(doc: Extracted, chunks: Sequence[Chunk]) -> None:
    for index, c in enumerate(chunks):
        assert c.ordinal == index
        assert c.content == doc.text[c.char_from : c.char_to]
        assert c.content.strip() == c.content and c.content
        assert c.section
    for a, b in itertools.pairwise(chunks):
        assert a.char_from <= b.char_from and a.char_to < b.char_to


def coverage(doc: Extracted, chunks: Sequence[Chunk]) -> list[int]:
    counts = [0] * len(doc.text)
    for c in chunks:
        for i in range(c.char_from, c.char_to):
            counts[i] += 1
    return counts


def assert_covered_once(doc: Extracted, chunks: Sequence[Chunk]) -> None:
    counts = coverage(doc, chunks)
    for i, ch in enumerate(doc.text):
        if i < doc.body_start:
            assert counts[i] == 0, "front matter is never chunk text"
        elif not ch.isspace():
            assert counts[i] == 1, f"character {i} ({ch!r}) covered {counts[i]} times"


# ---------------------------------------------------------------------------------------------
# Sentences


def test_sentences_keep_numbers_versions_abbreviations_urls_and_file_names() -> None:
    text = (
        "The threshold is 0.675 in v2.1 of the tool, e.g. for Dr. Smith and Mr. Jones. "
        "See https://example.org/a.b/c.html for details. Edit config.toml, i.e. the file. "
        "K. Davis wrote it! Did he? Yes…"
    )
    assert sentences_of(text) == [
        "The threshold is 0.675 in v2.1 of the tool, e.g. for Dr. Smith and Mr. Jones.",
        "See https://example.org/a.b/c.html for details.",
        "Edit config.toml, i.e. the file.",
        "K. Davis wrote it!",
        "Did he?",
        "Yes…",
    ]


def test_sentences_vietnamese() -> None:
    text = (
        "Chunking quyết định chất lượng retrieval. Đường cắt rơi giữa câu 98% số lần! "
        "Ở mức 0.675, nó bịa mười lần trên ba mươi? Ừ… Ngưỡng ở TP. Hồ Chí Minh là 1.000 ký tự."
    )
    assert sentences_of(text) == [
        "Chunking quyết định chất lượng retrieval.",
        "Đường cắt rơi giữa câu 98% số lần!",
        "Ở mức 0.675, nó bịa mười lần trên ba mươi?",
        "Ừ…",
        "Ngưỡng ở TP. Hồ Chí Minh là 1.000 ký tự.",
    ]


def test_sentences_break_at_blank_lines_and_list_items_but_not_at_their_numbers() -> None:
    text = "Steps to follow:\n1. Open a terminal.\n2. Run it\nand wait\n\nNo final stop here\nNext line"
    assert sentences_of(text) == [
        "Steps to follow:",
        "1. Open a terminal.",
        "2. Run it\nand wait",
        "No final stop here\nNext line",
    ]


def test_sentences_across_hard_wrapped_lines() -> None:
    text = "   This document obsoletes RFC\n   4122.  It was approved by the IESG.\n"
    assert sentences_of(text) == ["This document obsoletes RFC\n   4122.", "It was approved by the IESG."]


@given(st.lists(st.sampled_from([*"ab Ạđ.!?…\n\t 1:,\"”)", "e.g.", "Dr.", "0.5", "A."]), max_size=80).map("".join))
def test_sentence_spans_are_ordered_trimmed_and_cover_every_character(text: str) -> None:
    spans = split_sentences(text)
    covered = [0] * len(text)
    previous_end = 0
    for start, end in spans:
        assert previous_end <= start < end
        assert not text[start].isspace() and not text[end - 1].isspace()
        for i in range(start, end):
            covered[i] += 1
        previous_end = end
    assert all(covered[i] == 1 for i, ch in enumerate(text) if not ch.isspace())


# ---------------------------------------------------------------------------------------------
# Generated Markdown documents (hypothesis)

WORD = st.sampled_from(
    ["alpha", "beta", "gamma", "Lỗi", "đường", "cắt", "retrieval", "0.675", "v2.1", "e.g.", "config.toml", "Dr.",
     "https://x.org/a.b", "`code`", "**bold**", "{% tag %}", "PTO", "đo", "ABC"]
)
SENTENCE = st.builds(
    lambda ws, end: " ".join(ws) + end,
    st.lists(WORD, min_size=1, max_size=10),
    st.sampled_from([".", "!", "?", "…", ""]),
)
FEW_WORDS = st.lists(WORD, min_size=1, max_size=3).map(" ".join)


@st.composite
def paragraph(draw: st.DrawFn) -> str:
    text = " ".join(draw(st.lists(SENTENCE, min_size=1, max_size=7)))
    wrap = draw(st.integers(min_value=0, max_value=3))  # hard-wrapped like benefits.md, or one long line
    return re.sub(r" ", "\n", text, count=wrap) if wrap else text


@st.composite
def markdown_doc(draw: st.DrawFn) -> tuple[str, int, list[str], list[str]]:
    """(text, body_start, fences, table header rows)."""
    blocks: list[str] = []
    fences: list[str] = []
    heads: list[str] = []
    for _ in range(draw(st.integers(min_value=1, max_value=9))):
        kind = draw(st.sampled_from(["para", "para", "heading", "setext", "fence", "list", "list_fence", "table",
                                     "quote"]))
        if kind == "para":
            blocks.append(draw(paragraph()))
        elif kind == "heading":
            level = draw(st.integers(min_value=1, max_value=4))
            blocks.append("#" * level + " " + draw(FEW_WORDS))
        elif kind == "setext":
            blocks.append(draw(FEW_WORDS) + "\n" + draw(st.sampled_from(["===", "---"])))
        elif kind in ("fence", "list_fence"):
            marker = draw(st.sampled_from(["```", "~~~"]))
            body = "\n".join(draw(FEW_WORDS) for _ in range(draw(st.integers(1, 3))))
            fence = f"{marker}sh\n{body}\n{marker}"
            if kind == "list_fence":
                fence = "\n".join("   " + line for line in fence.split("\n"))
                blocks.append("1. " + draw(SENTENCE) + "\n\n" + fence)
            else:
                blocks.append(fence)
            fences.append(fence.strip())
        elif kind == "list":
            marker = draw(st.sampled_from(["-", "*", "1."]))
            items = draw(st.lists(SENTENCE, min_size=1, max_size=8))
            blocks.append(draw(SENTENCE) + ":")  # the lead-in
            blocks.append("\n".join(f"{marker} {item}" for item in items))
        elif kind == "table":
            names = st.sampled_from(["Date", "Item", "Owner", "Đơn vị"])
            cells = draw(st.lists(names, min_size=2, max_size=3, unique=True))
            head = "| " + " | ".join(cells) + " |"
            rows = [
                "| " + " | ".join(" ".join(draw(st.lists(WORD, min_size=1, max_size=6))) for _ in cells) + " |"
                for _ in range(draw(st.integers(min_value=1, max_value=10)))
            ]
            blocks.append("\n".join([head, "|" + "|".join("-" * draw(st.integers(3, 40)) for _ in cells) + "|", *rows]))
            heads.append(head)
        else:
            blocks.append("\n".join("> " + line for line in draw(paragraph()).split("\n")))
    front = draw(st.sampled_from(["", "---\ntitle: Guide\nkeywords: [a, b]\n---\n", "---\n---\n\n"]))
    return front + "\n\n".join(blocks) + draw(st.sampled_from(["", "\n"])), len(front), fences, heads


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(markdown_doc(), st.integers(min_value=30, max_value=90))
def test_generated_markdown_every_strategy(generated: tuple[str, int, list[str], list[str]], budget: int) -> None:
    text, body_start, fences, heads = generated
    doc = markdown(text, body_start=body_start)
    segments = document_segments(doc)
    heading_starts = [b.start for s in segments for b in s.blocks if b.kind == "heading"]
    other_starts = sorted(b.start for s in segments for b in s.blocks if b.kind != "heading")
    for strategy in STRATEGIES:
        chunks = chunk(doc, strategy, budget=budget, max_tokens=2 * budget)
        assert_exact_and_ordered(doc, chunks)
        for c in chunks:
            assert c.token_count == words(c.text) and c.truncated == (c.token_count > 2 * budget)
            assert c.char_from >= body_start
        if strategy in "ACER":
            if strategy != "R":
                assert_covered_once(doc, chunks)
        else:
            counts = coverage(doc, chunks)
            assert all(counts[i] >= 1 for i in range(body_start, len(text)) if not text[i].isspace())
        if strategy not in "CDEF":
            continue
        for c in chunks:
            assert not c.truncated
            assert c.token_count <= budget or c.kind == "code"
            if strategy in "EF" and not re.search(r"-{4,}|={4,}", c.content):
                header, _, body = c.text.partition("\n\n")
                assert body == c.content or body.endswith("\n" + c.content)  # + a repeated table header
                assert set(header.split(" > ")) <= set(c.section.split(" > "))  # the path, maybe shortened
            # A heading closes the chunk: inside a chunk, a heading may only follow other headings.
            for h in heading_starts:
                if c.char_from < h < c.char_to:
                    assert not [s for s in other_starts if c.char_from <= s < h]
        for fence in fences:
            at = text.index(fence)
            assert any(c.char_from <= at and at + len(fence) <= c.char_to for c in chunks), "fence split"
        for head in heads:
            at = text.index(head)
            table_end = text.find("\n\n", at)
            table_end = len(text) if table_end < 0 else table_end
            for c in chunks:
                if c.char_from < table_end and c.char_to > at + len(head):
                    assert head in c.text, "a table piece without its header row"


@SETTINGS
@given(st.lists(st.sampled_from([*"ab #`|->*~=_\n\t .1:", "```", "\n\n", "- ", "| a |", "ệ"]), max_size=200)
       .map("".join), st.sampled_from(["markdown", "text", "html"]))
def test_arbitrary_text_gives_exact_slices_covering_everything(raw: str, extractor: str) -> None:
    text = canonical(raw)
    doc = Extracted(text, "T", extractor, "1")
    for strategy in "ACE":
        chunks = chunk(doc, strategy, budget=12, max_tokens=24)
        assert_exact_and_ordered(doc, chunks)
        assert_covered_once(doc, chunks)


# ---------------------------------------------------------------------------------------------
# Structure rules (examples)

GUIDE = """---
title: Leave policy
keywords: [leave]
---
# Leave policy

Everyone gets leave.

## Annual leave

You earn four hours each pay period.
Hard-wrapped lines
belong to one paragraph.

### Carry over

Up to 240 hours carry over.

Setext section
--------------

Text under a setext heading.
"""


def test_sections_front_matter_title_and_headings() -> None:
    doc = extract(Path("leave.md"), GUIDE.encode())
    chunks = chunk(doc, "E", budget=200, max_tokens=256)
    assert doc.body_start == GUIDE.index("# Leave policy")
    assert [c.section for c in chunks] == [
        "Leave policy",  # the H1 repeats the front-matter title: not a level of its own
        "Leave policy > Annual leave",
        "Leave policy > Annual leave > Carry over",
        "Leave policy > Setext section",
    ]
    assert chunks[1].content == (
        "## Annual leave\n\nYou earn four hours each pay period.\nHard-wrapped lines\nbelong to one paragraph."
    )
    assert chunks[1].text == "Leave policy > Annual leave\n\n" + chunks[1].content
    assert all("title:" not in c.content for c in chunks)
    assert [c.section for c in chunk(doc, "C", budget=200, max_tokens=256)] == [c.section for c in chunks]
    # C embeds the content alone, rules (the setext underline) shortened
    assert [c.text for c in chunk(doc, "C", budget=200, max_tokens=256)] == [compact_rules(c.content) for c in chunks]
    assert "Setext section\n---\n" in chunks[-1].text


def test_headings_without_body_ride_on_to_the_next_chunk() -> None:
    doc = markdown("## Benefits\n\n### Health\n\nPlans start on day one.\n")
    (only,) = chunk(doc, "E", budget=200, max_tokens=256)
    assert only.content.startswith("## Benefits") and only.section == "Guide > Benefits > Health"


def test_long_paragraph_is_cut_at_sentences_and_short_ones_are_never_cut() -> None:
    long = " ".join(f"Sentence number {i} has five words." for i in range(12))
    doc = markdown(f"Short intro paragraph here.\n\n{long}\n\nA closing paragraph.")
    chunks = chunk(doc, "C", budget=22, max_tokens=40)
    assert len(chunks) >= 4
    assert chunks[0].content.startswith("Short intro paragraph here.")
    assert chunks[-1].content.endswith("A closing paragraph.")
    assert all(re.search(r"words\.$|here\.$|paragraph\.$", c.content) for c in chunks)  # sentence ends only
    assert all(words(c.text) <= 22 for c in chunks)


def test_list_stays_with_its_lead_in() -> None:
    intro = " ".join(["word"] * 20) + "."
    items = "\n".join(f"- item {i} here" for i in range(4))
    doc = markdown(f"{intro}\n\nTo apply, do this:\n\n{items}\n")
    chunks = chunk(doc, "C", budget=30, max_tokens=60)
    assert chunks[0].content == intro
    assert chunks[1].content.startswith("To apply, do this:") and chunks[1].content.endswith("- item 3 here")
    assert chunks[1].kind == "list"


def test_long_table_is_split_by_rows_with_the_header_in_every_piece() -> None:
    rows = "\n".join(f"| 2025-0{i % 9 + 1} | deadline number {i} for the team |" for i in range(30))
    table = "| Date       | Item                     |\n|------------|--------------------------|\n" + rows
    doc = markdown(f"## Dates\n\n{table}\n")
    for strategy in "CE":
        chunks = chunk(doc, strategy, budget=40, max_tokens=80)
        assert len(chunks) > 3
        for c in chunks:
            assert c.kind == "table"
            assert "| Date       | Item                     |\n|---|---|" in c.text
            assert c.content == doc.text[c.char_from : c.char_to]
        assert chunks[0].content.startswith("## Dates\n\n| Date")
        assert chunks[1].content.startswith("| 2025-")


def test_fences_are_atomic_and_a_fence_beyond_the_window_is_cut_at_lines() -> None:
    small = "```python\n" + "\n".join(f"x{i} = {i}" for i in range(10)) + "\n```"
    doc = markdown(f"Run this:\n\n{small}\n\nDone.")
    chunks = chunk(doc, "E", budget=20, max_tokens=60)
    (code,) = [c for c in chunks if "```python" in c.content]
    assert code.content.endswith(small) and code.kind == "code"
    assert code.token_count > 20 and not code.truncated  # atomic above the budget, within the window

    huge = "```\n" + "\n".join(f"line {i} of a long listing" for i in range(60)) + "\n```"
    doc = markdown(huge)
    chunks = chunk(doc, "E", budget=40, max_tokens=80)
    assert len(chunks) > 1 and not any(c.truncated for c in chunks)
    assert all(c.kind == "code" for c in chunks)
    assert all(doc.text[c.char_to : c.char_to + 1] in ("\n", "") for c in chunks)  # cut at line ends only


def test_fence_indented_under_a_list_item_is_not_split() -> None:
    fence = "   ```sh\n   git config --global gpg.format ssh\n   git config --global commit.gpgsign true\n   ```"
    text = "1. Tell git to use SSH keys:\n\n" + fence + "\n2. Next step\n"
    chunks = chunk(markdown(text), "E", budget=12, max_tokens=40)
    assert any(fence.strip() in c.content for c in chunks)


def test_compact_rules_only_in_embedded_text() -> None:
    table = "| A | B |\n|" + "-" * 300 + "|" + "-" * 200 + "|\n| 1 | 2 |"
    assert compact_rules(table) == "| A | B |\n|---|---|\n| 1 | 2 |"
    assert compact_rules("+-+-+-+-+\n| x |") == "+-+\n| x |"
    (c,) = chunk(markdown(table), "E", budget=40, max_tokens=80)
    assert c.content == table and "---|---" in c.text and "-" * 4 not in c.text


def test_plain_text_headings_and_rfc_numbering() -> None:
    text = (
        "Grep trước, embedding tính sau\n\nMở đầu ngắn gọn.\n\nChỗ grep thắng\n\nThân bài một.\n\n"
        "Bức tranh tổng thể: hai pipeline#\nThân bài hai.\n\n5.7.  UUID Version 7\n\n   Body of 5.7.\n\n"
        "                 Figure 1: A centred caption\n\n   More body.\n"
    )
    doc = plain(text, title="Grep trước, embedding tính sau")
    headings = [b for s in document_segments(doc) for b in s.blocks if b.kind == "heading"]
    assert [(h.level, h.title) for h in headings] == [
        (0, "Grep trước, embedding tính sau"),
        (1, "Chỗ grep thắng"),
        (1, "Bức tranh tổng thể: hai pipeline"),
        (2, "5.7. UUID Version 7"),
    ]
    chunks = chunk(doc, "E", budget=200, max_tokens=256)
    assert [c.section for c in chunks] == [
        "Grep trước, embedding tính sau",
        "Grep trước, embedding tính sau > Chỗ grep thắng",
        "Grep trước, embedding tính sau > Bức tranh tổng thể: hai pipeline",
        "Grep trước, embedding tính sau > Bức tranh tổng thể: hai pipeline > 5.7. UUID Version 7",
    ]
    assert "Figure 1" in chunks[-1].content


def test_nfd_input_is_normalised_and_offsets_stay_exact() -> None:
    nfc_text = "Lỗi retrieval\n\nĐường cắt rơi giữa câu. Ở mức ngưỡng, hệ thống từ chối.\n"
    data = unicodedata.normalize("NFD", nfc_text).encode()
    assert data != nfc_text.encode()
    doc = extract(Path("bai.txt"), data)
    assert doc.text == nfc_text
    for strategy in STRATEGIES:
        chunks = chunk(doc, strategy, budget=8, max_tokens=20)
        assert_exact_and_ordered(doc, chunks)
        assert all(unicodedata.is_normalized("NFC", c.content) for c in chunks)
    assert [c.content for c in chunk(doc, "C", budget=9, max_tokens=20)] == [
        "Lỗi retrieval\n\nĐường cắt rơi giữa câu.",  # the title line stays with what follows
        "Ở mức ngưỡng, hệ thống từ chối.",
    ]


def make_pdf(pages: list[str]) -> bytes:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("helvetica", size=12)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 10, text)
    return bytes(pdf.output())


def test_pdf_chunks_never_span_pages() -> None:
    pages = [" ".join(f"Page {p} sentence {i} is here." for i in range(12)) for p in (1, 2, 3)]
    doc = extract(Path("report.pdf"), make_pdf(pages))
    assert len(doc.pages) == 3
    for strategy in STRATEGIES:
        chunks = chunk(doc, strategy, budget=30, max_tokens=60, **({"size": 120} if strategy in "ABR" else {}))
        assert_exact_and_ordered(doc, chunks)
        assert {c.page for c in chunks} == {1, 2, 3}
        for c in chunks:
            span = doc.pages[c.page - 1]
            assert span.char_from <= c.char_from and c.char_to <= span.char_to
            assert f"Page {c.page} " in c.content


def test_page_spans_of_a_hand_built_document() -> None:
    text = "First page text. More.\n\nSecond page text."
    doc = Extracted(text, "T", "pdf", "1", 0, (PageSpan(1, 0, 22), PageSpan(2, 24, len(text))))
    chunks = chunk(doc, "E", budget=200, max_tokens=256)
    assert [(c.page, c.content) for c in chunks] == [(1, "First page text. More."), (2, "Second page text.")]


# ---------------------------------------------------------------------------------------------
# Strategies


def test_blind_strategies_cut_every_512_characters() -> None:
    text = "x" * 1500
    a = chunk(markdown(text), "A")
    assert [(c.char_from, c.char_to) for c in a] == [(0, 512), (512, 1024), (1024, 1500)]
    b = chunk(markdown(text), "B")
    assert [(c.char_from, c.char_to) for c in b] == [(0, 512), (448, 1024), (960, 1500)]
    assert all(c.text == c.content for c in a + b)


def test_boundary_overlap_stays_within_section_and_64_characters() -> None:
    body = " ".join(f"Sentence {i} is short." for i in range(40))
    doc = markdown(f"## One\n\n{body}\n\n## Two\n\n{body}\n")
    plain_chunks = chunk(doc, "E", budget=30, max_tokens=60)
    for strategy in "DF":
        chunks = chunk(doc, strategy, budget=30, max_tokens=60)
        assert_exact_and_ordered(doc, chunks)
        for previous, current in itertools.pairwise(chunks):
            overlap = previous.char_to - current.char_from
            if previous.section != current.section:
                assert overlap <= 0
            else:
                assert 0 < overlap <= 64
                assert doc.text[current.char_from - 1].isspace()  # whole words
        assert not any(c.truncated for c in chunks)
    assert len(plain_chunks) >= 4


def test_recursive_baseline_windows_and_overlap() -> None:
    paragraphs = [" ".join(f"w{p}x{i}" for i in range(40)) for p in range(12)]
    text = "\n\n".join(paragraphs)
    chunks = chunk(markdown(text), "R")
    assert_exact_and_ordered(markdown(text), chunks)
    assert all(len(c.content) <= 1000 for c in chunks)
    for previous, current in itertools.pairwise(chunks):
        assert previous.char_to - current.char_from <= 100
    assert all(c.content.startswith("w") and c.content.endswith(tuple("0123456789")) for c in chunks)


def test_unknown_strategy_and_bad_budget_are_refused() -> None:
    with pytest.raises(ValueError, match="choose one of A, B, C, D, E, F, R"):
        chunk(markdown("text"), "Z")
    with pytest.raises(ValueError, match="budget"):
        chunk(markdown("text"), "E", budget=0)


def test_default_budget_leaves_room_in_the_window() -> None:
    assert default_budget(256) == 204
    assert default_budget(10) == 32


def test_empty_body_gives_no_chunks() -> None:
    assert chunk(markdown("---\ntitle: x\n---\n", body_start=16)) == []


# ---------------------------------------------------------------------------------------------
# Answers destroyed


def test_destroyed_needles_uses_the_relevance_rule_on_single_chunks() -> None:
    contents = {"a.md": ["You earn four\n  HOURS each pay period.", "Carry over up to"], "b.md": ["240 hours."]}
    needles = [
        ("a.md", "you earn four hours each pay period"),  # case and whitespace differ: kept
        ("a.md", "Carry over up to 240 hours."),  # spans two chunks (and sources): destroyed
        ("b.md", "You earn four hours"),  # present, but in another source: destroyed
        ("c.md", "anything"),  # no chunks at all
    ]
    assert destroyed_needles(contents, needles) == needles[1:]


# ---------------------------------------------------------------------------------------------
# Shared corpora


def test_corpus_vi_heading_rule_finds_the_39_headings() -> None:
    root = shared_eval_or_skip() / "corpus_vi"
    found = 0
    for path in sorted(root.glob("*.txt")):
        doc = extract(path)
        found += sum(b.kind == "heading" for s in document_segments(doc) for b in s.blocks)
    assert found == 39


def test_rfc9562_sections_are_its_numbered_titles() -> None:
    doc = extract(shared_eval_or_skip() / "rfc9562" / "rfc9562.txt")
    headings = [b for s in document_segments(doc) for b in s.blocks if b.kind == "heading"]
    titles = [h.title for h in headings]
    assert "5.7. UUID Version 7" in titles and "B.2. Example of a UUIDv8 Value (Name-Based)" in titles
    assert not any(t.startswith("Figure") for t in titles)
    chunks = chunk(doc, "E", budget=200, max_tokens=256)
    assert any(c.section.endswith("5. UUID Layouts > 5.7. UUID Version 7") for c in chunks)


def _corpus_docs(root: Path) -> list[tuple[str, Extracted]]:
    from rag.ingest import discover

    return [(f.source, extract(f.path)) for f in discover([root])]


@pytest.mark.slow
@pytest.mark.parametrize("corpus", ["corpus_handbook", "corpus_vi", "rfc9562"])
def test_shared_corpora_with_minilm_default_budget(corpus: str, real_embedder) -> None:  # type: ignore[no-untyped-def]
    docs = _corpus_docs(shared_eval_or_skip() / corpus)
    budget = default_budget(real_embedder.max_tokens)
    for strategy in "CE":
        for _, doc in docs:
            chunks = chunk_document(doc, strategy=strategy, budget=budget, count_tokens=real_embedder.count_tokens,
                                    max_tokens=real_embedder.max_tokens)
            assert_exact_and_ordered(doc, chunks)
            assert_covered_once(doc, chunks)
            assert not [c for c in chunks if c.truncated], f"{strategy}: truncated chunks"
            for c in chunks[:5]:
                assert c.token_count == real_embedder.count_tokens(c.text)


@pytest.mark.slow
def test_handbook_needles_survive_strategy_e(real_embedder) -> None:  # type: ignore[no-untyped-def]
    root = shared_eval_or_skip()
    golden = json.loads((root / "golden_handbook.json").read_text(encoding="utf-8"))
    needles = [(e["source"], e["quote"]) for item in golden for e in item["evidence"]]
    count, window = real_embedder.count_tokens, real_embedder.max_tokens
    contents = {
        source: [c.content for c in chunk_document(doc, budget=204, count_tokens=count, max_tokens=window)]
        for source, doc in _corpus_docs(root / "corpus_handbook")
    }
    assert len(needles) == 35
    assert destroyed_needles(contents, needles) == []
    blind = {
        source: [c.content for c in chunk_document(doc, strategy="A", budget=204, count_tokens=words, max_tokens=256)]
        for source, doc in _corpus_docs(root / "corpus_handbook")
    }
    assert destroyed_needles(blind, needles)  # blind cuts do destroy answers (seed 000)


def test_module_constants() -> None:
    assert chunking.CHUNKER_VERSION == "1"
    assert STRATEGIES == ("A", "B", "C", "D", "E", "F", "R") and chunking.DEFAULT_STRATEGY == "E"


def test_sentence_windows_by_hand() -> None:
    import dataclasses

    from rag.chunking import sentence_windows, window_text
    from rag.records import Chunk

    text = "One two three. Four five six. Seven eight nine. Ten."
    assert sentence_windows(text, 30) == [(0, 29), (30, 52)]  # whole sentences, at most 30 characters
    assert sentence_windows(text, 10) == [(0, 14), (15, 29), (30, 47), (48, 52)]  # a long one stands alone
    assert sentence_windows(text, 100) == []  # the chunk is one window already
    assert sentence_windows(text, 0) == []
    chunk = Chunk(0, "Guide > Start", text, f"Guide > Start\n\n{text}", 0, len(text))
    assert window_text(chunk, (30, 47)) == "Guide > Start\nSeven eight nine."
    assert window_text(dataclasses.replace(chunk, text=text), (48, 52)) == "Ten."
