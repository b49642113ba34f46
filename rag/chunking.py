"""Chunking: canonical text -> chunks whose offsets are found in the text, never accumulated.

Every chunk has two texts (seed 000): ``content`` is exactly ``doc.text[char_from:char_to]``
and is the only thing a user is shown or quoted; ``text`` is what gets embedded and indexed:
for E/F a contextual header ``Title > H1 > H2``, a blank line, then the content (plus the
table's header row and separator when the chunk continues a split table).

Strategies (seed 000's six, plus a baseline):

- ``A`` blind 512-character windows; ``B`` = A + 64 characters of overlap;
- ``C`` structure boundaries: a heading closes the chunk, a paragraph is cut only when it alone
  exceeds the budget (then at sentences, lines, whitespace), fences are atomic, long tables
  are split by rows, a list stays with its lead-in where the budget allows;
- ``D`` = C + 64-character overlap; ``E`` = C + contextual header (default); ``F`` = E + overlap;
- ``R`` the recursive character splitter most frameworks default to (paragraph -> newline ->
  sentence -> space, 1000 characters, 100 overlap), for comparison.

The budget is counted with the embedding model's own tokenizer and includes the header. Each
block (and each sentence of an over-long block) is counted once and the counts are summed;
each chunk's final ``text`` is counted once more to set ``token_count`` and to catch a
tokenizer whose counts do not add up (that chunk is then split again).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from markdown_it import MarkdownIt
from markdown_it.tree import SyntaxTreeNode

from rag.extract import MARKDOWN_EXTRACTORS
from rag.records import Chunk, Extracted
from rag.text import relevance_norm

CHUNKER_VERSION = "1"
STRATEGIES = ("A", "B", "C", "D", "E", "F", "R")
DEFAULT_STRATEGY = "E"

BLIND_CHARS = 512  # seed 000: strategy A cuts every 512 characters
OVERLAP_CHARS = 64  # seed 000: B, D and F copy the previous chunk's last 64 characters
RECURSIVE_CHARS = 1000  # the recursive splitter's common framework default
RECURSIVE_OVERLAP = 100

CountTokens = Callable[[str], int]

_HEADER_STRATEGIES = frozenset("EF")
_OVERLAP_STRATEGIES = frozenset("BDF")
_BOUNDARY_STRATEGIES = frozenset("CDEF")


def default_budget(max_tokens: int) -> int:
    """Chunk budget in tokens for an encoder window of ``max_tokens`` (header included).

    80 % of the window: the remaining fifth absorbs the 64-character overlap of D/F and the
    atomic blocks (code fences, table rows) that may exceed the budget but must still fit the
    window. 204 tokens for all-MiniLM-L6-v2 (256).
    """
    return max(32, int(max_tokens * 0.8))


# ---------------------------------------------------------------------------------------------
# Sentences
#
# Written by hand: no kept library splits Vietnamese and English sentences with offsets
# (nltk/pysbd/syntok are not dependencies, and none of them knows Vietnamese abbreviations).

_SENTENCE_END = re.compile(r"[.!?…。！？]+[\"'”’»)\]*_`]*")
_CLOSERS = "\"'”’»)]*_`"
# Always a boundary: a blank line, or a new line that starts a list item or an ATX heading.
_HARD_BREAK = re.compile(r"\n[ \t]*\n|\n(?=[ \t]*(?:[-*+•]|\d{1,3}[.)])[ \t]+\S|#{1,6}[ \t])")
_ABBREVIATIONS = frozenset({
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "cf", "e.g", "i.e", "fig", "figs", "no", "nos", "eq",
    "eqs", "sec", "ch", "vol", "pp", "approx", "inc", "ltd", "co", "corp", "dept", "univ", "u.s", "u.k", "a.m",
    "p.m", "al", "ca", "resp", "ph.d",
    "tp", "ts", "ths", "pgs", "gs", "bs", "ks",  # Vietnamese: thành phố, tiến sĩ, thạc sĩ, giáo sư, bác sĩ, kỹ sư
})
# "1", "5.7", "A.1": list or section numbers at the start of a line. At most three digits, so a
# year or an RFC number wrapped onto a new line ("RFC\n   4122.  It ...") still ends a sentence.
_MARKER_WORD = re.compile(r"(?:\d{1,3}|[A-Za-z])(?:\.\d+)*")


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Sentence spans ``(start, end)`` in ``text``, trimmed of surrounding whitespace.

    A sentence ends at ``. ! ? …`` (and their CJK forms, plus closing quotes or brackets) followed
    by whitespace and a character that is not lower case; ``0.675``, ``v2.1``, URLs and file names
    such as ``config.toml`` never split because no whitespace follows their dots. Abbreviations
    (``e.g.``, ``i.e.``, ``Dr.``, ``Mr.``, ``TP.``), initials (``K. Davis``) and list or section
    numbers at the start of a line (``1.``, ``5.7.``) do not end a sentence. A blank line, a
    list item or a heading on a new line always does.
    """
    cuts = {m.start() for m in _HARD_BREAK.finditer(text)}
    cuts.update(m.end() for m in _SENTENCE_END.finditer(text) if _ends_sentence(text, m.start(), m.end()))
    spans: list[tuple[int, int]] = []
    previous = 0
    for cut in [*sorted(cuts), len(text)]:
        start, end = _trim(text, previous, cut)
        if start < end:
            spans.append((start, end))
        previous = max(previous, cut)
    return spans


