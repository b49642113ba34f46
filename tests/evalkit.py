"""The evaluation tests' toy world: three documents written straight through the store, a golden
set over them, and a scripted retriever returning fixed hits per query and stage."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rag import evaluate, store
from rag.config import Settings
from rag.evaluate import EvalReport
from rag.golden import Golden
from rag.records import Chunk, Hit

from .fakes import FakeEmbedder

NEEDLE = "Between 3 and 15 years of service: 6 hours per pay period"

DOCS = {
    "leave.md": (["all"], [
        "Employees earn 4 hours of annual leave per pay period in their first three years.",
        "Between 3 and 15 years of service: 6 hours per pay period.",
        "Sick leave accrues at 4 hours per pay period for everyone.",
    ]),
    "pay.md": (["hr"], ["The pay cap for the senior band is $191,900 per year, set each January."]),
    "travel.md": (["all"], [
        "Book travel through the agency portal at least 14 days ahead.",
        "Per diem rates follow the",  # the needle is cut in two: destroyed
        "GSA schedule for each city you visit.",
    ]),
}

GOLDEN: list[dict[str, Any]] = [
    {"id": "G1", "kind": "answerable", "question": "How much leave after five years?",
     "paraphrases": ["how many hrs per paycheck after 5 yrs"], "groups": ["all"],
     "evidence": [{"source": "leave.md", "quote": NEEDLE}]},
    {"id": "G2", "kind": "answerable", "question": "What sets per diem?", "paraphrases": [], "groups": ["all"],
     "evidence": [{"source": "travel.md", "quote": "Per diem rates follow the GSA schedule for each city"}]},
    {"id": "G3", "kind": "answerable", "question": "What is the senior pay cap?", "paraphrases": [],
     "groups": ["hr"], "evidence": [{"source": "pay.md", "quote": "pay cap for the senior band is $191,900"}]},
    {"id": "G4", "kind": "forbidden", "question": "What is the senior band maximum?", "paraphrases": [],
     "groups": ["all"], "evidence": [{"source": "pay.md", "quote": "$191,900 per year, set each January"}]},
    {"id": "G5", "kind": "unanswerable", "question": "Can I bring my dog?", "paraphrases": [], "groups": ["all"],
     "evidence": []},
]

# (query text, stage) -> [(source, ordinal, distance), ...] in rank order.
SCRIPT: dict[tuple[str, str], list[tuple[str, int, float]]] = {
    ("How much leave after five years?", "dense"): [("leave.md", 0, 0.30), ("leave.md", 1, 0.35)],
    ("how many hrs per paycheck after 5 yrs", "dense"): [
        ("travel.md", 0, 0.50), ("leave.md", 2, 0.55), ("leave.md", 0, 0.58), ("leave.md", 1, 0.60)],
    ("What sets per diem?", "dense"): [("travel.md", 1, 0.40), ("travel.md", 2, 0.45)],
    ("What is the senior pay cap?", "dense"): [("pay.md", 0, 0.25)],
    ("What is the senior band maximum?", "dense"): [("pay.md", 0, 0.20), ("leave.md", 2, 0.62)],
    ("Can I bring my dog?", "dense"): [("travel.md", 0, 0.66), ("leave.md", 0, 0.71)],
    ("How much leave after five years?", "hybrid"): [("leave.md", 1, 0.35), ("leave.md", 0, 0.30)],
    ("how many hrs per paycheck after 5 yrs", "hybrid"): [("leave.md", 1, 0.60), ("travel.md", 0, 0.50)],
    ("What sets per diem?", "hybrid"): [("travel.md", 2, 0.45), ("travel.md", 1, 0.40)],
    ("What is the senior pay cap?", "hybrid"): [("pay.md", 0, 0.25)],
    ("What is the senior band maximum?", "hybrid"): [("travel.md", 0, 0.70), ("leave.md", 2, 0.62)],
    ("Can I bring my dog?", "hybrid"): [("leave.md", 0, 0.71), ("travel.md", 0, 0.66)],
}


class ScriptedSearch:
    """Stands in for rag.retrieval.search: returns scripted chunks, filtered by the reader's
    groups unless ``leaky`` (to prove that leaks are caught)."""

    def __init__(self, script: dict[tuple[str, str], list[tuple[str, int, float]]], leaky: bool = False) -> None:
        self.script = script
        self.leaky = leaky
        self.calls: list[dict[str, Any]] = []

    def __call__(self, conn: Any, query: str, *, embedder: Any, settings: Settings, groups: Sequence[str] = ("all",),
                 collection: str | None = None, stage: str = "hybrid", k: int | None = None,
                 reranker: Any = None, translator: Any = None) -> list[Hit]:
        self.calls.append({"query": query, "stage": stage, "groups": list(groups), "k": k, "translator": translator})
        embedder.embed_queries([query])
        rows = {(r["source"], r["ordinal"]): r for r in store.chunk_rows(conn, collection=collection)}
        visible = set(store.visible_access_keys(conn, groups))
        hits = []
        for source, ordinal, distance in self.script[(query, stage)]:
            row = rows[(source, ordinal)]
            if not self.leaky and row["access_key"] not in visible:
                continue
            hits.append(Hit(chunk_id=row["id"], document_id=row["document_id"], source=source, title=row["title"],
                            section=row["section"], content=row["content"], char_from=row["char_from"],
                            char_to=row["char_to"], page=None, distance=distance))
        return hits[: k or 20]


def build_db(conn: Any, embedder: FakeEmbedder, docs: dict[str, tuple[list[str], list[str]]] = DOCS) -> None:
    """Write documents straight through the store (no chunker): one chunk per listed paragraph."""
    coll = store.create_collection(conn, "default", embedder.model_id, embedder.dimension, "E")
    for source, (groups, paragraphs) in docs.items():
        text = "\n\n".join(paragraphs)
        chunks, offset = [], 0
        for ordinal, paragraph in enumerate(paragraphs):
            start = text.index(paragraph, offset)
            offset = start + len(paragraph)
            chunks.append(Chunk(ordinal, source, paragraph, paragraph, start, offset, None, len(paragraph.split()),
                                ordinal == 2))
        vectors = embedder.embed_passages([c.text for c in chunks])
        stored = [store.StoredChunk(c, v, c.section, c.content.lower()) for c, v in zip(chunks, vectors, strict=True)]
        version = store.DocumentVersion(
            source=source, path=f"/corpus/{source}", title=source, groups=groups, content_hash=source,
            bytes_hash=source, canonical_text=text, extractor="markdown", extractor_version="1",
            embedder=embedder.model_id, dimension=embedder.dimension, pipeline_version="test",
        )
        store.replace_document(conn, coll, version, stored)


def run(conn: Any, golden: Golden, settings: Settings, search: Any = None, **kw: Any) -> EvalReport:
    kw.setdefault("stages", ["dense", "hybrid"])
    kw.setdefault("sweep", "grid")
    return evaluate.run_eval(conn, golden, embedder=FakeEmbedder(), settings=settings,
                             search_fn=search or ScriptedSearch(SCRIPT), **kw)
