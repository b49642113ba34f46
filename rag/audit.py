"""Chunker audits: measurements that need no model run and no golden set.

``audit_cuts`` is seed 004's cut-position audit: collect every valid boundary of a document
first (block ends and sentence ends), then count how many of a strategy's cuts fall outside
them. A cut that falls mid-sentence can split the one sentence that answers a question, and
then no embedding model can retrieve that answer.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rag.chunking import (
    DEFAULT_STRATEGY,
    CountTokens,
    Segment,
    chunk_document,
    document_segments,
    iter_blocks,
    split_sentences,
)
from rag.errors import RagError
from rag.records import Chunk, Extracted

if TYPE_CHECKING:
    from rag.config import Settings
    from rag.embedding import Embedder

_NO_SENTENCES = frozenset({"code", "table", "row", "heading"})
_BUDGETED = frozenset("CDEF")  # strategies whose size is a token budget


@dataclass(frozen=True, slots=True)
class CutAudit:
    """Where one strategy's cuts fall in one document."""

    strategy: str
    size: int | None  # character target (A/B/R windows; C-F budget counted in characters)
    budget: int | None  # token budget (C-F counted with the model's tokenizer)
    chunks: int
    boundaries: int  # valid boundaries found in the document
    cuts: int  # chunk ends other than the last one of each page or document
    outside: int  # cuts that are not at a valid boundary
    outside_pct: float
    outside_at: list[int] = field(default_factory=list)  # offsets of those cuts


def valid_boundaries(text: str, segments: Sequence[Segment]) -> set[int]:
    """Offsets where a cut keeps every sentence whole.

    The end of every block of the structure model (paragraph, heading, list item, table row,
    code fence, page) and of every sentence inside a text block (``split_sentences``).
    """
    ends: set[int] = set()
    for segment in segments:
        for block in iter_blocks(segment.blocks):
            ends.add(block.end)
            if block.kind not in _NO_SENTENCES and not block.children:
                ends.update(block.start + end for _, end in split_sentences(text[block.start : block.end]))
    return ends


def cut_positions(chunks: Sequence[Chunk]) -> list[int]:
    """Where each chunk ends, except the last chunk of each page (that end is no cut)."""
    return [c.char_to for c, following in itertools.pairwise(chunks) if c.page == following.page]


def audit_cuts(
    doc: Extracted,
    strategy: str = DEFAULT_STRATEGY,
    *,
    size: int | None = None,
    budget: int | None = None,
    count_tokens: CountTokens | None = None,
    max_tokens: int = 256,
) -> CutAudit:
    """Count a strategy's cuts that fall outside every paragraph and sentence boundary.

    Args:
        strategy: one of ``rag.chunking.STRATEGIES``.
        size: character target. For A, B and R it replaces their window (512 / 1000); for C-F
            the budget is then counted in characters, as in seed 004's 1000-character runs.
        budget: token budget for C-F when ``size`` is not given (needs ``count_tokens``).
        count_tokens: the embedding model's token counter; characters when omitted.
        max_tokens: the encoder window (only sets the ``truncated`` flags, which are not used).

    Raises:
        ValueError: for an unknown strategy, or C-F with neither ``size`` nor ``budget``.
    """
    if strategy in _BUDGETED and size is None and (budget is None or count_tokens is None):
        raise ValueError("strategies C-F need a character size, or a token budget and a tokenizer")
    if size is not None and strategy in _BUDGETED:
        chunks = chunk_document(doc, strategy=strategy, budget=size, count_tokens=len, max_tokens=size)
    else:
        chunks = chunk_document(
            doc, strategy=strategy, budget=budget or 1, count_tokens=count_tokens or len, max_tokens=max_tokens,
            size=size,
        )
    valid = valid_boundaries(doc.text, document_segments(doc))
    cuts = cut_positions(chunks)
    outside = [cut for cut in cuts if cut not in valid]
    return CutAudit(
        strategy=strategy,
        size=size,
        budget=budget if size is None and strategy in _BUDGETED else None,
        chunks=len(chunks),
        boundaries=len(valid),
        cuts=len(cuts),
        outside=len(outside),
        outside_pct=round(100.0 * len(outside) / len(cuts), 1) if cuts else 0.0,
        outside_at=outside,
    )


def describe_cut(text: str, offset: int, width: int = 30) -> str:
    """A cut shown in context: ``…words before|words after…`` on one line."""
    before = text[max(0, offset - width) : offset].replace("\n", "⏎")
    after = text[offset : offset + width].replace("\n", "⏎")
    return f"…{before}|{after}…"



# ---------------------------------------------------------------------------------------------
# Auditing a stored document (the Chunks page): no file access, the stored canonical text


def stored_extracted(row: Any) -> Extracted:
    """A stored document row back as the ``Extracted`` the chunker reads (no file access).

    Markdown front matter is found again so the body starts where ingest started it. PDF page
    spans are not stored, so a PDF is audited as one page.
    """
    from rag.extract import split_front_matter

    text = row["canonical_text"] or ""
    metadata: dict[str, Any] = {}
    body_start = 0
    if row["extractor"] == "markdown":
        metadata, body_start = split_front_matter(text)
    return Extracted(text, row["title"], row["extractor"] or "text", row["extractor_version"] or "", body_start,
                     (), metadata)


def audit_document(row: Any, strategy: str, model: Embedder, settings: Settings) -> CutAudit:
    """The cut-position audit of a stored document under ``strategy``, in the model's tokens.

    Raises:
        RagError: for a strategy ``audit_cuts`` refuses (its message, for the page to show).
    """
    from rag.ingest import chunk_budget  # rag.ingest is heavier than this module; only this needs it

    try:
        return audit_cuts(
            stored_extracted(row), strategy, budget=chunk_budget(settings, model),
            count_tokens=model.count_tokens, max_tokens=model.max_tokens,
        )
    except ValueError as e:
        raise RagError(str(e)) from e


def audit_table(text: str, audit: CutAudit) -> list[dict[str, Any]]:
    """One row per cut that falls outside every sentence and block boundary, with its context."""
    return [{"offset": offset, "cut in context": describe_cut(text, offset)} for offset in audit.outside_at]