def sentence_windows(content: str, size: int) -> list[tuple[int, int]]:
    """Spans of whole consecutive sentences of ``content``, each at most ``size`` characters (a longer
    sentence stands alone), for the window vectors of issue 16: a short needle inside a long chunk
    gets a vector of its own neighbourhood instead of being diluted by the whole chunk.

    A chunk that fits in one window gets none (its own vector already is that window), and so does
    ``size`` 0.
    """
    if size <= 0:
        return []
    windows: list[tuple[int, int]] = []
    for start, end in split_sentences(content):
        if windows and end - windows[-1][0] <= size:
            windows[-1] = (windows[-1][0], end)
        else:
            windows.append((start, end))
    return windows if len(windows) > 1 else []


def window_text(chunk: Chunk, span: tuple[int, int]) -> str:
    """What a window embeds: the chunk's contextual header (its ``text`` before the content) and the
    window's sentences, as the chunk's own ``text`` is header + content."""
    at = chunk.text.rfind(chunk.content) if chunk.content else -1
    header = chunk.text[:at].strip() if at > 0 else ""
    body = chunk.content[span[0] : span[1]]
    return f"{header}\n{body}" if header else body


def _ends_sentence(text: str, start: int, end: int) -> bool:
    size = len(text)
    if end < size and not text[end].isspace():
        return False
    following = end
    while following < size and text[following].isspace():
        following += 1
    if following == size:
        return True
    if text[following].islower() or text[following] in ",;:)]}":
        return False
    if text[start:end].rstrip(_CLOSERS) != ".":
        return True  # "!", "?", "…" or "..." end a sentence whatever precedes them
    word_start = start
    while word_start > 0 and not text[word_start - 1].isspace():
        word_start -= 1
    word = text[word_start:start].lstrip("\"'“‘«([*_`")
    if not word:
        return True
    if word.casefold() in _ABBREVIATIONS or (len(word) == 1 and word.isupper()):
        return False
    if _MARKER_WORD.fullmatch(word):
        before = word_start
        while before > 0 and text[before - 1] in " \t-*+•>":
            before -= 1
        if before == 0 or text[before - 1] == "\n":
            return False
    return True


def _trim(text: str, start: int, end: int) -> tuple[int, int]:
    """Narrow ``[start, end)`` to its first and last non-whitespace characters."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


# ---------------------------------------------------------------------------------------------
# Block model


@dataclass(frozen=True, slots=True)
class Block:
    """A structural block of the canonical text; ``start``/``end`` are trimmed offsets.

    ``kind``: "heading" (top level only), "text", "list", "quote", "code", "table" or "row"
    (a table line; the first two rows of a table are its header and separator).
    """

    start: int
    end: int
    kind: str
    level: int = 0  # heading level (0 = a plain-text document's title line)
    title: str = ""  # heading text without markup
    children: tuple[Block, ...] = ()


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of text chunked on its own: the body after front matter, or one PDF page."""

    start: int
    end: int
    page: int | None
    blocks: tuple[Block, ...]


# CommonMark plus GFM pipe tables. markdown-it-py gives every block its source line range,
# which is all we need to find exact offsets; a higher nesting limit keeps deep lists parsed.
# Inline parsing is switched off: only the block structure is used, and it is most of the cost.
_MARKDOWN = MarkdownIt("commonmark", {"maxNesting": 100}).enable("table").disable(["inline", "text_join"])
_NEWLINE = re.compile(r"\r\n|\r|\n")  # markdown-it counts lines the same way
_BLANK_LINE = re.compile(r"\n[ \t]*\n")

_PLAIN_LIST = re.compile(r"\s*(?:[-*+\u2022]|\d+[.)])\s+")
_PLAIN_END = (".", ",", ";", ":", "!", "?", "\u2026")
_PLAIN_CODE = re.compile(r"[{}();=<>`$|]")
_NUMBERED_TITLE = re.compile(r"((?:\d+|[A-Z])(?:\.\d+)*)\.[ \t]+\S.*")  # RFC style: "5.7.  UUID Version 7"
_WHITESPACE = re.compile(r"\s+")


def document_segments(doc: Extracted) -> list[Segment]:
    """The document's block structure: one segment for the body, or one per PDF page."""
    markdown = doc.extractor in MARKDOWN_EXTRACTORS
    spans: list[tuple[int | None, int, int]]
    if doc.pages:
        spans = [(p.page, p.char_from, p.char_to) for p in doc.pages]
    else:
        spans = [(None, doc.body_start, len(doc.text))]
    segments = []
    for index, (page, start, end) in enumerate(spans):
        if markdown:
            blocks = markdown_blocks(doc.text, start, end)
        else:
            blocks = plain_blocks(doc.text, start, end, title_line=index == 0)
        segments.append(Segment(start, end, page, tuple(blocks)))
    return segments


