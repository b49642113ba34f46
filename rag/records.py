"""Records: the plain, frozen data passed between pipeline stages (documents, chunks, hits, answers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class PageSpan:
    """Where one PDF page lies in a document's canonical text (1-based page number)."""

    page: int
    char_from: int
    char_to: int


@dataclass(frozen=True, slots=True)
class Extracted:
    """A document turned into canonical text (NFC, LF line endings).

    Offsets of chunks and citations always refer to ``text``.
    """

    text: str
    title: str
    extractor: str  # "markdown" | "text" | "html" | "pdf"
    extractor_version: str
    body_start: int = 0  # first offset after YAML front matter (0 when there is none)
    pages: tuple[PageSpan, ...] = ()  # PDF only
    metadata: dict[str, Any] = field(default_factory=dict)  # front matter / PDF info


@dataclass(frozen=True, slots=True)
class Chunk:
    """One retrievable passage.

    ``content`` is exactly ``canonical_text[char_from:char_to]`` and is what users see;
    ``text`` is what is embedded and indexed (contextual header + content).
    """

    ordinal: int
    section: str
    content: str
    text: str
    char_from: int
    char_to: int
    page: int | None = None
    token_count: int = 0
    truncated: bool = False
    kind: str = "text"  # "text" | "code" | "table" | "list" | "mixed"


@dataclass(frozen=True, slots=True)
class Collection:
    id: int
    name: str
    embedder: str
    dimension: int
    metric: str
    strategy: str
    max_distance: float | None  # calibrated gate threshold for this collection's model


@dataclass(frozen=True, slots=True)
class DocumentInfo:
    """A row of the documents table without its canonical text."""

    id: int
    collection: str
    source: str
    path: str
    title: str
    groups: list[str]
    status: str  # "pending" | "ok" | "failed"
    error: str | None
    chunk_count: int
    embedder: str | None
    pipeline_version: str | None
    extractor: str | None
    extractor_version: str | None
    stale: bool
    updated_at: str


@dataclass(frozen=True, slots=True)
class Hit:
    """A retrieved chunk with every ranking signal kept, so the UI can explain it."""

    chunk_id: int
    document_id: int
    source: str
    title: str
    section: str
    content: str
    char_from: int
    char_to: int
    page: int | None
    distance: float  # cosine distance (1 - cos) to the query; one distance everywhere
    dense_rank: int | None = None  # 1-based rank in the vector branch
    sparse_rank: int | None = None  # 1-based rank in the FTS5 branch
    fts_score: float | None = None  # FTS5 bm25() (lower is better)
    rrf_score: float = 0.0  # the fused score (settings.fusion: convex or RRF), best highest
    rerank_score: float | None = None
    rank_score: float | None = None  # the learned order's probability that it holds the answer (rag.ranker)
    gated_out_reason: str | None = None
    rerank_fallback: str | None = None  # why the rerank stage kept the fused order (timeout, error)


@dataclass(frozen=True, slots=True)
class Citation:
    """Built by the server from a hit; the model only ever writes ``[n]``."""

    n: int
    chunk_id: int
    title: str
    source: str
    section: str
    locator: str  # "#char=from,to" or "#page=N&char=from,to"
    char_from: int
    char_to: int
    page: int | None
    quote: str  # == chunk content, never the embedded text
    distance: float


@dataclass(frozen=True, slots=True)
class Sentence:
    """One sentence of a generated answer and whether a cited source supports it."""

    text: str
    citations: list[int]
    supported: bool
    support: float  # best support score against its cited sources
    reason: str = ""  # why it is not supported ("" when it is), for the dashboard


@dataclass(frozen=True, slots=True)
class Answer:
    status: str  # "answered" | "extractive" | "no_answer"
    question: str
    text: str
    citations: list[Citation] = field(default_factory=list)
    sentences: list[Sentence] = field(default_factory=list)
    grounded: bool = False
    llm_called: bool = False
    language: str = "en"
    message: str = ""  # why there is no answer, or a note on the answer
    hits: list[Hit] = field(default_factory=list)
    dropped: list[Hit] = field(default_factory=list)  # hits the gate turned away
    timings_ms: dict[str, float] = field(default_factory=dict)
    trace: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Retrieved:
    """Yielded by ``rag.ask.ask_stream`` once the gate has run, before the model writes.

    ``hits`` are the sources the model reads, numbered [1].. in order; ``dropped`` those the
    gate turned away. A page can show the source cards while the answer is still being written.
    """

    hits: list[Hit] = field(default_factory=list)
    dropped: list[Hit] = field(default_factory=list)
    language: str = "en"
    timings_ms: dict[str, float] = field(default_factory=dict)  # retrieve, rerank, gate so far
