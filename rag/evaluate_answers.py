"""Answer-level evaluation: every golden query through ``rag.ask``, scored as a reader sees it.

Retrieval evaluation (``rag.evaluate``) asks whether the evidence is among the hits; this asks
what the desk SHOWS. For each query:

- answerable: *answered* (model-written, verified sentences), *quoted* (an extractive answer) or
  *refused* (``no_answer``); *correct* when a shown citation's passage holds the evidence quote
  (the golden relevance rule, ``rag.golden.is_relevant``);
- unanswerable or forbidden: anything but a refusal is a *bluff*.

Each row also keeps the answer-or-refuse signals of ``rag.decide`` (retrieval signals from the
kept hits, the model's own refusal, the verified share), so ``rag.decide.fit_decision`` can be
fitted on these rows with leave-one-corpus-out validation.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rag import ask as ask_module
from rag import decide, gate, retrieval, store
from rag.config import Settings
from rag.golden import Golden, Query, expand_queries, is_relevant
from rag.records import Answer, Hit
from rag.resources import Resources
from rag.text import keywords
from rag.verify import declined


@dataclass(frozen=True, slots=True)
class AnswerRow:
    """One query's outcome."""

    id: str
    kind: str  # the query's kind for its asker: answerable | unanswerable | forbidden
    status: str  # the Answer's status: answered | extractive | no_answer
    correct: bool  # a shown citation holds the evidence (answerable only)
    model_sentences: int  # sentences the model wrote
    supported_sentences: int  # of them, verified
    first_text_ms: float | None
    total_ms: float
    signals: dict[str, float] = field(default_factory=dict)  # rag.decide.Signals as a dict (kept hits only)

    @property
    def refused(self) -> bool:
        return self.status == "no_answer"

    @property
    def bluff(self) -> bool:
        return self.kind != "answerable" and not self.refused


@dataclass(frozen=True, slots=True)
class AnswerReport:
    """Every row and the figures of the issue's table."""

    golden: str
    collection: str
    language_model: str
    rows: tuple[AnswerRow, ...]

    def figures(self) -> dict[str, float | int | None]:
        answerable = [r for r in self.rows if r.kind == "answerable"]
        refusable = [r for r in self.rows if r.kind != "answerable"]
        written = sum(r.model_sentences for r in self.rows)
        first = [r.first_text_ms for r in self.rows if r.first_text_ms is not None]
        shown = [r for r in self.rows if not r.refused]
        wrong = [r for r in shown if r.kind != "answerable" or not r.correct]
        refused_right = sum(r.refused for r in refusable)
        refused_all = sum(r.refused for r in self.rows)
        return {
            "queries": len(self.rows),
            "answerable": len(answerable),
            "must_refuse": len(refusable),
            "answered_model_written": _share(sum(r.status == "answered" for r in answerable), len(answerable)),
            "answered_correct": _share(sum(not r.refused and r.correct for r in answerable), len(answerable)),
            "quoted": _share(sum(r.status == "extractive" for r in answerable), len(answerable)),
            "lost": _share(sum(r.refused for r in answerable), len(answerable)),
            "bluffs": _share(sum(r.bluff for r in refusable), len(refusable)),
            "refusal_precision": _share(refused_right, refused_all),
            "refusal_recall": _share(refused_right, len(refusable)),
            "support_rate": _share(sum(r.supported_sentences for r in self.rows), written),
            "coverage": _share(len(shown), len(self.rows)),
            "risk": _share(len(wrong), len(shown)),
            "first_text_p50_ms": round(statistics.median(first), 1) if first else None,
            "total_p50_ms": round(statistics.median(r.total_ms for r in self.rows), 1) if self.rows else None,
        }

    def examples(self, corpus: str) -> list[decide.Example]:
        """Rows with kept hits as training examples of the decision (the gate already refused the rest)."""
        return [
            decide.Example(decide.Signals(**r.signals), r.kind == "answerable", r.correct, corpus)
            for r in self.rows if r.signals
        ]

    def to_json(self) -> dict[str, Any]:
        return {"golden": self.golden, "collection": self.collection, "language_model": self.language_model,
                "figures": self.figures(), "rows": [asdict(r) for r in self.rows]}


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 3) if whole else None