def markdown_blocks(text: str, start: int, end: int) -> list[Block]:
    """Top-level blocks of Markdown ``text[start:end]`` (front matter must lie before ``start``)."""
    body = text[start:end]
    line_starts = [0, *(m.end() for m in _NEWLINE.finditer(body))]

    def span(line_map: tuple[int, int]) -> tuple[int, int]:
        first, last = line_map
        stop = line_starts[last] if last < len(line_starts) else len(body)
        return _trim(text, start + line_starts[min(first, len(line_starts) - 1)], start + stop)

    def convert(node: SyntaxTreeNode, top: bool) -> Block | None:
        if node.map is None:
            return None
        s, e = span(node.map)
        if s >= e:
            return None
        kind = node.type
        if kind == "heading" and top:
            title = node.children[0].content if node.children else ""
            return Block(s, e, "heading", int(node.tag[1]), _collapse(title))
        if kind in ("fence", "code_block"):
            return Block(s, e, "code")
        if kind == "table":
            first, last = node.map
            rows = [span((line, line + 1)) for line in range(first, last)]
            return Block(s, e, "table", children=tuple(Block(a, b, "row") for a, b in rows if a < b))
        if kind in ("bullet_list", "ordered_list", "list_item", "blockquote"):
            children = tuple(b for b in (convert(c, False) for c in node.children) if b is not None)
            return Block(s, e, "quote" if kind == "blockquote" else "list", children=children)
        return Block(s, e, "text")  # paragraph, html_block, hr, a heading nested in a list

    root = SyntaxTreeNode(_MARKDOWN.parse(body))
    blocks = [b for b in (convert(node, True) for node in root.children) if b is not None]
    return _fill_gaps(text, start, end, blocks)


def _fill_gaps(text: str, start: int, end: int, blocks: list[Block]) -> list[Block]:
    """Keep every character: text no block claims (link definitions, say) becomes paragraphs."""
    out: list[Block] = []
    cursor = start
    for block in sorted(blocks, key=lambda b: b.start):
        if block.start < cursor:  # never overlap a previous block
            if block.end <= cursor:
                continue
            block = dataclasses.replace(block, start=cursor)
        out.extend(_paragraphs(text, cursor, block.start))
        out.append(block)
        cursor = block.end
    out.extend(_paragraphs(text, cursor, end))
    return out


def _paragraphs(text: str, start: int, end: int) -> Iterator[Block]:
    cursor = start
    for m in [*_BLANK_LINE.finditer(text, start, end), None]:
        stop = m.start() if m else end
        s, e = _trim(text, cursor, stop)
        if s < e:
            yield Block(s, e, "text")
        if m:
            cursor = m.end()


def plain_blocks(text: str, start: int, end: int, *, title_line: bool = True) -> list[Block]:
    """Blocks of plain text: paragraphs between blank lines, headings found by heuristics.

    The heading rule of ../shared/eval/README.md: the first non-blank line (the title, unless it
    is longer than 100 characters or ends in punctuation, as ``extract_plain`` decides), a line
    ending in ``#`` (a leftover anchor), or a standalone line between blank lines of at most 100
    characters with no final punctuation, list marker or code characters. Such a standalone line
    must also start at column 0: RFC figure captions are indented and are not section titles.
    RFC-style numbered titles (``5.7.  UUID Version 7``, ``A.1.  ...``) get their depth as level.
    """
    lines = []
    cursor = start
    for m in [*re.finditer(r"\n", text[start:end]), None]:
        stop = start + m.start() if m else end
        lines.append((cursor, stop))
        cursor = start + m.end() if m else end
    blank = [not text[a:b].strip() for a, b in lines]
    first = next((i for i, is_blank in enumerate(blank) if not is_blank), -1) if title_line else -1
    headings: dict[int, tuple[int, str]] = {}
    for i, (a, b) in enumerate(lines):
        if blank[i]:
            continue
        raw = text[a:b]
        stripped = raw.strip()
        standalone = (i == 0 or blank[i - 1]) and (i + 1 == len(lines) or blank[i + 1])
        if i == first and len(stripped) <= 100 and not stripped.endswith(_PLAIN_END):
            headings[i] = (0, stripped)  # a first line that reads like a sentence is no title
        elif len(stripped) > 1 and stripped.endswith("#") and not stripped[-2].isspace():
            headings[i] = (1, stripped.rstrip("#").strip())
        elif standalone and not raw[0].isspace() and len(stripped) <= 100 and not stripped.endswith(_PLAIN_END):
            numbered = _NUMBERED_TITLE.fullmatch(stripped)
            if numbered:
                headings[i] = (numbered.group(1).count(".") + 1, stripped)
            elif not _PLAIN_LIST.match(raw) and not _PLAIN_CODE.search(stripped):
                headings[i] = (1, stripped)
    blocks: list[Block] = []
    group: list[int] = []

    def close_group() -> None:
        if group:
            blocks.append(_plain_paragraph(text, [lines[i] for i in group]))
            group.clear()

    for i, (a, b) in enumerate(lines):
        if blank[i] or i in headings:
            close_group()
            if i in headings:
                s, e = _trim(text, a, b)
                level, title = headings[i]
                blocks.append(Block(s, e, "heading", level, _collapse(title)))
            continue
        group.append(i)
    close_group()
    return blocks


_DRAWING = frozenset("+-|=*/\\_<>^~:")


def _is_figure(value: str) -> bool:
    """ASCII art (RFC bit layouts, boxed tables): mostly drawing characters, several lines.

    Such a block is preformatted like a code fence: kept whole where the window allows, since
    its lines mean nothing apart, and it costs about a token per character.
    """
    ink = [ch for ch in value if not ch.isspace()]
    return value.count("\n") >= 2 and sum(ch in _DRAWING for ch in ink) >= 0.3 * len(ink)


def _is_rule_line(value: str) -> bool:
    stripped = value.strip()
    return len(stripped) >= 3 and not stripped.strip("+-=|:")


