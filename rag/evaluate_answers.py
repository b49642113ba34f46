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

import dataclasses
import json
import re
import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rag import ask as ask_module
from rag import decide, gate, store
from rag.config import Settings
from rag.errors import RagError
from rag.golden import Golden, Query, expand_queries, is_relevant
from rag.records import Answer, Hit
from rag.replay import ReplayModel, answer_leads
from rag.resources import Resources


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
    evidence_kept: bool = False  # a kept passage holds the evidence (answerable only)
    corpus: str = ""  # the golden set's name: the group of leave-one-corpus-out validation
    dropped: list[str] = field(default_factory=list)  # why each unverified model sentence was dropped (drop_kind)
    raw: str = ""  # the model's reply as written (empty without a model); the second one after a retry
    replies: list[str] = field(default_factory=list)  # both replies, in order, when the model tried twice
    question: str = ""  # the query as asked
    shown: str = ""  # what the reader is shown ("" for not found): verified sentences or the quote
    cited: str = ""  # the first shown citation's passage (for judging the shown answer offline)

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
            # answers the model wrote twice (a first reply with no verified sentence: rag.generate.retry_lead)
            "second_attempts": _share(sum(bool(r.replies) for r in self.rows), sum(bool(r.raw) for r in self.rows)),
            "coverage": _share(len(shown), len(self.rows)),
            "risk": _share(len(wrong), len(shown)),
            "first_text_p50_ms": round(statistics.median(first), 1) if first else None,
            "total_p50_ms": round(statistics.median(r.total_ms for r in self.rows), 1) if self.rows else None,
        }

    def drop_counts(self) -> dict[str, int]:
        """How many model sentences each verification rule dropped, most first."""
        counts = Counter(kind for row in self.rows for kind in row.dropped)
        return dict(counts.most_common())

    def examples(self, corpus: str) -> list[decide.Example]:
        """Rows with kept hits as training examples of the decision (the gate already refused the rest)."""
        return [
            decide.Example(decide.Signals(**r.signals), r.kind == "answerable", r.correct, corpus)
            for r in self.rows if r.signals
        ]

    def to_json(self) -> dict[str, Any]:
        return {"golden": self.golden, "collection": self.collection, "language_model": self.language_model,
                "figures": self.figures(), "dropped": self.drop_counts(), "rows": [asdict(r) for r in self.rows]}


_REASON_DETAIL = re.compile(r"\s*[\d:\[{].*$", re.DOTALL)


def drop_kind(reason: str) -> str:
    """A verification reason without its figures and markers: "overlap 0.07 < 0.50 with [1]" -> "overlap"."""
    return _REASON_DETAIL.sub("", reason).strip() or reason


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 3) if whole else None


def answer_signals(conn: store.Connection, question: str, answer: Answer, threshold: float) -> dict[str, float]:
    """The ``rag.decide`` signals of an answer whose gate kept something ({} when nothing was kept)."""
    kept: Sequence[Hit] = answer.hits
    if not kept:
        return {}
    return asdict(ask_module.answer_signals(answer, ask_module.decision_signals(conn, question, kept, threshold)))


def evidence_kept(answer: Answer, query: Query) -> bool:
    """A passage the gate kept holds a whole evidence quote: answering from them can be right."""
    return query.kind == "answerable" and any(is_relevant(h.source, h.content, query.item.evidence)
                                              for h in answer.hits)