def answer_signals(conn: store.Connection, question: str, answer: Answer, threshold: float) -> dict[str, float]:
    """The ``rag.decide`` signals of an answer whose gate kept something ({} when nothing was kept)."""
    kept: Sequence[Hit] = answer.hits
    if not kept:
        return {}
    idf = retrieval.query_idf(conn, keywords(question))
    rare = decide.rare_half(idf)
    base = decide.retrieval_signals(
        [h.distance for h in kept],
        [retrieval.keyword_coverage(h.content, idf) for h in kept],
        [retrieval.keyword_coverage(h.content, rare) for h in kept],
        kept[0].dense_rank, kept[0].sparse_rank, threshold,
    )
    raw = str(answer.trace.get("raw", ""))
    written, supported = written_sentences(answer)
    verified = supported / written if written else 0.0
    signals = asdict(base)
    signals.update(lm_refused=float(answer.llm_called and declined(raw)), verified=verified)
    return signals


def written_sentences(answer: Answer) -> tuple[int, int]:
    """(sentences the model wrote, of them verified), from the verification trace; (0, 0) without a model."""
    if not answer.llm_called:
        return 0, 0
    return int(answer.trace.get("sentences_written", 0)), int(answer.trace.get("sentences_supported", 0))


def correct(answer: Answer, query: Query) -> bool:
    """A shown citation's passage holds a whole evidence quote (the golden relevance rule)."""
    if answer.status == "no_answer":
        return False
    by_id = {h.chunk_id: h for h in answer.hits}
    return any(
        (hit := by_id.get(c.chunk_id)) is not None and is_relevant(hit.source, hit.content, query.item.evidence)
        for c in answer.citations
    )


def run_answers(
    conn: store.Connection,
    golden: Golden,
    *,
    resources: Resources,
    settings: Settings,
    collection: str | None = None,
    generate: bool = True,
    groups_as_golden: bool = True,
    limit: int | None = None,
    on_query: Callable[[int, int, str], None] | None = None,
) -> AnswerReport:
    """Ask every query of ``golden`` (or the first ``limit``) and score what would be shown."""
    name = collection or settings.collection
    coll = store.require_collection(conn, name)
    embedder = resources.collection_embedder(conn, name)
    threshold = gate.gate_threshold(settings, coll)
    queries = expand_queries(golden.items, groups_as_golden)[:limit]
    rows = []
    for index, query in enumerate(queries, start=1):
        answer = ask_module.ask(query.text, conn=conn, settings=settings, groups=query.groups, collection=name,
                                embedder=embedder, generate=generate, resources=resources)
        written, supported = written_sentences(answer)
        rows.append(AnswerRow(
            id=query.id, kind=query.kind, status=answer.status,
            correct=query.kind == "answerable" and correct(answer, query),
            model_sentences=written, supported_sentences=supported,
            first_text_ms=answer.timings_ms.get("first_text"), total_ms=answer.timings_ms.get("total", 0.0),
            signals=answer_signals(conn, query.text, answer, threshold),
        ))
        if on_query:
            on_query(index, len(queries), query.id)
    model = (settings.llm_path or "bundled") if generate else "none (extractive)"
    return AnswerReport(golden.name, name, model, tuple(rows))


def format_figures(report: AnswerReport) -> str:
    """The figures as aligned ``name value`` lines (the CLI prints them)."""
    figures = report.figures()
    width = max(len(k) for k in figures)
    lines = [f"{report.golden} on {report.collection!r}, language model {report.language_model}"]
    lines += [f"{key:<{width}}  {value if value is not None else '-'}" for key, value in figures.items()]
    return "\n".join(lines)


def dump(report: AnswerReport) -> str:
    return json.dumps(report.to_json(), ensure_ascii=False, indent=1)


__all__ = ["AnswerReport", "AnswerRow", "answer_signals", "correct", "dump", "format_figures", "run_answers"]