def _plain_paragraph(text: str, lines: list[tuple[int, int]]) -> Block:
    """A paragraph; one with list-marker lines is a list whose items start at those lines."""
    s, e = _trim(text, lines[0][0], lines[-1][1])
    if _is_figure(text[s:e]):
        # Rows end at border lines ("+----+"): the places to cut a figure too big for the window.
        cuts = [b for a, b in lines[:-1] if _is_rule_line(text[a:b])]
        bounds = [s, *cuts, e]
        rows = [_trim(text, a, b) for a, b in itertools.pairwise(bounds)]
        return Block(s, e, "code", children=tuple(Block(a, b, "row") for a, b in rows if a < b))
    starts = [a for a, b in lines if _PLAIN_LIST.match(text[a:b])]
    if not starts:
        return Block(s, e, "text")
    if starts[0] > lines[0][0]:
        starts.insert(0, lines[0][0])
    children = []
    for index, a in enumerate(starts):
        stop = starts[index + 1] if index + 1 < len(starts) else e
        cs, ce = _trim(text, a, stop)
        if cs < ce:
            children.append(Block(cs, ce, "text"))
    return Block(s, e, "list", children=tuple(children))


def _collapse(value: str) -> str:
    return _WHITESPACE.sub(" ", value).strip()


def iter_blocks(blocks: Sequence[Block]) -> Iterator[Block]:
    """Every block and all its descendants, in document order."""
    for block in blocks:
        yield block
        yield from iter_blocks(block.children)


# ---------------------------------------------------------------------------------------------
# Section paths


def _enter_heading(stack: dict[int, str], block: Block) -> None:
    """A heading closes every open heading of its level or deeper."""
    for level in [lv for lv in stack if lv >= block.level]:
        del stack[level]
    stack[block.level] = block.title


def _section_path(title: str, stack: Mapping[int, str]) -> str:
    """``Title > H1 > H2``; a title line or H1 that repeats the document title is not a level."""
    key = relevance_norm(title)
    levels = [t for _, t in sorted(stack.items()) if t and relevance_norm(t) != key]
    return " > ".join([title, *levels] if title else levels)


def section_marks(doc: Extracted, segments: Sequence[Segment]) -> tuple[list[int], list[str]]:
    """Heading offsets and the section path that starts at each, for offset -> section lookups."""
    title = _collapse(doc.title)
    stack: dict[int, str] = {}
    offsets = [0]
    paths = [_section_path(title, stack)]
    for segment in segments:
        for block in segment.blocks:
            if block.kind == "heading":
                _enter_heading(stack, block)
                offsets.append(block.start)
                paths.append(_section_path(title, stack))
    return offsets, paths


def _section_at(marks: tuple[list[int], list[str]], offset: int) -> str:
    offsets, paths = marks
    return paths[bisect.bisect_right(offsets, offset) - 1]


# ---------------------------------------------------------------------------------------------
# Entry point


@dataclass(frozen=True, slots=True)
class _Draft:
    """A chunk whose offsets are decided; ``text`` is composed from it."""

    start: int
    end: int
    section: str
    page: int | None
    kind: str
    header: str = ""  # contextual header line (E/F)
    table_head: str = ""  # header row + separator repeated in a table piece's embedded text
    section_id: int = 0  # D/F overlap never reaches across a heading
    compact: bool = False  # C-F: embed rules in their short form (compact_rules)


def _compose(text: str, draft: _Draft) -> str:
    body = text[draft.start : draft.end]
    if draft.table_head:
        body = f"{draft.table_head}\n{body}"
    if draft.compact:
        body = compact_rules(body)
    return f"{draft.header}\n\n{body}" if draft.header else body


# A run of one rule character, or an ASCII-art border such as "+-+-+-+".
_RULE_RUN = re.compile(r"([-=_~*+])\1{3,}|(?:\+-){2,}\+?")


def compact_rules(text: str) -> str:
    """Shorten rules (runs of ``-=_~*+`` and ``+-+-+`` borders) to three characters.

    Used for the embedded ``text`` of C-F only; ``content`` keeps the exact source. Hand-padded
    Markdown tables carry delimiter rows of hundreds of dashes and RFC figures are drawn with
    them, and the tokenizer reads each dash as a token: one delimiter row in
    performance-management/index.md alone is over 600 tokens, more than the encoder window,
    and an RFC 9562 bit layout drops from about 395 tokens to 85. The rules mean nothing to
    the model.
    """
    return _RULE_RUN.sub(lambda m: m.group()[:3], text)


# No tokenizer reads more than this many characters per token on average. WordPiece turns a
# "word" longer than 100 characters into one [UNK], so a 1 MB run without spaces would count as
# a few tokens and pass as one untruncated chunk; bounding the count by length makes the chunker
# cut it and flag what the encoder cannot read.
MAX_CHARS_PER_TOKEN = 16


