"""rag.evaluate: a full run over a real SQLite file (real migrations, real sqlite-vec) with a
scripted retriever, the typed report and its JSON, comparisons, the strategy table and the CLI."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag import evaluate, gate, store
from rag.cli import format_comparison, format_report, format_strategies
from rag.config import Settings
from rag.errors import RagError
from rag.evaluate import EvalReport
from rag.golden import Evidence, Golden, is_relevant, parse_golden
from rag.metrics import hit_rate_at_k, paired_counts, sign_test, wilson_interval
from rag.records import Hit

from .conftest import ROOT
from .evalkit import GOLDEN, NEEDLE, SCRIPT, ScriptedSearch, build_db, run
from .fakes import FakeEmbedder

BASELINE = ROOT / "tests" / "baseline_eval.json"


@pytest.fixture
def golden() -> Golden:
    return parse_golden(GOLDEN, "golden_test", "f" * 64)


@pytest.fixture
def built(conn: Any, fake_embedder: FakeEmbedder) -> Any:
    build_db(conn, fake_embedder)
    return conn


def test_query_cache_embeds_each_text_once() -> None:
    inner = FakeEmbedder()
    cached = evaluate.QueryCache(inner)
    first = cached.embed_queries(["a b", "c d", "a b"])
    again = cached.embed_queries(["c d"])
    assert inner.calls == 1
    assert np.allclose(first[1], again[0])
    assert np.allclose(first[0], inner.embed_queries(["a b"])[0])


# ---------------------------------------------------------------------------------------------
# A full run over a real database with a scripted retriever


def test_run_eval_metrics_by_hand(built: Any, golden: Golden, settings: Settings) -> None:
    report = run(built, golden, settings)
    assert set(report.to_json()) >= {"queries", "stages", "destroyed", "leaks", "gate", "per_query"}
    assert report.queries.to_json() == {"total": 6, "items": 5, "answerable": 4, "unanswerable": 1, "forbidden": 1}
    dense, hybrid = report.stages["dense"], report.stages["hybrid"]
    # Answerable ranks: dense G1/q 2, G1/p1 4, G2 none (destroyed), G3 1; hybrid 1, 1, none, 1.
    assert dense.n == 4
    assert dense.hit_rate[1].value == 0.25 and dense.hit_rate[1].hits == 1
    assert dense.hit_rate[4].value == 0.75
    assert dense.hit_rate[4].ci == tuple(round(x, 4) for x in wilson_interval(3, 4))
    assert dense.mrr[4] == round((1 / 2 + 1 / 4 + 1) / 4, 4)
    assert dense.mrr[1] == 0.25
    assert hybrid.hit_rate[1].value == 0.75 and hybrid.mrr[20] == 0.75
    assert dense.ceiling == hybrid.ceiling == 0.75
    assert report.destroyed.items == ("G2",) and report.destroyed.queries == 1
    assert report.leaks.total == 0 and dense.leaks == hybrid.leaks == 0
    rows = {q.id: q for q in report.per_query}
    assert rows["G1/p1"].ranks == {"dense": 4, "hybrid": 1}
    assert rows["G2/q"].destroyed and rows["G2/q"].ranks == {"dense": None, "hybrid": None}
    assert rows["G5/q"].min_distance == {"dense": 0.66, "hybrid": 0.66}  # the closest, not the first


def test_golden_mistakes_are_not_blamed_on_chunking(built: Any, settings: Settings) -> None:
    # G6 quotes leave.md with a typo, G7 names a file that was never indexed, G8 has one needle of
    # each kind beside a good one: only G2 (a needle cut in two) is destroyed by chunking.
    extra = [
        {"id": "G6", "kind": "answerable", "question": "How much sick leave?", "paraphrases": ["sick hrs?"],
         "groups": ["all"], "evidence": [{"source": "leave.md", "quote": "Sick leave acrues at 4 hours"}]},
        {"id": "G7", "kind": "answerable", "question": "Who signs expenses?", "paraphrases": [], "groups": ["all"],
         "evidence": [{"source": "expenses.md", "quote": "Your manager signs every claim"}]},
        {"id": "G8", "kind": "answerable", "question": "How far ahead to book?", "paraphrases": [],
         "groups": ["all"], "evidence": [{"source": "travel.md", "quote": "at least 14 days ahead"},
                                         {"source": "expenses.md", "quote": "Book early"}]},
    ]
    golden = parse_golden([*GOLDEN, *extra], "golden_test", "f" * 64)
    script = dict(SCRIPT)
    for text in ("How much sick leave?", "sick hrs?", "Who signs expenses?", "How far ahead to book?"):
        script[(text, "dense")] = script[(text, "hybrid")] = [("leave.md", 2, 0.3), ("travel.md", 0, 0.4)]
    report = run(built, golden, settings, ScriptedSearch(script))
    destroyed = report.destroyed
    assert destroyed.items == ("G2",) and destroyed.queries == 1
    assert destroyed.needles == (Evidence("travel.md", "Per diem rates follow the GSA schedule for each city"),)
    assert destroyed.missing_items == ("G6", "G7") and destroyed.missing_queries == 3
    assert [(m.source, m.reason) for m in destroyed.missing] == [
        ("leave.md", evaluate.NOT_IN_DOCUMENT), ("expenses.md", evaluate.NOT_INDEXED),
        ("expenses.md", evaluate.NOT_INDEXED),
    ]
    # 8 answerable queries: G2, G6 (twice) and G7 can never be found; G8 is found by its good needle
    assert report.stages["dense"].ceiling == 0.5
    assert report.stages["dense"].hit_rate[4].hits == 4  # G1/q, G1/p1, G3, and G8 at rank 2
    rows = {q.id: q for q in report.per_query}
    assert rows["G2/q"].destroyed and not rows["G6/q"].destroyed and not rows["G8/q"].destroyed
    assert EvalReport.from_json(json.loads(json.dumps(report.to_json()))) == report
    text = format_report(report)
    assert "destroyed by chunking: 1 (items G2)" in text
    assert "golden-set mistakes: 3 evidence quotes no indexed document holds; items G6, G7 (3 queries)" in text
    assert "quote not in its document: leave.md: 'Sick leave acrues at 4 hours'" in text
    assert "source not indexed: expenses.md" in text


def test_reports_from_before_the_missing_keys_still_read() -> None:
    raw = json.loads(BASELINE.read_text(encoding="utf-8"))
    for key in ("missing_items", "missing_queries", "missing"):
        del raw["destroyed"][key]
    destroyed = EvalReport.from_json(raw).destroyed
    assert destroyed.missing == () and destroyed.missing_items == () and destroyed.missing_queries == 0


def test_run_eval_asks_each_query_as_its_groups(built: Any, golden: Golden, settings: Settings) -> None:
    search = ScriptedSearch(SCRIPT)
    run(built, golden, settings, search)
    asked = {(c["query"], c["stage"]): c["groups"] for c in search.calls}
    assert asked[("What is the senior pay cap?", "dense")] == ["hr"]
    assert asked[("What is the senior band maximum?", "hybrid")] == ["all"]
    assert len(search.calls) == 12 and {c["k"] for c in search.calls} == {20}


def test_run_eval_gate_sweep_by_hand(built: Any, golden: Golden, settings: Settings) -> None:
    sweep = run(built, golden, settings).gate
    # Hybrid hits: G1/q kept from 0.35, G1/p1 from 0.60, G2 always lost, G3 from 0.25,
    # G4 (forbidden) bluffs above 0.62, G5 (unanswerable) above 0.66.
    assert sweep.stage == "hybrid" and sweep.max_sources == 4
    assert sweep.answerable == 4 and sweep.must_refuse == 2
    assert sweep.current.to_json() == {"threshold": 0.675, "origin": "grid", "bluffs": 2, "bluffs_unanswerable": 1,
                                       "bluffs_forbidden": 1, "lost": 1, "errors": 3}
    by = {p.threshold: (p.bluffs, p.lost) for p in sweep.curve}
    assert by[0.4] == (0, 2) and by[0.6] == (0, 2) and by[0.625] == (1, 1) and by[0.8] == (2, 1)
    # 2 errors from 0.40 to 0.65; fewest bluffs, then the lowest threshold.
    assert sweep.recommended.threshold == 0.4
    outcome = {q.id: q.gate for q in run(built, golden, settings).per_query}
    assert outcome == {"G1/q": "ok", "G1/p1": "ok", "G2/q": "lost", "G3/q": "ok", "G4/q": "bluff", "G5/q": "bluff"}


def test_run_eval_quantile_sweep_beats_the_grid(built: Any, golden: Golden, settings: Settings) -> None:
    sweep = run(built, golden, settings, sweep="both").gate
    # Deciding distances 0.25, 0.35, 0.60, 0.62, 0.66; the 55 % quantile 0.60 + 0.2 * 0.02 = 0.604
    # keeps G1/p1 (0.60) and still refuses G4 (0.62): only the destroyed G2 is lost.
    assert sweep.recommended.to_json() == {"threshold": 0.604, "origin": "quantile", "bluffs": 0,
                                           "bluffs_unanswerable": 0, "bluffs_forbidden": 0, "lost": 1, "errors": 1}
    assert {p.origin for p in sweep.curve} == {"grid", "quantile"}


def test_collection_threshold_is_the_current_one(built: Any, golden: Golden, settings: Settings) -> None:
    store.set_collection_threshold(built, "default", 0.333)
    current = run(built, golden, settings).gate.current
    assert current.threshold == 0.333 and current.origin == "current"


def test_evaluation_gates_exactly_as_the_answer_path(built: Any, golden: Golden, settings: Settings) -> None:
    # Each query's gate outcome in the report, and the sweep's counts at the threshold in force, must
    # be what rag.gate.apply_gate (the ask path) does with the same hits and the threshold ask would
    # use (rag.gate.gate_threshold). Close hits beyond max_sources, ties at the threshold and a
    # relevant hit pushed out by the cap make the cases where two gate rules would part.
    store.set_collection_threshold(built, "default", 0.62)
    script = dict(SCRIPT)
    script[("how many hrs per paycheck after 5 yrs", "hybrid")] = [
        ("travel.md", 0, 0.10), ("leave.md", 2, 0.20), ("leave.md", 0, 0.30), ("travel.md", 2, 0.40),
        ("leave.md", 1, 0.50)]  # the relevant chunk is fifth: within the threshold, beyond max_sources 4
    script[("What is the senior band maximum?", "hybrid")] = [("leave.md", 2, 0.62)]  # at the threshold: refused
    search = ScriptedSearch(script)
    report = run(built, golden, settings, search)
    coll = store.require_collection(built, "default")
    threshold = gate.gate_threshold(settings, coll)
    assert threshold == report.gate.current.threshold == 0.62
    expected: dict[str, str] = {}
    for q in report.per_query:
        hits = search(built, q.query, embedder=FakeEmbedder(), settings=settings, groups=list(q.groups),
                      collection="default", stage="hybrid", k=report.config.depth)
        kept, _dropped = gate.apply_gate(hits, threshold, settings.max_sources)
        item = next(i for i in golden.items if i.id == q.item)
        if q.kind == "answerable":
            expected[q.id] = "ok" if any(is_relevant(h.source, h.content, item.evidence) for h in kept) else "lost"
        else:
            expected[q.id] = "bluff" if kept else "ok"
    assert {q.id: q.gate for q in report.per_query} == expected
    assert expected["G1/p1"] == "lost" and expected["G4/q"] == "ok"  # the cases above did bite
    outcomes = list(expected.values())
    kinds = {q.id: q.kind for q in report.per_query}
    assert report.gate.current.lost == outcomes.count("lost")
    assert report.gate.current.bluffs_forbidden == sum(
        v == "bluff" and kinds[k] == "forbidden" for k, v in expected.items())
    assert report.gate.current.bluffs_unanswerable == sum(
        v == "bluff" and kinds[k] == "unanswerable" for k, v in expected.items())


def test_leaks_are_caught(built: Any, golden: Golden, settings: Settings) -> None:
    report = run(built, golden, settings, ScriptedSearch(SCRIPT, leaky=True))
    # Dense returns pay.md first for G4 (forbidden evidence) to a reader of ["all"].
    assert report.leaks.total == 1
    assert report.leaks.by_stage == {"dense": 1, "hybrid": 0}
    leak = report.leaks.found[0]
    assert (leak.query, leak.stage, leak.rank, leak.reason) == ("G4/q", "dense", 1, "forbidden evidence")
    assert {q.id: q.leaks for q in report.per_query}["G4/q"] == ("dense",)


def test_unreadable_documents_are_leaks_too(built: Any, golden: Golden, settings: Settings) -> None:
    script = dict(SCRIPT)
    script[("Can I bring my dog?", "hybrid")] = [("pay.md", 0, 0.5)]
    report = run(built, golden, settings, ScriptedSearch(script, leaky=True))
    reasons = {(x.query, x.stage): x.reason for x in report.leaks.found}
    assert reasons[("G5/q", "hybrid")] == "unreadable document"


def test_no_groups_as_golden_makes_restricted_answers_forbidden(
    built: Any, golden: Golden, settings: Settings
) -> None:
    report = run(built, golden, settings, groups_as_golden=False)
    assert report.queries.answerable == 3 and report.queries.forbidden == 2
    assert report.leaks.total == 0
    leaky = run(built, golden, settings, ScriptedSearch(SCRIPT, leaky=True), groups_as_golden=False)
    assert {x.query for x in leaky.leaks.found} == {"G3/q", "G4/q"}


def test_run_eval_rejects_bad_input(built: Any, golden: Golden, settings: Settings) -> None:
    with pytest.raises(RagError, match="unknown stage"):
        run(built, golden, settings, stages=["dense", "bm25"])
    with pytest.raises(RagError, match="k must be"):
        run(built, golden, settings, ks=[0, 4])
    with pytest.raises(RagError, match="no collection"):
        run(built, golden, settings, collection="nope")
    with pytest.raises(RagError, match="unknown sweep mode"):
        run(built, golden, settings, sweep="fixed")


# ---------------------------------------------------------------------------------------------
# The report's JSON: exactly the shape of tests/baseline_eval.json and docs/eval-json-schema.md


def _shape(value: Any) -> Any:
    """The keys of every object, recursively (lists by their first element; numbers by kind)."""
    if isinstance(value, dict):
        return {key: _shape(v) for key, v in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    if isinstance(value, bool) or value is None:
        return type(value).__name__
    return "number" if isinstance(value, int | float) else type(value).__name__


def test_baseline_file_reads_back_to_the_same_json() -> None:
    raw = json.loads(BASELINE.read_text(encoding="utf-8"))
    report = EvalReport.from_json(raw)
    assert json.dumps(report.to_json()) == json.dumps(raw)  # same keys, same order, same values
    assert report.stages["dense"].hit_rate[8].value == raw["stages"]["dense"]["recall@8"]["value"]


def test_run_eval_json_has_the_baseline_keys(built: Any, golden: Golden, settings: Settings) -> None:
    baseline = json.loads(BASELINE.read_text(encoding="utf-8"))
    report = run(built, golden, settings, ScriptedSearch(SCRIPT, leaky=True), ks=baseline["config"]["ks"]).to_json()
    assert list(report) == list(baseline)
    assert list(report["config"]) == list(baseline["config"])
    assert list(report["config"]["settings"]) == [f.name for f in dataclasses.fields(Settings) if f.name != "db_path"]
    assert list(report["queries"]) == list(baseline["queries"])
    assert _shape(report["stages"]["dense"]) == _shape(baseline["stages"]["dense"])
    assert _shape(report["gate"]) == _shape(baseline["gate"])
    assert _shape(report["per_query"][0]["ranks"]) == {"dense": "number", "hybrid": "number"}
    assert list(report["per_query"][0]) == list(baseline["per_query"][0])
    assert list(report["leaks"]) == ["total", "by_stage", "list"]
    assert list(report["leaks"]["list"][0]) == ["query", "item", "stage", "rank", "source", "chunk_id", "reason"]
    assert list(report["destroyed"]) == list(baseline["destroyed"])
    assert list(report["destroyed"]["needles"][0]) == ["source", "quote"]


def test_report_json_round_trip(built: Any, golden: Golden, settings: Settings) -> None:
    report = run(built, golden, settings, ScriptedSearch(SCRIPT, leaky=True), sweep="both")
    saved = json.loads(json.dumps(report.to_json()))
    assert EvalReport.from_json(saved) == report
    assert "run_id" not in saved["config"]
    stored = report.with_run_id(7)
    assert stored.to_json()["config"]["run_id"] == 7 and list(stored.to_json()["config"])[-1] == "run_id"
    assert EvalReport.from_json(stored.to_json()) == stored
    assert "per_query" not in report.summary_json() and report.summary_json()["gate"] == saved["gate"]


def test_read_report_names_a_file_that_is_not_a_report() -> None:
    with pytest.raises(RagError, match=r"x\.json is not the JSON of `rag eval --json OUT`"):
        evaluate.read_report({"stages": {}}, "x.json")
    with pytest.raises(RagError, match="is not the JSON"):
        evaluate.read_report([], "x.json")


# ---------------------------------------------------------------------------------------------
# Comparisons and regressions


def test_compare_keeps_tiny_p_values() -> None:
    # 38 wins and 3 losses: p = 2 * sum(C(41, i), i <= 3) / 2^41 ~ 1.5e-8, which 6 decimals printed as 0.
    a = {f"q{i}": r for i, r in enumerate([9] * 38 + [1] * 3)}
    b = {f"q{i}": r for i, r in enumerate([1] * 38 + [9] * 3)}
    row = evaluate.compare_ranks(a, b, stage_a="dense", stage_b="dense", ks=[4]).rows[0]
    assert (row.wins, row.losses) == (38, 3)
    assert row.p == pytest.approx(sign_test(38, 3), rel=1e-2)
    assert 0 < row.p < 1e-6
    with pytest.raises(RagError, match="share no answerable query"):
        evaluate.compare_ranks({"q1": 1}, {"q2": 1}, stage_a="dense", stage_b="dense", ks=[4])


def test_compare_two_stages_of_one_run(built: Any, golden: Golden, settings: Settings) -> None:
    report = run(built, golden, settings)
    result = evaluate.compare_reports(report, report, stage_a="dense", stage_b="hybrid", ks=[1, 4])
    # k=1: dense passes G3 only; hybrid passes G1/q, G1/p1, G3 -> +2/-0, p = 2 * (1/2)^2 = 0.5.
    assert result.queries == 4
    assert result.rows[0].to_json() == {"k": 1, "a": 0.25, "b": 0.75, "wins": 2, "losses": 0, "p": 0.5}
    assert result.rows[1].wins == 0 and result.rows[1].losses == 0 and result.rows[1].p == 1.0
    assert "+2/-0" in format_comparison(result)
    assert list(result.to_json()) == ["a", "b", "queries", "only_a", "only_b", "rows"]
    assert [r.k for r in evaluate.compare_reports(report, report, stage_a="dense").rows] == [1, 4, 8, 20]
    with pytest.raises(RagError, match="stage 'fts' is not in this run"):
        evaluate.compare_reports(report, report, stage_a="fts")


def test_regressions_list_flipped_queries(built: Any, golden: Golden, settings: Settings) -> None:
    baseline = run(built, golden, settings)
    worse = dict(SCRIPT)
    worse[("How much leave after five years?", "hybrid")] = [("leave.md", 0, 0.3)]
    worse[("What is the senior pay cap?", "dense")] = [("leave.md", 0, 0.3)] * 9 + [("pay.md", 0, 0.4)]
    current = run(built, golden, settings, ScriptedSearch(worse))
    assert evaluate.regressions(baseline, current, k=8) == {"dense": ["G3/q"], "hybrid": ["G1/q"]}
    assert evaluate.regressions(baseline, baseline, k=8) == {"dense": [], "hybrid": []}


def test_breakdown_by_wording_and_language_by_hand(built: Any, golden: Golden, settings: Settings) -> None:
    report = run(built, golden, settings)
    groups = {(g.by, g.group): g for g in evaluate.breakdown(report)}
    # Answerable: questions G1/q (dense 2), G2/q (none), G3/q (1); the paraphrase G1/p1 (dense 4).
    assert set(groups) == {("wording", "question"), ("wording", "paraphrase"), ("language", "en")}
    question, paraphrase = groups[("wording", "question")], groups[("wording", "paraphrase")]
    assert question.n == 3 and paraphrase.n == 1
    assert question.hit_rate["dense"][1].hits == 1 and question.hit_rate["dense"][4].value == round(2 / 3, 4)
    assert question.mrr["dense"][4] == round((1 / 2 + 1) / 3, 4)
    assert paraphrase.hit_rate["dense"][1].value == 0.0 and paraphrase.hit_rate["dense"][4].value == 1.0
    assert paraphrase.mrr["dense"][20] == 0.25 and paraphrase.mrr["hybrid"][20] == 1.0
    assert groups[("language", "en")].n == 4
    out = report.to_json()["breakdown"]
    assert out[0] == {"by": "wording", "group": "question", "n": 3, "stages": {
        s: {**{f"recall@{k}": question.hit_rate[s][k].to_json() for k in report.config.ks},
            **{f"mrr@{k}": question.mrr[s][k] for k in report.config.ks}} for s in report.stages}}
    assert "answerable queries by kind" in format_report(report)


def test_breakdown_splits_vietnamese_wordings(built: Any, golden: Golden, settings: Settings) -> None:
    report = run(built, golden, settings)
    texts = {"G1/q": "Nghỉ phép bao lâu sau năm năm?", "G1/p1": "nghi phep bao lau sau 5 nam vay"}
    changed = tuple(dataclasses.replace(q, query=texts.get(q.id, q.query)) for q in report.per_query)
    groups = {(g.by, g.group): g.n for g in evaluate.breakdown(dataclasses.replace(report, per_query=changed))}
    assert groups[("language", "vi")] == 1 and groups[("language", "vi-toneless")] == 1
    assert groups[("language", "en")] == 2


def test_format_report_shows_every_table(built: Any, golden: Golden, settings: Settings) -> None:
    text = format_report(run(built, golden, settings))
    assert "0.250 [" in text  # dense R@1 with its interval
    assert "recommended threshold 0.400" in text
    assert "G2/q" in text and "bluff" in text
    assert "G2/q" not in format_report(run(built, golden, settings), per_query=False)


# ---------------------------------------------------------------------------------------------
# Strategy table


class DenseSearch:
    """A tiny exact dense retriever over the stored vectors (enough to rank a toy corpus)."""

    def __call__(self, conn: Any, query: str, *, embedder: Any, settings: Settings, groups: Sequence[str] = ("all",),
                 collection: str | None = None, stage: str = "dense", k: int | None = None,
                 reranker: Any = None) -> list[Hit]:
        coll = store.require_collection(conn, collection or settings.collection)
        visible = set(store.visible_access_keys(conn, groups))
        rows = [r for r in store.chunk_rows(conn, collection=coll.name) if r["access_key"] in visible]
        vectors = store.chunk_vectors(conn, coll.dimension, [r["id"] for r in rows])
        q = embedder.embed_queries([query])[0]
        scored = sorted(((1 - float(np.dot(q, vectors[r["id"]])), r) for r in rows), key=lambda x: x[0])
        return [Hit(chunk_id=r["id"], document_id=r["document_id"], source=r["source"], title=r["title"],
                    section=r["section"], content=r["content"], char_from=r["char_from"], char_to=r["char_to"],
                    page=None, distance=d) for d, r in scored[: k or 20]]


def test_run_strategies(tmp_path: Path, settings: Settings) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "leave.md").write_text(
        "---\ntitle: Leave\n---\n\n## Annual leave\n\nEmployees earn 4 hours per pay period at first.\n\n"
        f"{NEEDLE}.\n\n## Sick leave\n\nSick leave accrues at 4 hours per pay period.\n", encoding="utf-8")
    (corpus / "travel.md").write_text("# Travel\n\nBook travel through the agency portal early.\n", encoding="utf-8")
    golden = parse_golden(GOLDEN[:1] + GOLDEN[4:], "mini")
    work = tmp_path / "work"
    work.mkdir()
    seen: list[str] = []
    result = evaluate.run_strategies(corpus, golden, settings=settings, embedder=FakeEmbedder(),
                                     strategies=["A", "C", "E"], search_fn=DenseSearch(), workdir=work,
                                     ks=[1, 4], on_strategy=seen.append)
    assert seen == ["A", "C", "E"]
    assert [r.strategy for r in result.rows] == ["A", "C", "E"]
    assert list(work.iterdir()) == []  # temporary databases are gone
    for row in result.rows:
        assert row.chunks >= 2 and row.embedded_tokens > 0 and row.leaks == 0
        ranks = list(result.ranks[row.strategy].values())
        assert row.hit_rate[4].value == round(hit_rate_at_k(ranks, 4), 4)
    assert [(t.a, t.b, t.k) for t in result.sign_tests] == [("E", "A", 1), ("E", "A", 4), ("E", "C", 1), ("E", "C", 4)]
    for t in result.sign_tests:
        e, other = result.ranks[t.a], result.ranks[t.b]
        ids = sorted(e)
        assert (t.wins, t.losses) == paired_counts([other[q] for q in ids], [e[q] for q in ids], t.k)
    assert "E vs A at R@4" in format_strategies(result)
    saved = result.to_json()
    assert list(saved) == ["stage", "ks", "golden", "rows", "sign_tests", "ranks"]
    assert list(saved["rows"][0]) == ["strategy", "recall@1", "recall@4", "mrr", "destroyed", "chunks",
                                      "embedded_tokens", "truncated", "leaks"]
    assert evaluate.StrategyTable.from_json(json.loads(json.dumps(saved))) == result
    with pytest.raises(RagError, match="unknown strategy"):
        evaluate.run_strategies(corpus, golden, settings=settings, embedder=FakeEmbedder(), strategies=["Z"],
                                search_fn=DenseSearch())


# ---------------------------------------------------------------------------------------------
# CLI


@pytest.fixture
def cli_env(built: Any, golden: Golden, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import rag.registry

    monkeypatch.setattr(evaluate, "default_search", lambda: ScriptedSearch(SCRIPT))
    monkeypatch.setattr(rag.registry, "load_embedder", lambda spec="minilm", threads=0: FakeEmbedder())
    path = tmp_path / "golden_test.json"
    path.write_text(json.dumps(GOLDEN), encoding="utf-8")
    return path


def test_cli_parses_run_as_the_default() -> None:
    from rag.cli import build_parser

    parser, _ = build_parser()
    plain = parser.parse_args(["eval", "--db", "x.db", "--golden", "g.json", "-k", "1,8"])
    assert plain.eval_command is None and plain.golden == "g.json" and plain.k == "1,8" and plain.groups_as_golden
    explicit = parser.parse_args(["eval", "run", "--db", "x.db", "--golden", "g.json", "--no-groups-as-golden"])
    assert explicit.eval_command == "run" and explicit.db == "x.db" and not explicit.groups_as_golden
    compare = parser.parse_args(["eval", "compare", "a.json", "b.json", "--stage", "dense", "-k", "8"])
    assert compare.eval_command == "compare" and compare.runs == ["a.json", "b.json"] and compare.k == 8


def test_cli_eval_run_compare_history(cli_env: Path, db_path: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    from rag.cli import main

    out = tmp_path / "run.json"
    assert main(["eval", "--db", str(db_path), "--golden", str(cli_env), "--stages", "dense,hybrid",
                 "--json", str(out), "--sweep", "grid"]) == 0
    text = capsys.readouterr().out
    assert "recommended threshold 0.400" in text and "G1/p1" in text
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["stages"]["hybrid"]["recall@1"]["value"] == 0.75
    assert report["config"]["run_id"] == 1 and report["config"]["golden"]["name"] == "golden_test"

    assert main(["eval", "compare", str(out), "--stages", "dense,hybrid", "-k", "1"]) == 0
    assert "+2/-0" in capsys.readouterr().out
    assert main(["eval", "compare", str(out), str(out), "--stage", "dense"]) == 0
    assert "+0/-0" in capsys.readouterr().out
    assert main(["eval", "compare", str(out)]) == 1
    assert "two of its stages" in capsys.readouterr().err

    assert main(["eval", "run", "--db", str(db_path), "--golden", str(cli_env), "--stages", "dense,hybrid",
                 "--brief", "--calibrate"]) == 0
    assert "gate threshold set to" in capsys.readouterr().out
    conn = store.connect(db_path)
    assert store.require_collection(conn, "default").max_distance == 0.604  # see the quantile-sweep test
    conn.close()
    assert main(["eval", "history", "--db", str(db_path)]) == 0
    assert "golden_test" in capsys.readouterr().out


def test_cli_eval_fails_on_leaks(cli_env: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    from rag.cli import main

    monkeypatch.setattr(evaluate, "default_search", lambda: ScriptedSearch(SCRIPT, leaky=True))
    assert main(["eval", "--db", str(db_path), "--golden", str(cli_env), "--stages", "dense", "--no-save"]) == 1
    assert "leak" in capsys.readouterr().err


def test_cli_eval_refuses_a_report_path_it_cannot_write_before_the_run(
    cli_env: Path, db_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rag.cli import main

    def no_run(*_a: object, **_k: object) -> None:
        raise AssertionError("the report path is checked before the evaluation runs")

    monkeypatch.setattr(evaluate, "run_eval", no_run)
    folder = tmp_path / "reports"
    folder.mkdir()
    base = ["eval", "--db", str(db_path), "--golden", str(cli_env), "--no-save", "--json"]
    assert main([*base, str(folder)]) == 1
    assert capsys.readouterr().err == f"error: cannot write the report to {folder}: it is a folder; give a file name\n"
    blocker = tmp_path / "a-file"
    blocker.write_text("x", encoding="utf-8")
    assert main([*base, str(blocker / "run.json")]) == 1
    assert capsys.readouterr().err == (f"error: cannot write the report to {blocker / 'run.json'}: {blocker} is a "
                                       "file, not a folder\n")
    assert main(["eval", "strategies", "--corpus", str(tmp_path), "--golden", str(cli_env), "--json",
                 str(folder)]) == 1
    assert "it is a folder" in capsys.readouterr().err


def test_cli_eval_needs_an_existing_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rag.cli import main

    golden = tmp_path / "g.json"
    golden.write_text(json.dumps(GOLDEN), encoding="utf-8")
    assert main(["eval", "--db", str(tmp_path / "missing.db"), "--golden", str(golden)]) == 1
    assert "no database" in capsys.readouterr().err
    assert not (tmp_path / "missing.db").exists()


