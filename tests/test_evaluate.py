"""rag.evaluate: metrics against hand-computed numbers, the gate sweep, a full run over a real
SQLite file (real migrations, real sqlite-vec) with a scripted retriever, history, and the CLI."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag import evaluate, store
from rag.config import Settings
from rag.errors import RagError
from rag.evaluate import (
    Evidence,
    GateCase,
    GatePoint,
    destroyed_needles,
    expand_queries,
    first_relevant_rank,
    flips,
    gate_kept,
    is_relevant,
    mrr_at_k,
    paired_counts,
    parse_golden,
    recall_at_k,
    recommend_threshold,
    sign_test,
    sweep_gate,
    sweep_thresholds,
    threshold_grid,
    threshold_quantiles,
    wilson_interval,
)
from rag.models import Chunk, Hit

from .fakes import FakeEmbedder

Z = 1.959963984540054  # the 0.975 quantile of the standard normal

# ---------------------------------------------------------------------------------------------
# Pure metrics


def test_recall_at_k_by_hand() -> None:
    ranks = [1, 3, None, 5]
    assert recall_at_k(ranks, 1) == 1 / 4
    assert recall_at_k(ranks, 4) == 2 / 4
    assert recall_at_k(ranks, 5) == 3 / 4
    assert recall_at_k([], 4) == 0.0


def test_mrr_at_k_by_hand() -> None:
    ranks = [1, 3, None, 5]
    assert mrr_at_k(ranks, 4) == pytest.approx((1 + 1 / 3) / 4)
    assert mrr_at_k(ranks, 5) == pytest.approx((1 + 1 / 3 + 1 / 5) / 4)
    assert mrr_at_k(ranks, 1) == pytest.approx(1 / 4)
    assert mrr_at_k([], 4) == 0.0


@pytest.mark.parametrize("fn", [recall_at_k, mrr_at_k])
def test_k_must_be_positive(fn: Any) -> None:
    with pytest.raises(ValueError, match="k must be at least 1"):
        fn([1], 0)


def test_first_relevant_rank() -> None:
    assert first_relevant_rank([False, False, True, True]) == 3
    assert first_relevant_rank([False]) is None
    assert first_relevant_rank([]) is None


def test_wilson_10_of_20_by_hand() -> None:
    # p = 0.5: the centre is exactly 0.5 and half = z/(1 + z²/20) * sqrt(0.25/20 + z²/1600).
    half = Z / (1 + Z * Z / 20) * math.sqrt(0.25 / 20 + Z * Z / 1600)
    low, high = wilson_interval(10, 20)
    assert low == pytest.approx(0.5 - half, abs=1e-12)
    assert high == pytest.approx(0.5 + half, abs=1e-12)
    assert (round(low, 4), round(high, 4)) == (0.2993, 0.7007)


def test_wilson_at_the_edges_by_hand() -> None:
    # 0/n: [0, z²/(n + z²)]; n/n: [n/(n + z²), 1].
    assert wilson_interval(0, 10) == pytest.approx((0.0, Z * Z / (10 + Z * Z)), abs=1e-12)
    assert wilson_interval(20, 20) == pytest.approx((20 / (20 + Z * Z), 1.0), abs=1e-12)
    assert round(wilson_interval(0, 10)[1], 4) == 0.2775
    assert round(wilson_interval(20, 20)[0], 4) == 0.8389
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_wilson_matches_seed_000() -> None:
    # Seed 000: "Wilson interval 95 % on R@20 is [0.471, 0.705] for A and [0.718, 0.901] for E" (64 queries).
    assert tuple(round(x, 3) for x in wilson_interval(38, 64)) == (0.471, 0.705)
    assert tuple(round(x, 3) for x in wilson_interval(53, 64)) == (0.718, 0.901)


def test_wilson_rejects_impossible_counts() -> None:
    with pytest.raises(ValueError):
        wilson_interval(5, 4)
    with pytest.raises(ValueError):
        wilson_interval(1, 4, confidence=1.0)


def test_sign_test_by_hand() -> None:
    # 7 wins, 1 loss: 2 * (C(8,7) + C(8,8)) / 2^8 = 18/256.
    assert sign_test(7, 1) == 18 / 256 == 0.0703125
    assert sign_test(1, 7) == 0.0703125
    # 12/2: 2 * (C(14,12) + C(14,13) + C(14,14)) / 2^14 = 2 * (91 + 14 + 1) / 16384.
    assert sign_test(12, 2) == pytest.approx(2 * 106 / 2**14, abs=1e-15)
    assert sign_test(3, 3) == 1.0
    assert sign_test(0, 0) == 1.0


def test_sign_test_matches_seed_000() -> None:
    # E vs A +18/-3 p = 0.0015; E vs C +12/-2 p = 0.0129; B vs A +8/-6 p = 0.79; hybrid vs BM25 +10/-3 p = 0.09.
    assert round(sign_test(18, 3), 4) == 0.0015
    assert round(sign_test(12, 2), 4) == 0.0129
    assert round(sign_test(8, 6), 2) == 0.79
    assert round(sign_test(9, 7), 2) == 0.80
    assert round(sign_test(10, 3), 2) == 0.09
    assert round(sign_test(10, 6), 2) == 0.45


def test_compare_keeps_tiny_p_values() -> None:
    # 38 wins and 3 losses: p = 2 * sum(C(41, i), i <= 3) / 2^41 ~ 1.5e-8, which 6 decimals printed as 0.
    def report(ranks: list[int | None]) -> dict[str, Any]:
        per_query = [{"id": f"q{i}", "kind": "answerable", "ranks": {"dense": r}} for i, r in enumerate(ranks)]
        return {"config": {"ks": [4]}, "stages": {"dense": {}}, "per_query": per_query}

    a = report([9] * 38 + [1] * 3)
    b = report([1] * 38 + [9] * 3)
    row = evaluate.compare_reports(a, b, stage_a="dense")["rows"][0]
    assert (row["wins"], row["losses"]) == (38, 3)
    assert row["p"] == pytest.approx(sign_test(38, 3), rel=1e-2)
    assert 0 < row["p"] < 1e-6


def test_paired_counts_by_hand() -> None:
    # A passes at k=4: T F F T; B passes: F T T T -> B wins twice, loses once.
    assert paired_counts([1, None, 5, 2], [None, 3, 1, 2], 4) == (2, 1)
    # k=5: A passes T F T T now, so only the second query is a win.
    assert paired_counts([1, None, 5, 2], [None, 3, 1, 2], 5) == (1, 1)
    assert paired_counts([1, None, 5, 2], [None, 3, 1, 2], 1) == (1, 1)
    with pytest.raises(ValueError):
        paired_counts([1], [1, 2], 1)


def test_flips() -> None:
    before = {"a": 1, "b": 9, "c": None, "d": 3, "only-before": 1}
    after = {"a": None, "b": 2, "c": None, "d": 8, "only-after": None}
    assert flips(before, after, 8) == (["a"], ["b"])
    assert flips(before, after, 4) == (["a", "d"], ["b"])


# ---------------------------------------------------------------------------------------------
# Gate and sweep


def test_gate_kept_first_max_sources_under_threshold() -> None:
    distances = [0.3, 0.7, 0.5, 0.2, 0.6, 0.1]
    assert gate_kept(distances, 0.65, 4) == [0, 2, 3, 4]
    assert gate_kept(distances, 0.5, 4) == [0, 3, 5]  # strictly below: 0.5 itself is dropped
    assert gate_kept(distances, 0.05, 4) == []


CASES = [
    GateCase("unanswerable", (0.5, 0.6), (False, False)),
    GateCase("forbidden", (0.7,), (False,)),
    GateCase("answerable", (0.3, 0.45), (False, True)),
    GateCase("answerable", (0.55,), (True,)),
    GateCase("answerable", (0.2,), (False,)),  # destroyed: lost at every threshold
]


def test_sweep_gate_by_hand() -> None:
    curve = sweep_gate(CASES, [0.4, 0.5, 0.6, 0.75], max_sources=4)
    got = [(p.threshold, p.bluffs_unanswerable, p.bluffs_forbidden, p.lost) for p in curve]
    assert got == [(0.4, 0, 0, 3), (0.5, 0, 0, 2), (0.6, 1, 0, 1), (0.75, 1, 1, 1)]
    assert [p.errors for p in curve] == [3, 2, 2, 3]
    # 0.5 and 0.6 both make 2 errors; 0.5 has fewer bluffs.
    assert recommend_threshold(curve).threshold == 0.5


def test_sweep_gate_respects_max_sources() -> None:
    case = GateCase("answerable", (0.1, 0.1, 0.2), (False, False, True))
    assert sweep_gate([case], [0.25], max_sources=2)[0].lost == 1
    assert sweep_gate([case], [0.25], max_sources=3)[0].lost == 0


def test_recommend_tie_goes_to_the_lower_threshold() -> None:
    curve = [GatePoint(0.6, 1, 0, 1), GatePoint(0.45, 1, 0, 1), GatePoint(0.5, 0, 0, 3)]
    assert recommend_threshold(curve).threshold == 0.45
    with pytest.raises(ValueError):
        recommend_threshold([])


def test_threshold_grid() -> None:
    grid = threshold_grid()
    assert len(grid) == 17
    assert grid[0] == 0.4 and grid[-1] == 0.8
    assert 0.675 in grid and 0.525 in grid


def test_threshold_quantiles() -> None:
    assert threshold_quantiles([0.1, 0.2, 0.3, 0.4, 0.5], levels=(0.5, 0.25)) == [0.2, 0.3]
    assert threshold_quantiles([]) == []


def test_quantile_sweep_finds_the_range_of_a_compressed_model() -> None:
    # An e5-like model: every distance under 0.45, so the fixed 0.40-0.80 grid lets every
    # unanswerable query through, while thresholds from observed quantiles separate them.
    cases = [GateCase("answerable", (d,), (True,)) for d in (0.20, 0.22, 0.25)] + [
        GateCase("unanswerable", (d,), (False,)) for d in (0.30, 0.32, 0.35)
    ]
    by_grid = recommend_threshold(sweep_gate(cases, sweep_thresholds(cases, "grid"), 4))
    by_quantiles = recommend_threshold(sweep_gate(cases, sweep_thresholds(cases, "quantiles"), 4))
    assert by_grid.errors == 3
    assert by_quantiles.errors == 0
    assert 0.25 < by_quantiles.threshold <= 0.30


def test_sweep_thresholds_modes() -> None:
    both = sweep_thresholds(CASES, "both", 4, extra=[0.675, 0.333])
    assert [t for t, _ in both] == sorted(t for t, _ in both)
    assert dict(both)[0.4] == "grid"
    assert dict(both)[0.333] == "current"
    assert {origin for _, origin in sweep_thresholds(CASES, "quantiles", 4)} == {"quantile"}
    with pytest.raises(ValueError, match="grid, quantiles, both"):
        sweep_thresholds(CASES, "fixed")


def test_gate_kept_agrees_with_apply_gate() -> None:
    from rag import gate

    distances = [0.3, 0.7, 0.5, 0.2, 0.6, 0.1]
    hits = [_hit(i, d) for i, d in enumerate(distances)]
    kept, _dropped = gate.apply_gate(hits, 0.65, 4)
    assert [h.chunk_id for h in kept] == gate_kept(distances, 0.65, 4)


def _hit(chunk_id: int, distance: float, source: str = "x.md", content: str = "") -> Hit:
    return Hit(chunk_id=chunk_id, document_id=1, source=source, title="", section="", content=content,
               char_from=0, char_to=len(content), page=None, distance=distance)


# ---------------------------------------------------------------------------------------------
# Golden sets and relevance

NEEDLE = "Between 3 and 15 years of service: 6 hours per pay period"


def test_relevance_rule_normalises_case_and_whitespace() -> None:
    evidence = [Evidence("leave.md", NEEDLE)]
    content = "Intro.\nBetween 3 and\n   15 YEARS of service:\u00a06 hours per pay period.\nMore."
    assert is_relevant("leave.md", content, evidence)
    assert not is_relevant("other.md", content, evidence)  # same words, wrong source
    assert not is_relevant("leave.md", "Between 3 and 15 years of service: 6 hours", evidence)  # half a needle
    assert not is_relevant("leave.md", content, [])
    assert is_relevant("b.md", "x " + NEEDLE, [Evidence("a.md", "nothing here"), Evidence("b.md", NEEDLE)])


def test_destroyed_needles() -> None:
    contents = {"a.md": ["first half of the needle", "second half"], "b.md": ["The Whole   needle here"]}
    needles = [("a.md", "half of the needle second half"), ("b.md", "whole needle"), ("c.md", "gone")]
    assert destroyed_needles(contents, needles) == [("a.md", "half of the needle second half"), ("c.md", "gone")]


def test_parse_golden_rejects_bad_items() -> None:
    good = {"id": "G1", "kind": "answerable", "question": "q?", "paraphrases": ["p"], "groups": ["all"],
            "evidence": [{"source": "a.md", "quote": "x"}]}
    assert parse_golden([good]).items[0].evidence == (Evidence("a.md", "x"),)
    with pytest.raises(RagError, match="duplicate id"):
        parse_golden([good, good])
    with pytest.raises(RagError, match="kind must be one of"):
        parse_golden([{**good, "kind": "maybe"}])
    with pytest.raises(RagError, match="needs evidence"):
        parse_golden([{**good, "evidence": []}])
    with pytest.raises(RagError, match="non-empty JSON list"):
        parse_golden({})


def test_expand_queries_every_wording_with_its_groups() -> None:
    golden = parse_golden(GOLDEN)
    queries = expand_queries(golden.items)
    assert [q.id for q in queries] == ["G1/q", "G1/p1", "G2/q", "G3/q", "G4/q", "G5/q"]
    assert queries[1].wording == "paraphrase 1" and queries[1].text == "how many hrs per paycheck after 5 yrs"
    assert queries[3].groups == ("hr",) and queries[3].kind == "answerable"
    public = expand_queries(golden.items, groups_as_golden=False)
    assert public[3].groups == ("all",) and public[3].kind == "forbidden"
    assert [q.kind for q in public if q.item.id != "G3"] == [q.kind for q in queries if q.item.id != "G3"]


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
                 reranker: Any = None) -> list[Hit]:
        self.calls.append({"query": query, "stage": stage, "groups": list(groups), "k": k})
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


@pytest.fixture
def golden() -> evaluate.Golden:
    return parse_golden(GOLDEN, "golden_test", "f" * 64)


@pytest.fixture
def built(conn: Any, fake_embedder: FakeEmbedder) -> Any:
    build_db(conn, fake_embedder)
    return conn


def run(conn: Any, golden: evaluate.Golden, settings: Settings, search: Any = None, **kw: Any) -> dict[str, Any]:
    kw.setdefault("stages", ["dense", "hybrid"])
    kw.setdefault("sweep", "grid")
    return evaluate.run_eval(conn, golden, embedder=FakeEmbedder(), settings=settings,
                             search_fn=search or ScriptedSearch(SCRIPT), **kw)


def test_run_eval_metrics_by_hand(built: Any, golden: evaluate.Golden, settings: Settings) -> None:
    report = run(built, golden, settings)
    assert set(report) >= {"queries", "stages", "destroyed", "leaks", "gate", "per_query"}
    assert report["queries"] == {"total": 6, "items": 5, "answerable": 4, "unanswerable": 1, "forbidden": 1}
    dense, hybrid = report["stages"]["dense"], report["stages"]["hybrid"]
    # Answerable ranks: dense G1/q 2, G1/p1 4, G2 none (destroyed), G3 1; hybrid 1, 1, none, 1.
    assert dense["n"] == 4
    assert dense["recall@1"]["value"] == 0.25 and dense["recall@1"]["hits"] == 1
    assert dense["recall@4"]["value"] == 0.75
    assert dense["recall@4"]["ci"] == [round(x, 4) for x in wilson_interval(3, 4)]
    assert dense["mrr@4"] == round((1 / 2 + 1 / 4 + 1) / 4, 4)
    assert dense["mrr@1"] == 0.25
    assert hybrid["recall@1"]["value"] == 0.75 and hybrid["mrr@20"] == 0.75
    assert dense["ceiling"] == hybrid["ceiling"] == 0.75
    assert report["destroyed"]["items"] == ["G2"] and report["destroyed"]["queries"] == 1
    assert report["leaks"]["total"] == 0 and dense["leaks"] == hybrid["leaks"] == 0
    rows = {q["id"]: q for q in report["per_query"]}
    assert rows["G1/p1"]["ranks"] == {"dense": 4, "hybrid": 1}
    assert rows["G2/q"]["destroyed"] and rows["G2/q"]["ranks"] == {"dense": None, "hybrid": None}
    assert rows["G5/q"]["min_distance"] == {"dense": 0.66, "hybrid": 0.66}  # the closest, not the first


def test_run_eval_asks_each_query_as_its_groups(built: Any, golden: evaluate.Golden, settings: Settings) -> None:
    search = ScriptedSearch(SCRIPT)
    run(built, golden, settings, search)
    asked = {(c["query"], c["stage"]): c["groups"] for c in search.calls}
    assert asked[("What is the senior pay cap?", "dense")] == ["hr"]
    assert asked[("What is the senior band maximum?", "hybrid")] == ["all"]
    assert len(search.calls) == 12 and {c["k"] for c in search.calls} == {20}


def test_run_eval_gate_sweep_by_hand(built: Any, golden: evaluate.Golden, settings: Settings) -> None:
    gate = run(built, golden, settings)["gate"]
    # Hybrid hits: G1/q kept from 0.35, G1/p1 from 0.60, G2 always lost, G3 from 0.25,
    # G4 (forbidden) bluffs above 0.62, G5 (unanswerable) above 0.66.
    assert gate["stage"] == "hybrid" and gate["max_sources"] == 4
    assert gate["answerable"] == 4 and gate["must_refuse"] == 2
    assert gate["current"] == {"threshold": 0.675, "origin": "grid", "bluffs": 2, "bluffs_unanswerable": 1,
                               "bluffs_forbidden": 1, "lost": 1, "errors": 3}
    by = {p["threshold"]: (p["bluffs"], p["lost"]) for p in gate["curve"]}
    assert by[0.4] == (0, 2) and by[0.6] == (0, 2) and by[0.625] == (1, 1) and by[0.8] == (2, 1)
    # 2 errors from 0.40 to 0.65; fewest bluffs, then the lowest threshold.
    assert gate["recommended"]["threshold"] == 0.4
    outcome = {q["id"]: q["gate"] for q in run(built, golden, settings)["per_query"]}
    assert outcome == {"G1/q": "ok", "G1/p1": "ok", "G2/q": "lost", "G3/q": "ok", "G4/q": "bluff", "G5/q": "bluff"}


def test_run_eval_quantile_sweep_beats_the_grid(built: Any, golden: evaluate.Golden, settings: Settings) -> None:
    gate = run(built, golden, settings, sweep="both")["gate"]
    # Deciding distances 0.25, 0.35, 0.60, 0.62, 0.66; the 55 % quantile 0.60 + 0.2 * 0.02 = 0.604
    # keeps G1/p1 (0.60) and still refuses G4 (0.62): only the destroyed G2 is lost.
    assert gate["recommended"] == {"threshold": 0.604, "origin": "quantile", "bluffs": 0, "bluffs_unanswerable": 0,
                                   "bluffs_forbidden": 0, "lost": 1, "errors": 1}
    assert {p["origin"] for p in gate["curve"]} == {"grid", "quantile"}


def test_collection_threshold_is_the_current_one(built: Any, golden: evaluate.Golden, settings: Settings) -> None:
    store.set_collection_threshold(built, "default", 0.333)
    gate = run(built, golden, settings)["gate"]
    assert gate["current"]["threshold"] == 0.333 and gate["current"]["origin"] == "current"


def test_leaks_are_caught(built: Any, golden: evaluate.Golden, settings: Settings) -> None:
    report = run(built, golden, settings, ScriptedSearch(SCRIPT, leaky=True))
    # Dense returns pay.md first for G4 (forbidden evidence) to a reader of ["all"].
    assert report["leaks"]["total"] == 1
    assert report["leaks"]["by_stage"] == {"dense": 1, "hybrid": 0}
    leak = report["leaks"]["list"][0]
    assert (leak["query"], leak["stage"], leak["rank"], leak["reason"]) == ("G4/q", "dense", 1, "forbidden evidence")
    assert {q["id"]: q["leaks"] for q in report["per_query"]}["G4/q"] == ["dense"]


def test_unreadable_documents_are_leaks_too(built: Any, golden: evaluate.Golden, settings: Settings) -> None:
    script = dict(SCRIPT)
    script[("Can I bring my dog?", "hybrid")] = [("pay.md", 0, 0.5)]
    report = run(built, golden, settings, ScriptedSearch(script, leaky=True))
    reasons = {(x["query"], x["stage"]): x["reason"] for x in report["leaks"]["list"]}
    assert reasons[("G5/q", "hybrid")] == "unreadable document"


def test_no_groups_as_golden_makes_restricted_answers_forbidden(
    built: Any, golden: evaluate.Golden, settings: Settings
) -> None:
    report = run(built, golden, settings, groups_as_golden=False)
    assert report["queries"]["answerable"] == 3 and report["queries"]["forbidden"] == 2
    assert report["leaks"]["total"] == 0
    leaky = run(built, golden, settings, ScriptedSearch(SCRIPT, leaky=True), groups_as_golden=False)
    assert {x["query"] for x in leaky["leaks"]["list"]} == {"G3/q", "G4/q"}


def test_run_eval_rejects_bad_input(built: Any, golden: evaluate.Golden, settings: Settings) -> None:
    with pytest.raises(RagError, match="unknown stage"):
        run(built, golden, settings, stages=["dense", "bm25"])
    with pytest.raises(RagError, match="k must be"):
        run(built, golden, settings, ks=[0, 4])
    with pytest.raises(RagError, match="no collection"):
        run(built, golden, settings, collection="nope")


# ---------------------------------------------------------------------------------------------
# Comparisons, regressions, history


def test_compare_two_stages_of_one_run(built: Any, golden: evaluate.Golden, settings: Settings) -> None:
    report = run(built, golden, settings)
    result = evaluate.compare_reports(report, report, stage_a="dense", stage_b="hybrid", ks=[1, 4])
    # k=1: dense passes G3 only; hybrid passes G1/q, G1/p1, G3 -> +2/-0, p = 2 * (1/2)^2 = 0.5.
    assert result["queries"] == 4
    assert result["rows"][0] == {"k": 1, "a": 0.25, "b": 0.75, "wins": 2, "losses": 0, "p": 0.5}
    assert result["rows"][1]["wins"] == 0 and result["rows"][1]["losses"] == 0 and result["rows"][1]["p"] == 1.0
    assert "+2/-0" in evaluate.format_comparison(result)


def test_regressions_list_flipped_queries(built: Any, golden: evaluate.Golden, settings: Settings) -> None:
    baseline = run(built, golden, settings)
    worse = dict(SCRIPT)
    worse[("How much leave after five years?", "hybrid")] = [("leave.md", 0, 0.3)]
    worse[("What is the senior pay cap?", "dense")] = [("leave.md", 0, 0.3)] * 9 + [("pay.md", 0, 0.4)]
    current = run(built, golden, settings, ScriptedSearch(worse))
    assert evaluate.regressions(baseline, current, k=8) == {"dense": ["G3/q"], "hybrid": ["G1/q"]}
    assert evaluate.regressions(baseline, baseline, k=8) == {"dense": [], "hybrid": []}


def test_history_round_trip_and_flips(built: Any, golden: evaluate.Golden, settings: Settings) -> None:
    first = run(built, golden, settings, commit="abc123")
    first_id = evaluate.save_run(built, first)
    assert evaluate.load_report(built, first_id) == {**first, "config": {**first["config"], "run_id": first_id}}
    worse = dict(SCRIPT)
    worse[("How much leave after five years?", "dense")] = [("leave.md", 0, 0.3)]
    second_id = evaluate.save_run(built, run(built, golden, settings, ScriptedSearch(worse)))
    assert evaluate.previous_run(built, second_id) == first_id
    assert evaluate.previous_run(built, first_id) is None
    assert evaluate.run_flips(built, second_id, k=8) == [
        {"query": "G1/q", "stage": "dense", "change": "lost", "before": 2, "after": None}
    ]
    runs = evaluate.list_runs(built, golden_name="golden_test")
    assert [r["id"] for r in runs] == [second_id, first_id]
    assert runs[1]["git_commit"] == "abc123" and runs[1]["embedder"] == FakeEmbedder.model_id
    assert runs[1]["metrics"]["dense"]["recall@4"]["value"] == 0.75
    stored = built.execute("SELECT count(*) FROM eval_results WHERE run_id = ?", (first_id,)).fetchone()[0]
    assert stored == 6 * 2
    assert "golden_test" in evaluate.format_history(runs)
    with pytest.raises(RagError):
        evaluate.load_report(built, 999)


def test_format_report_shows_every_table(built: Any, golden: evaluate.Golden, settings: Settings) -> None:
    text = evaluate.format_report(run(built, golden, settings))
    assert "0.250 [" in text  # dense R@1 with its interval
    assert "recommended threshold 0.400" in text
    assert "G2/q" in text and "bluff" in text
    assert "G2/q" not in evaluate.format_report(run(built, golden, settings), per_query=False)


# ---------------------------------------------------------------------------------------------
# Migration


def test_migration_creates_exact_columns(tmp_path: Path) -> None:
    conn = store.connect(tmp_path / "m.db")
    store.migrate(conn, stop_before="0002_eval_runs")
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "eval_runs" not in tables
    assert store.migrate(conn)[0] == "0002_eval_runs"

    def columns(table: str) -> list[str]:
        return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]

    assert columns("eval_runs") == [
        "id", "created_at", "collection", "embedder", "strategy", "stages", "ks", "gate_stage", "threshold",
        "recommended_threshold", "max_sources", "git_commit", "golden_name", "golden_hash", "queries", "leaks",
        "destroyed", "settings", "summary",
    ]
    assert columns("eval_results") == [
        "run_id", "query_id", "item_id", "kind", "wording", "query", "groups", "stage", "rank", "min_distance",
        "destroyed", "leak", "gate",
    ]
    conn.close()


def test_deleting_a_run_deletes_its_results(built: Any, golden: evaluate.Golden, settings: Settings) -> None:
    run_id = evaluate.save_run(built, run(built, golden, settings))
    built.execute("DELETE FROM eval_runs WHERE id = ?", (run_id,))
    assert built.execute("SELECT count(*) FROM eval_results").fetchone()[0] == 0


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
    assert [r["strategy"] for r in result["rows"]] == ["A", "C", "E"]
    assert list(work.iterdir()) == []  # temporary databases are gone
    for row in result["rows"]:
        assert row["chunks"] >= 2 and row["embedded_tokens"] > 0 and row["leaks"] == 0
        ranks = list(result["ranks"][row["strategy"]].values())
        assert row["recall@4"]["value"] == round(recall_at_k(ranks, 4), 4)
    assert [(t["a"], t["b"], t["k"]) for t in result["sign_tests"]] == [("E", "A", 1), ("E", "A", 4),
                                                                         ("E", "C", 1), ("E", "C", 4)]
    for t in result["sign_tests"]:
        e, other = result["ranks"][t["a"]], result["ranks"][t["b"]]
        ids = sorted(e)
        assert (t["wins"], t["losses"]) == paired_counts([other[q] for q in ids], [e[q] for q in ids], t["k"])
    assert "E vs A at R@4" in evaluate.format_strategies(result)
    with pytest.raises(RagError, match="unknown strategy"):
        evaluate.run_strategies(corpus, golden, settings=settings, embedder=FakeEmbedder(), strategies=["Z"],
                                search_fn=DenseSearch())


# ---------------------------------------------------------------------------------------------
# CLI


@pytest.fixture
def cli_env(built: Any, golden: evaluate.Golden, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import rag.embedding

    monkeypatch.setattr(evaluate, "default_search", lambda: ScriptedSearch(SCRIPT))
    monkeypatch.setattr(rag.embedding, "load_embedder", lambda spec="minilm", threads=0: FakeEmbedder())
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


def test_cli_eval_needs_an_existing_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rag.cli import main

    golden = tmp_path / "g.json"
    golden.write_text(json.dumps(GOLDEN), encoding="utf-8")
    assert main(["eval", "--db", str(tmp_path / "missing.db"), "--golden", str(golden)]) == 1
    assert "no database" in capsys.readouterr().err
    assert not (tmp_path / "missing.db").exists()


def test_shared_handbook_golden_set_loads() -> None:
    from .conftest import shared_eval_or_skip

    golden = evaluate.load_golden(shared_eval_or_skip() / "golden_handbook.json")
    queries = expand_queries(golden.items)
    assert len(golden.items) == 45 and len(queries) == 90
    assert sum(q.kind == "answerable" for q in queries) == 56
    assert len(golden.sha256) == 64