def _bounded_counter(count_tokens: CountTokens) -> CountTokens:
    def count(text: str) -> int:
        return max(count_tokens(text), len(text) // MAX_CHARS_PER_TOKEN)

    return count


def chunk_document(
    doc: Extracted,
    *,
    strategy: str = DEFAULT_STRATEGY,
    budget: int,
    count_tokens: CountTokens,
    max_tokens: int,
    size: int | None = None,
) -> list[Chunk]:
    """Split ``doc`` into chunks (see the module docstring for the strategies).

    Args:
        strategy: one of ``STRATEGIES``.
        budget: most tokens of a chunk's embedded ``text``, header included (C-F).
        count_tokens: the embedding model's token count, special tokens included.
        max_tokens: the encoder window; a chunk whose ``text`` is longer is flagged ``truncated``.
        size: a character target for A, B and R instead of 512 / 1000 (the cut audit's ``--size``).

    Returns:
        Chunks in document order, ``ordinal`` from 0, ``content == doc.text[char_from:char_to]``.

    Raises:
        ValueError: for an unknown strategy, a budget below one token or a size below two.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown chunking strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if budget < 1:
        raise ValueError(f"the chunk budget must be at least 1 token, got {budget}")
    if size is not None and size < 2:
        raise ValueError(f"the chunk size must be at least 2 characters, got {size}")
    count_tokens = _bounded_counter(count_tokens)
    segments = document_segments(doc)
    drafts: list[tuple[_Draft, int | None]]
    if strategy in _BOUNDARY_STRATEGIES:
        drafts = [(d, n) for d, n in _boundary_drafts(doc, segments, strategy, budget, count_tokens, max_tokens)]
    else:
        marks = section_marks(doc, segments)
        kinds = _KindIndex.of(segments)
        spans: list[tuple[int, int, int | None]] = []
        for segment in segments:
            if strategy == "R":
                target = size or RECURSIVE_CHARS
                found = recursive_spans(doc.text, segment.start, segment.end, target,
                                        RECURSIVE_OVERLAP * target // RECURSIVE_CHARS)
            else:
                found = blind_spans(doc.text, segment.start, segment.end, size or BLIND_CHARS,
                                    OVERLAP_CHARS if strategy == "B" else 0)
            spans.extend((s, e, segment.page) for s, e in found)
        drafts = [(_Draft(s, e, _section_at(marks, s), page, kinds.kind(s, e)), None) for s, e, page in spans]
    chunks = []
    for ordinal, (draft, tokens) in enumerate(drafts):
        embedded = _compose(doc.text, draft)
        count = count_tokens(embedded) if tokens is None else tokens
        chunks.append(Chunk(ordinal, draft.section, doc.text[draft.start : draft.end], embedded, draft.start,
                            draft.end, draft.page, count, count > max_tokens, draft.kind))
    return chunks


@dataclass(frozen=True, slots=True)
class _KindIndex:
    """Chunk kind for any span, from the top-level blocks it overlaps (A, B and R)."""

    starts: list[int]
    ends: list[int]
    kinds: list[str]

    @staticmethod
    def of(segments: Sequence[Segment]) -> _KindIndex:
        blocks = [b for seg in segments for b in seg.blocks if b.kind != "heading"]
        return _KindIndex([b.start for b in blocks], [b.end for b in blocks], [_CHUNK_KIND[b.kind] for b in blocks])

    def kind(self, start: int, end: int) -> str:
        found = set(self.kinds[bisect.bisect_right(self.ends, start) : bisect.bisect_left(self.starts, end)])
        return found.pop() if len(found) == 1 else ("mixed" if found else "text")


_CHUNK_KIND = {"text": "text", "quote": "text", "list": "list", "code": "code", "table": "table", "row": "table",
               "heading": "heading"}


# ---------------------------------------------------------------------------------------------
# A, B: blind windows; R: recursive character splitter


def blind_spans(text: str, start: int, end: int, size: int, overlap: int = 0) -> list[tuple[int, int]]:
    """Windows of ``size`` characters from ``start``, each also reaching ``overlap`` back.

    Blind by design (seed 000): cuts fall mid-word; only whitespace at the edges is trimmed.
    """
    spans = []
    for cut in range(start, end, size):
        own_start, own_end = _trim(text, cut, min(end, cut + size))
        if own_start < own_end:  # a window of nothing but whitespace would only repeat the overlap
            spans.append((_trim(text, max(start, cut - overlap), own_end)[0], own_end))
    return spans


_RECURSIVE_LEVELS = ("paragraph", "line", "sentence", "space", "char")
_SPACE_RUN = re.compile(r"\s+")


def recursive_spans(text: str, start: int, end: int, size: int, overlap: int) -> list[tuple[int, int]]:
    """The recursive character splitter (paragraph -> newline -> sentence -> space -> character).

    Same algorithm as LangChain's ``RecursiveCharacterTextSplitter`` (split at the coarsest
    separator, recurse into pieces of ``size`` or more, merge neighbours up to ``size`` keeping
    up to ``overlap`` characters of the previous chunk), written here over offsets because no
    kept library does it with exact offsets: langchain-text-splitters is not a dependency, and
    its ``add_start_index`` finds offsets by searching for the chunk's text, which is ambiguous
    wherever a passage repeats.
    """
    spans: list[tuple[int, int]] = []
    for s, e in _recurse(text, start, end, size, overlap, 0):
        s, e = _trim(text, s, e)
        if s < e and (not spans or spans[-1] != (s, e)):
            spans.append((s, e))
    return spans


def _recurse(text: str, start: int, end: int, size: int, overlap: int, level: int) -> list[tuple[int, int]]:
    separator = _RECURSIVE_LEVELS[level]
    if separator == "char":
        step = max(1, size - overlap)
        return [(p, min(end, p + size)) for p in range(start, end, step) if p == start or p + overlap < end]
    if separator == "sentence":
        cuts = [start + s for s, _ in split_sentences(text[start:end])][1:]
    else:
        pattern = _BLANK_LINE if separator == "paragraph" else (_NEWLINE if separator == "line" else _SPACE_RUN)
        cuts = [m.end() for m in pattern.finditer(text, start, end) if start < m.end() < end]
    bounds = [start, *cuts, end]
    out: list[tuple[int, int]] = []
    small: list[tuple[int, int]] = []
    for a, b in itertools.pairwise(bounds):
        if a >= b:
            continue
        if b - a < size:
            small.append((a, b))
            continue
        out.extend(_merge(small, size, overlap))
        small = []
        out.extend(_recurse(text, a, b, size, overlap, level + 1))
    out.extend(_merge(small, size, overlap))
    return out


def _merge(pieces: list[tuple[int, int]], size: int, overlap: int) -> list[tuple[int, int]]:
    """Greedy merge of contiguous pieces up to ``size`` characters, carrying ``overlap`` back."""
    out = []
    window: list[tuple[int, int]] = []
    total = 0
    for a, b in pieces:
        length = b - a
        if window and total + length > size:
            out.append((window[0][0], window[-1][1]))
            while window and (total > overlap or total + length > size):
                total -= window[0][1] - window[0][0]
                window.pop(0)
        window.append((a, b))
        total += length
    if window:
        out.append((window[0][0], window[-1][1]))
    return out


# ---------------------------------------------------------------------------------------------
# C-F: structure boundaries


@dataclass(frozen=True, slots=True)
class _Context:
    text: str
    count_tokens: CountTokens
    specials: int  # tokens of the empty string ([CLS] and [SEP] for BERT-style models)
    budget: int
    max_tokens: int

    def tokens(self, start: int, end: int) -> int:
        """Tokens of a span as embedded, without the special tokens, so spans can be summed."""
        return max(0, self.count_tokens(compact_rules(self.text[start:end])) - self.specials)


@dataclass(frozen=True, slots=True)
class _Unit:
    """The smallest piece the packer places: a block, or a part of an over-long block."""

    start: int
    end: int
    tokens: int
    kind: str  # chunk kind; "heading" and "lead" (a list's lead-in) take their neighbours' kind
    keep_with_next: bool = False  # a heading or a lead-in: do not cut right after it
    head: tuple[int, int] | None = None  # the table's header row + separator, for table rows
    head_tokens: int = 0

    @property
    def continues_table(self) -> bool:
        return self.head is not None and self.start >= self.head[1]


def _boundary_drafts(
    doc: Extracted, segments: Sequence[Segment], strategy: str, budget: int, count_tokens: CountTokens,
    max_tokens: int,
) -> list[tuple[_Draft, int]]:
    ctx = _Context(doc.text, count_tokens, count_tokens(""), budget, max_tokens)
    title = _collapse(doc.title)
    stack: dict[int, str] = {}
    path = _section_path(title, stack)
    with_header = strategy in _HEADER_STRATEGIES
    # D/F: room for the overlap, about 4 characters per token; the overlap is dropped where it
    # would still push a chunk past the window.
    reserve = OVERLAP_CHARS // 4 if strategy in _OVERLAP_STRATEGIES else 0
    drafts: list[tuple[_Draft, int]] = []
    section_id = 0
    headings: list[Block] = []  # headings waiting for their section's first chunk
    body: list[Block] = []
    for segment in segments:
        for block in segment.blocks:
            if block.kind != "heading":
                body.append(block)
                continue
            if body:  # a heading closes the chunk; headings with no body ride on to the next one
                drafts.extend(
                    _section_drafts(ctx, headings, body, path, segment.page, section_id, with_header, reserve)
                )
                headings, body = [], []
                section_id += 1
            _enter_heading(stack, block)
            path = _section_path(title, stack)
            headings.append(block)
        if headings or body:  # a page break closes the chunk too: chunks never span pages
            drafts.extend(_section_drafts(ctx, headings, body, path, segment.page, section_id, with_header, reserve))
            headings, body = [], []
    if strategy in _OVERLAP_STRATEGIES:
        atomic = sorted((b.start, b.end) for seg in segments for b in iter_blocks(seg.blocks)
                        if b.kind in ("code", "table"))
        drafts = _add_overlap(ctx, drafts, atomic)
    return drafts


def _section_drafts(
    ctx: _Context, headings: list[Block], blocks: list[Block], path: str, page: int | None, section_id: int,
    with_header: bool, reserve: int,
) -> list[tuple[_Draft, int]]:
    header, header_tokens = _header_line(ctx, path) if with_header else ("", 0)
    room = max(1, ctx.budget - ctx.specials - header_tokens - reserve)
    window = max(room, ctx.max_tokens - ctx.specials - header_tokens - reserve)
    units: list[_Unit] = []
    for heading in headings:
        units.extend(dataclasses.replace(u, keep_with_next=True)
                     for u in _leaf_units(ctx, heading.start, heading.end, room, "heading", ("line", "space", "char")))
    units.extend(_sequence_units(ctx, blocks, room, window, None))
    drafts: list[tuple[_Draft, int]] = []
    for group in _pack(units, room):
        drafts.extend(_emit(ctx, group, path, header, page, section_id))
    return drafts


def _header_line(ctx: _Context, path: str) -> tuple[str, int]:
    """The contextual header and its tokens, at most a quarter of the budget.

    A deep or freak path (a whole sentence taken for a title line) is shortened to the title and
    the innermost heading, then to the innermost heading, then word by word.
    """
    limit = max(1, ctx.budget // 4)
    levels = path.split(" > ")
    candidates = [path, " > ".join([levels[0], levels[-1]]), levels[-1]] if len(levels) > 1 else [path]
    for header in candidates:
        tokens = ctx.count_tokens(header) - ctx.specials
        if tokens <= limit:
            return header, max(0, tokens)
    while tokens > limit and header:
        kept = header.split()
        header = " ".join(kept[: max(0, min(len(kept) - 1, len(kept) * limit // (tokens + 1)))])
        tokens = ctx.count_tokens(header) - ctx.specials if header else 0
    return header, max(0, tokens)


def _sequence_units(
    ctx: _Context, blocks: Sequence[Block], room: int, window: int, inherited: str | None
) -> list[_Unit]:
    """Units of sibling blocks; a paragraph followed by a list, table or fence is its lead-in."""
    units: list[_Unit] = []
    for index, block in enumerate(blocks):
        kind = inherited if inherited and block.kind not in ("code", "table") else _CHUNK_KIND[block.kind]
        found = _block_units(ctx, block, room, window, kind)
        following = blocks[index + 1] if index + 1 < len(blocks) else None
        if found and block.kind == "text" and following is not None and following.kind in ("list", "table", "code"):
            found = [dataclasses.replace(u, kind="lead" if inherited is None else u.kind) for u in found]
            found[-1] = dataclasses.replace(found[-1], keep_with_next=True)
        units.extend(found)
    return units


def _block_units(ctx: _Context, block: Block, room: int, window: int, kind: str) -> list[_Unit]:
    tokens = ctx.tokens(block.start, block.end)
    if block.kind == "code":
        if tokens <= window:
            return [_Unit(block.start, block.end, tokens, "code")]  # atomic, even above the budget
        # Last resort: a fence or figure longer than the encoder window would be truncated
        # silently, so it is cut at its rows (figures) or lines into pieces that fit the window.
        if len(block.children) > 1:
            return [u for row in _partition(ctx.text, block)
                    for u in _leaf_units(ctx, row.start, row.end, window, "code", ("line", "space", "char"))]
        return _leaf_units(ctx, block.start, block.end, window, "code", ("line", "space", "char"), tokens)
    if tokens <= room:
        return [_Unit(block.start, block.end, tokens, kind)]
    if block.kind == "table" and len(block.children) >= 3:
        return _table_units(ctx, block, room, window)
    if block.children:
        parts = _partition(ctx.text, block)
        return _sequence_units(ctx, parts, room, window, "list" if block.kind == "list" else kind)
    return _leaf_units(ctx, block.start, block.end, room, kind, ("sentence", "line", "space", "char"), tokens)


def _partition(text: str, block: Block) -> list[Block]:
    """The block's children stretched to tile it exactly (list markers and prefixes included)."""
    cuts = [block.start]
    for child in block.children[1:]:
        cuts.append(min(max(child.start, cuts[-1]), block.end))
    cuts.append(block.end)
    parts = []
    for child, a, b in zip(block.children, cuts, cuts[1:], strict=False):
        s, e = _trim(text, a, b)
        if s < e:
            parts.append(dataclasses.replace(child, start=s, end=e))
    return parts