written_sentences = ask_module.written_sentences  # re-exported: its first home


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
    sample: int | None = None,
    on_query: Callable[[int, int, str], None] | None = None,
    replies: Mapping[str, Sequence[str]] | None = None,
) -> AnswerReport:
    """Ask every query of ``golden`` (or the first ``limit``) and score what would be shown.

    With ``replies`` (query id -> a reply recorded by an earlier run, ``rag.replay``) the model's
    answers are played back instead of decoded; everything around them runs as shipped.
    """
    name = collection or settings.collection
    coll = store.require_collection(conn, name)
    replay = _replay_model(resources, settings) if replies is not None and generate else None
    embedder = resources.collection_embedder(conn, name)
    threshold = gate.gate_threshold(settings, coll)
    queries = expand_queries(golden.items, groups_as_golden)[:limit]
    if sample is not None and 0 < sample < len(queries):  # evenly spread, so every kind is kept
        queries = [queries[i * len(queries) // sample] for i in range(sample)]
    rows = []
    for index, query in enumerate(queries, start=1):
        if replay is not None and replies is not None:
            replay.play(replies.get(query.id, []))
        answer = ask_module.ask(query.text, conn=conn, settings=settings, groups=query.groups, collection=name,
                                embedder=embedder, llm=replay, generate=generate, resources=resources)
        written, supported = written_sentences(answer)
        rows.append(AnswerRow(
            id=query.id, kind=query.kind, status=answer.status,
            correct=query.kind == "answerable" and correct(answer, query),
            model_sentences=written, supported_sentences=supported,
            first_text_ms=answer.timings_ms.get("first_text"), total_ms=answer.timings_ms.get("total", 0.0),
            signals=answer_signals(conn, query.text, answer, threshold),
            evidence_kept=evidence_kept(answer, query), corpus=golden.name,
            dropped=[drop_kind(str(d.get("reason", ""))) for d in answer.trace.get("dropped_sentences", [])],
            raw=str(answer.trace.get("raw", "")) if answer.llm_called else "",
            replies=[str(r) for r in answer.trace.get("replies", [])] if answer.llm_called else [],
            question=query.text, shown="" if answer.status == "no_answer" else answer.text,
            cited=answer.citations[0].quote if answer.citations and answer.status != "no_answer" else "",
        ))
        if on_query:
            on_query(index, len(queries), query.id)
    model = (settings.llm_path or "bundled") if generate else "none (extractive)"
    if replay is not None:
        model += f" (replayed: {replay.replayed} of {len(rows)} answers)"
    return AnswerReport(golden.name, name, model, tuple(rows))


def _replay_model(resources: Resources, settings: Settings) -> ReplayModel:
    """The settings' language model answering with recorded replies (``rag.replay``)."""
    from rag.conversation import REWRITE_MAX_TOKENS
    from rag.translate import TRANSLATE_MAX_TOKENS

    if settings.max_tokens in (TRANSLATE_MAX_TOKENS, REWRITE_MAX_TOKENS):
        # the replay tells an answer from a translation or a rewrite by the tokens it asks for
        raise RagError(f"replaying needs max_tokens other than {TRANSLATE_MAX_TOKENS} and {REWRITE_MAX_TOKENS}")
    return ReplayModel(resources.language_model(settings.llm_path), settings.max_tokens, answer_leads())


# ---------------------------------------------------------------------------------------------
# Fitting the answer-or-refuse decision on rows measured with the decision off


def fit_rows(rows: Sequence[AnswerRow], max_bluff: float = 0.10, source: str = "") -> decide.Policy:
    """Fit the policy on ``rows``, its two thresholds chosen together on the end-to-end
    out-of-fold outcome of every row (the gate's refusals included)."""
    import numpy as np

    before, after = decision_examples(rows)
    with_signals = [i for i, r in enumerate(rows) if r.signals]
    shown = [i for i in with_signals if rows[i].status != "no_answer"]

    def joint(oof_before: list[float], oof_after: list[float]) -> tuple[float, float]:
        p_before = np.full(len(rows), np.nan)
        p_after = np.full(len(rows), np.nan)
        p_before[with_signals] = oof_before
        p_after[shown] = oof_after
        answerable = np.array([r.kind == "answerable" for r in rows])
        right = np.array([r.correct for r in rows])
        return decide.joint_thresholds(p_before, p_after, answerable, right, max_bluff)

    return decide.fit_policy(before, after, max_bluff, source, joint=joint)


def _signals(row: AnswerRow) -> decide.Signals:
    return decide.Signals(**{k: float(row.signals.get(k, 0.0)) for k in decide.FEATURES})


def decision_examples(rows: Sequence[AnswerRow]) -> tuple[list[decide.Example], list[decide.Example]]:
    """The rows as training examples of the policy's two models (rows the gate refused are left
    out: no model sees them).

    ``before``: every row with signals, right to answer when a kept passage holds the evidence;
    ``after``: the rows something was shown for, right when the shown answer cites the evidence.
    """
    before, after = [], []
    for r in rows:
        if not r.signals:
            continue
        signals = _signals(r)
        answerable = r.kind == "answerable"
        before.append(decide.Example(signals, answerable, r.evidence_kept, r.corpus))
        if r.status != "no_answer":
            after.append(decide.Example(signals, answerable, r.correct, r.corpus))
    return before, after


def apply_policy(row: AnswerRow, policy: decide.Policy | None) -> str:
    """What ``rag.ask`` would show for a row measured with the decision off: its status, or
    "no_answer" when either model refuses (a pure replay: no model runs)."""
    if policy is None or not row.signals or row.status == "no_answer":
        return row.status
    signals = _signals(row)
    if not policy.before.answers(decide.retrieval_only(signals)):
        return "no_answer"
    return row.status if policy.after.answers(signals) else "no_answer"


def outcome_figures(rows: Sequence[AnswerRow], statuses: Sequence[str]) -> dict[str, float | int | None]:
    """Bluffs, lost, model-written and correct shares for ``rows`` shown with ``statuses``."""
    pairs = list(zip(rows, statuses, strict=True))
    answerable = [(r, s) for r, s in pairs if r.kind == "answerable"]
    refusable = [(r, s) for r, s in pairs if r.kind != "answerable"]
    return {
        "queries": len(pairs),
        "answered_model_written": _share(sum(s == "answered" for _, s in answerable), len(answerable)),
        "answered_correct": _share(sum(s != "no_answer" and r.correct for r, s in answerable), len(answerable)),
        "quoted": _share(sum(s == "extractive" for _, s in answerable), len(answerable)),
        "lost": _share(sum(s == "no_answer" for _, s in answerable), len(answerable)),
        "bluffs": _share(sum(s != "no_answer" for _, s in refusable), len(refusable)),
    }


def loco_report(rows: Sequence[AnswerRow], max_bluff: float = 0.10) -> dict[str, dict[str, float | int | None]]:
    """Leave-one-corpus-out, end to end: for each corpus, the policy fitted on the OTHER corpora
    replayed on its rows (the gate's refusals included), next to the figures without a decision."""
    return {corpus: _held_out_figures(held, policy) for corpus, held, policy in _held_out(rows, max_bluff)}


def _held_out(rows: Sequence[AnswerRow], max_bluff: float) -> list[tuple[str, list[AnswerRow], decide.Policy | None]]:
    """Each corpus's rows with the policy fitted on the other corpora (None: they lack a class)."""
    folds = []
    for corpus in sorted({r.corpus for r in rows}):
        try:
            policy: decide.Policy | None = fit_rows([r for r in rows if r.corpus != corpus], max_bluff)
        except ValueError:  # the other corpora lack a class: nothing to learn from
            policy = None
        folds.append((corpus, [r for r in rows if r.corpus == corpus], policy))
    return folds


def _held_out_figures(held: Sequence[AnswerRow], policy: decide.Policy | None) -> dict[str, float | int | None]:
    without = outcome_figures(held, [r.status for r in held])
    with_policy = outcome_figures(held, [apply_policy(r, policy) for r in held])
    return {**{f"off_{k}": v for k, v in without.items() if k != "queries"}, **with_policy}


def policy_scores(rows: Sequence[AnswerRow], policy: decide.Policy) -> list[float]:
    """One score per row for the coverage-risk curve: the ``after`` model's probability when the
    ``before`` model lets the row through, else 0 (the gate's refusals score 0 too)."""
    scores = []
    for r in rows:
        if not r.signals or r.status == "no_answer" or not policy.before.answers(decide.retrieval_only(_signals(r))):
            scores.append(0.0)
        else:
            scores.append(policy.after.probability(_signals(r)))
    return scores


def coverage_risk(rows: Sequence[AnswerRow], scores: Sequence[float]) -> list[dict[str, float]]:
    """Share of questions answered vs share of the answered that are wrong (an unanswerable one
    answered, or an answerable one whose shown citations miss the evidence), at every threshold."""
    points = []
    for t in sorted({s for s in scores if s > 0}):
        shown = [r for r, s in zip(rows, scores, strict=True) if s >= t]
        wrong = sum(r.kind != "answerable" or not r.correct for r in shown)
        points.append({"threshold": round(t, 4), "coverage": round(len(shown) / len(rows), 4),
                       "risk": round(wrong / len(shown), 4)})
    return points


def calibration_report(rows: Sequence[AnswerRow], max_bluff: float = 0.10) -> dict[str, Any]:
    """Per corpus, leave-one-corpus-out: the figures without and with the policy fitted on the
    other corpora, and that policy's coverage-risk curve on the held-out corpus."""
    figures: dict[str, dict[str, float | int | None]] = {}
    curves: dict[str, list[dict[str, float]]] = {}
    for corpus, held, policy in _held_out(rows, max_bluff):
        figures[corpus] = _held_out_figures(held, policy)
        curves[corpus] = coverage_risk(held, policy_scores(held, policy)) if policy is not None else []
    return {"max_bluff": max_bluff, "corpora": figures, "coverage_risk": curves}


def calibrate(rows: Sequence[AnswerRow], source: str, max_bluff: float = 0.10) -> decide.Policy:
    """The policy fitted on every row (thresholds from leave-one-corpus-out predictions), with
    its calibration report."""
    policy = fit_rows(rows, max_bluff, source)
    return dataclasses.replace(policy, report=calibration_report(rows, max_bluff))


BUNDLED_ROWS = {"model": "decision_rows.json", "examined": "decision_examiner_rows.json",
                "quotes": "decision_quotes_rows.json"}


def bundled_rows(kind: str = "model") -> list[AnswerRow]:
    """The rows the bundled policy of ``kind`` (``rag.decide.POLICY_KINDS``) was fitted on
    (``rag/decision_rows.json``, those measured with the answer examiner's log-odds, those of
    answers without the language model; [] when absent)."""
    from importlib import resources

    path = resources.files("rag").joinpath(BUNDLED_ROWS[kind])
    if not path.is_file():
        return []
    return _rows_from(json.loads(path.read_text(encoding="utf-8")))


def _rows_from(raw: dict[str, Any]) -> list[AnswerRow]:
    names = set(AnswerRow.__dataclass_fields__)
    return [AnswerRow(**{"corpus": raw.get("golden", ""), **{k: v for k, v in row.items() if k in names}})
            for row in raw["rows"]]


def load_rows(path: str) -> list[AnswerRow]:
    """The rows of a ``rag eval answers --json`` file (older files: corpus = the golden name)."""
    from pathlib import Path

    return _rows_from(json.loads(Path(path).read_text(encoding="utf-8")))


def format_figures(report: AnswerReport) -> str:
    """The figures as aligned ``name value`` lines (the CLI prints them)."""
    figures = report.figures()
    width = max(len(k) for k in figures)
    lines = [f"{report.golden} on {report.collection!r}, language model {report.language_model}"]
    lines += [f"{key:<{width}}  {value if value is not None else '-'}" for key, value in figures.items()]
    dropped = report.drop_counts()
    if dropped:
        lines.append("model sentences dropped by verification: " + ", ".join(f"{k} {n}" for k, n in dropped.items()))
    return "\n".join(lines)


def dump(report: AnswerReport) -> str:
    return json.dumps(report.to_json(), ensure_ascii=False, indent=1)


__all__ = [
    "AnswerReport", "AnswerRow", "answer_signals", "apply_policy", "correct", "decision_examples", "dump",
    "evidence_kept", "format_figures", "load_rows", "loco_report", "outcome_figures", "run_answers",
]
