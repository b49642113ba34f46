"""Chunking: canonical text -> chunks with exact offsets (placeholder paragraph chunker).

Interface kept stable for the structure-aware chunker: ``chunk_document(...) -> list[Chunk]``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from rag.models import Chunk, Extracted

CHUNKER_VERSION = "0"
STRATEGIES = ("A", "B", "C", "D", "E", "F", "R")
DEFAULT_STRATEGY = "E"

_PARAGRAPH = re.compile(r"\S(?:.*?\S)?(?=\n[ \t]*\n|\s*\Z)", re.DOTALL)
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$")


def default_budget(max_tokens: int) -> int:
    """Chunk budget in tokens for an encoder window of ``max_tokens`` (header included)."""
    return max(32, int(max_tokens * 0.8))


def chunk_document(
    doc: Extracted,
    *,
    strategy: str = DEFAULT_STRATEGY,
    budget: int,
    count_tokens: Callable[[str], int],
    max_tokens: int,
) -> list[Chunk]:
    """Split ``doc`` into chunks of at most ``budget`` tokens at paragraph boundaries."""
    text = doc.text
    sections: list[str] = []
    pieces: list[tuple[int, int, str]] = []
    for match in _PARAGRAPH.finditer(text, doc.body_start):
        heading = _HEADING.match(match.group(0))
        if heading:
            level = len(heading.group(1))
            sections = sections[: level - 1] + [heading.group(2).strip()]
            continue
        pieces.append((match.start(), match.end(), " > ".join([doc.title, *sections])))
    chunks: list[Chunk] = []
    start = end = -1
    section = ""

    def flush() -> None:
        if start < 0:
            return
        content = text[start:end]
        embedded = f"{section}\n\n{content}"
        tokens = count_tokens(embedded)
        chunks.append(Chunk(len(chunks), section, content, embedded, start, end, None, tokens, tokens > max_tokens))

    for p_from, p_to, p_section in pieces:
        if start >= 0 and (p_section != section or count_tokens(f"{section}\n\n{text[start:p_to]}") > budget):
            flush()
            start = -1
        if start < 0:
            start, section = p_from, p_section
        end = p_to
    flush()
    return chunks