def _table_units(ctx: _Context, table: Block, room: int, window: int) -> list[_Unit]:
    """Rows of a table too long for one chunk; every piece's text repeats header + separator."""
    rows = _partition(ctx.text, table)
    head = (rows[0].start, rows[1].end)
    head_tokens = ctx.tokens(*head)
    units = [_Unit(head[0], head[1], head_tokens, "table", keep_with_next=True)]
    row_room = max(1, room - head_tokens)
    for row in rows[2:]:
        for unit in _leaf_units(ctx, row.start, row.end, row_room, "table", ("space", "char")):
            units.append(dataclasses.replace(unit, head=head, head_tokens=head_tokens))
    return units


def _leaf_units(
    ctx: _Context, start: int, end: int, limit: int, kind: str, levels: tuple[str, ...], tokens: int | None = None
) -> list[_Unit]:
    """Cut an over-long span at the first level that works: sentences, lines, whitespace, characters."""
    if tokens is None:
        tokens = ctx.tokens(start, end)
    if tokens <= limit or not levels:
        return [_Unit(start, end, tokens, kind)]
    level = levels[0]
    if level == "sentence":
        pieces = [(start + s, start + e) for s, e in split_sentences(ctx.text[start:end])]
    elif level == "line":
        pieces = [_trim(ctx.text, a, b) for a, b in _line_spans(ctx.text, start, end)]
        pieces = [(a, b) for a, b in pieces if a < b]
    else:
        pieces = _proportional_pieces(ctx.text, start, end, tokens, limit, at_space=level == "space")
    if len(pieces) <= 1:
        return _leaf_units(ctx, start, end, limit, kind, levels[1:], tokens)
    # Whitespace and character windows are estimates: a piece still too long is cut again.
    deeper = levels if level in ("space", "char") else levels[1:]
    return [u for a, b in pieces for u in _leaf_units(ctx, a, b, limit, kind, deeper)]


def _line_spans(text: str, start: int, end: int) -> Iterator[tuple[int, int]]:
    cursor = start
    for m in _NEWLINE.finditer(text, start, end):
        yield cursor, m.start()
        cursor = m.end()
    yield cursor, end


def _proportional_pieces(
    text: str, start: int, end: int, tokens: int, limit: int, *, at_space: bool
) -> list[tuple[int, int]]:
    """Cut a span into pieces of about ``limit`` tokens, assuming tokens spread evenly.

    Counting every word would cost one tokenizer call per word; this costs one per piece.
    """
    parts = max(2, math.ceil(tokens * 1.15 / limit))  # 15 % spare: tokens do not spread evenly
    step = (end - start) / parts
    spaces = [m.start() for m in _SPACE_RUN.finditer(text, start, end)] if at_space else []
    cuts = []
    previous = start
    for k in range(1, parts):
        target = start + round(k * step)
        if at_space:
            i = bisect.bisect_left(spaces, target)
            near = [p for p in (spaces[i - 1] if i else None, spaces[i] if i < len(spaces) else None) if p is not None]
            candidates = [p for p in near if previous < p < end]
            if not candidates:
                continue
            target = min(candidates, key=lambda p: abs(p - target))
        if previous < target < end:
            cuts.append(target)
            previous = target
    bounds = [start, *cuts, end]
    pieces = [_trim(text, a, b) for a, b in itertools.pairwise(bounds)]
    return [(a, b) for a, b in pieces if a < b]


def _pack(units: Sequence[_Unit], room: int) -> list[list[_Unit]]:
    """Greedy packing into groups of at most ``room`` tokens, never cutting after a keep-with-next unit.

    A unit that alone exceeds ``room`` (an atomic fence) forms its own group.
    """
    groups: list[list[_Unit]] = []
    current: list[_Unit] = []
    total = 0
    for unit in units:
        while current and total + unit.tokens + _repeat_cost(current[0]) > room:
            cut = len(current)
            while cut > 0 and current[cut - 1].keep_with_next:
                cut -= 1
            cut = cut or len(current)  # a lead-in that cannot travel with its list stays behind
            groups.append(current[:cut])
            current = current[cut:]
            total = sum(u.tokens for u in current)
        current.append(unit)
        total += unit.tokens
    if current:
        groups.append(current)
    return groups


def _repeat_cost(first: _Unit) -> int:
    return first.head_tokens if first.continues_table else 0


def _emit(
    ctx: _Context, group: list[_Unit], path: str, header: str, page: int | None, section_id: int
) -> list[tuple[_Draft, int]]:
    """Compose one chunk and count its final text once; split again if the sum was optimistic."""
    first = group[0]
    table_head = ctx.text[first.head[0] : first.head[1]] if first.head and first.continues_table else ""
    draft = _Draft(first.start, group[-1].end, path, page, _group_kind(group), header, table_head, section_id, True)
    tokens = ctx.count_tokens(_compose(ctx.text, draft))
    if tokens > ctx.budget and len(group) > 1:
        half = sum(u.tokens for u in group) / 2
        running = 0
        cut = 1
        for index, unit in enumerate(group[:-1], start=1):
            running += unit.tokens
            cut = index
            if running >= half:
                break
        return _emit(ctx, group[:cut], path, header, page, section_id) + _emit(
            ctx, group[cut:], path, header, page, section_id
        )
    return [(draft, tokens)]


def _group_kind(group: Sequence[_Unit]) -> str:
    kinds = {u.kind for u in group} - {"heading", "lead"}
    if not kinds:
        return "text"
    return kinds.pop() if len(kinds) == 1 else "mixed"


def _add_overlap(
    ctx: _Context, drafts: list[tuple[_Draft, int]], atomic: Sequence[tuple[int, int]]
) -> list[tuple[_Draft, int]]:
    """D/F: start each chunk up to 64 characters (whole words) into its predecessor's tail.

    Only within one section and one page, so a chunk still never spans a heading or a page, and
    never from inside a table or code block, whose pieces would then travel without their
    header or fence. The content stays an exact slice, it just starts earlier.
    """
    out = [drafts[0]] if drafts else []
    for (previous, _), (draft, tokens) in itertools.pairwise(drafts):
        if previous.section_id == draft.section_id and previous.page == draft.page:
            start = _overlap_start(ctx.text, previous.start, previous.end, draft.start, atomic)
            if start < draft.start:
                wider = dataclasses.replace(draft, start=start)
                wider_tokens = ctx.count_tokens(_compose(ctx.text, wider))
                if wider_tokens <= ctx.max_tokens:
                    draft, tokens = wider, wider_tokens
        out.append((draft, tokens))
    return out


def _overlap_start(
    text: str, prev_start: int, prev_end: int, start: int, atomic: Sequence[tuple[int, int]]
) -> int:
    position = max(prev_start, prev_end - OVERLAP_CHARS)
    while position < prev_end and position > prev_start and not text[position - 1].isspace():
        position += 1  # whole words only
    index = bisect.bisect_right(atomic, (position, len(text) + 1)) - 1
    if index >= 0 and atomic[index][0] < position < atomic[index][1]:
        position = atomic[index][1]  # not from inside a table or a fence
    while position < prev_end and text[position].isspace():
        position += 1
    return position if position < prev_end else start


# ---------------------------------------------------------------------------------------------
# Evaluation helper


def destroyed_needles(
    chunk_contents: Mapping[str, Sequence[str]], needles: Sequence[tuple[str, str]]
) -> list[tuple[str, str]]:
    """The ``(source, needle)`` pairs that no single chunk of that source holds whole.

    A needle is kept only when ``relevance_norm(needle)`` lies inside ``relevance_norm`` of one
    chunk's ``content`` (never its embedded text) from the same source: the golden-set relevance
    rule of ../shared/eval/README.md. A destroyed needle cannot be retrieved by any model.

    Args:
        chunk_contents: source -> the contents of its chunks.
        needles: ``(source, quote)`` pairs.
    """
    normalised: dict[str, list[str]] = {}
    destroyed = []
    for source, needle in needles:
        if source not in normalised:
            normalised[source] = [relevance_norm(c) for c in chunk_contents.get(source, ())]
        key = relevance_norm(needle)
        if not any(key in content for content in normalised[source]):
            destroyed.append((source, needle))
    return destroyed
