"""The learned order (rag.ranker, rag.evaluate_ranker, `rag eval ranker`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from rag import evaluate_ranker, retrieval, store
from rag.config import Settings
from rag.errors import RagError
from rag.evaluate_ranker import OrderCheck, RankedQuery, first_relevant
from rag.ranker import FEATURES, RankModel, fit_rank_model, learned_order, load_rank_model, rank_features
from rag.records import Hit

from .fakes import FakeEmbedder
from .test_retrieval import CORPUS, corpus, write_corpus  # noqa: F401  (the fixture)


@pytest.fixture
def db_path(backend_db: Path | str) -> Path | str:
    return backend_db


def _hit(cid: int, *, fused: float, distance: float, dense: int | None, sparse: int | None, bm25: float | None,
         content: str = "x") -> Hit:
    return Hit(chunk_id=cid, document_id=1, source="a.md", title="A", section="S", content=content, char_from=0,
               char_to=len(content), page=None, distance=distance, dense_rank=dense, sparse_rank=sparse,
               fts_score=bm25, rrf_score=fused)


HITS = [
    _hit(1, fused=0.9, distance=0.2, dense=1, sparse=None, bm25=None, content="abc"),
    _hit(2, fused=0.5, distance=0.4, dense=3, sparse=1, bm25=-8.0, content="a" * 99),
    _hit(3, fused=0.1, distance=0.3, dense=None, sparse=2, bm25=-2.0, content=""),
]


def test_rank_features_by_hand() -> None:
    x = rank_features(HITS, [0.5, 1.0, 0.0], [0.0, 0.25, 1.0])
    assert x.shape == (3, len(FEATURES))
    expected = [
        # fused, similarity, bm25, dense_rr, sparse_rr, coverage, heading, log_length, position_rr
        [1.0, 1.0, 0.0, 1.0, 0.0, 0.5, 0.0, math.log(4), 1.0],
        [0.5, 0.0, 1.0, 1 / 3, 1.0, 1.0, 0.25, math.log(100), 0.5],
        [0.0, 0.5, 0.25, 0.0, 0.5, 0.0, 1.0, 0.0, 1 / 3],
    ]
    np.testing.assert_allclose(x, expected)
    one = rank_features(HITS[:1], [0.0], [0.0])  # a list of one: the normalised scores are 1
    assert one[0][0] == 1.0 and one[0][1] == 1.0 and one[0][2] == 0.0
    assert rank_features([], [], []).shape == (0, len(FEATURES))
    with pytest.raises(ValueError, match="coverages"):
        rank_features(HITS, [0.0], [0.0, 0.0, 0.0])


def _model(**weights: float) -> RankModel:
    return RankModel(tuple(weights.get(name, 0.0) for name in FEATURES), 0.0)


def test_learned_order_sorts_by_probability_and_keeps_ties_in_fused_order() -> None:
    x = rank_features(HITS, [0.5, 1.0, 0.0], [0.0, 0.25, 1.0])
    by_heading = learned_order(HITS, x, _model(heading_coverage=5.0))
    assert [h.chunk_id for h in by_heading] == [3, 2, 1]
    assert by_heading[0].rank_score == pytest.approx(1 / (1 + math.exp(-5.0)))
    assert [h.chunk_id for h in learned_order(HITS, x, _model())] == [1, 2, 3]  # all 0.5: the fused order
    assert learned_order([], np.zeros((0, len(FEATURES))), _model()) == []
    with pytest.raises(ValueError, match="feature rows"):
        learned_order(HITS, x[:2], _model())


def test_rank_model_json_round_trip_and_bad_files(tmp_path: Path) -> None:
    model = RankModel(tuple(float(i) for i in range(len(FEATURES))), -1.5, 12, ("a", "b"))
    assert RankModel.from_json(model.to_json()) == model
    raw = json.loads(model.to_json())
    for broken, message in [
        ({**raw, "features": ["fused"]}, "not this version's"),
        ({**raw, "weights": [1.0]}, "needs 9 weights"),
        ({**raw, "weights": [float("nan")] * len(FEATURES)}, "finite"),
        ({**raw, "depth": 0}, "depth"),
        ({k: v for k, v in raw.items() if k != "intercept"}, "intercept"),
    ]:
        with pytest.raises(RagError, match=message):
            RankModel.from_json(json.dumps(broken))
    with pytest.raises(RagError, match="not a rank model"):
        RankModel.from_json("[1, 2]")
    path = tmp_path / "m.json"
    path.write_text(model.to_json(), encoding="utf-8")
    assert load_rank_model(str(path)) == model
    assert load_rank_model("off") is None
    with pytest.raises(RagError, match="cannot read the rank model"):
        load_rank_model(str(tmp_path / "missing.json"))


def test_the_bundled_model_is_fitted_on_the_visible_sets_only() -> None:
    bundled = load_rank_model("bundled")
    assert bundled is not None and bundled == load_rank_model("")
    assert bundled.fitted_on == ("golden_guide", "golden_handbook", "golden_vi")  # never eval/'s held-out sets
    assert bundled.depth == 30
    weights = dict(zip(FEATURES, bundled.weights, strict=True))
    assert weights["fused"] > 0 and weights["coverage"] > 0 and weights["dense_rr"] > 0


def test_fit_finds_the_signal_that_separates_relevant_hits() -> None:
    rng = np.random.default_rng(7)
    x = rng.random((400, len(FEATURES)))
    coverage = FEATURES.index("coverage")
    y = (x[:, coverage] > 0.6).astype(int)
    model = fit_rank_model(x, y, depth=20, fitted_on=["s"])
    assert model.depth == 20 and model.fitted_on == ("s",)
    assert int(np.argmax(np.abs(model.weights))) == coverage and model.weights[coverage] > 0
    with pytest.raises(RagError, match="no listed hit was relevant"):
        fit_rank_model(x, np.zeros(400, dtype=int), depth=20)


def test_hybrid_search_applies_the_configured_model_within_its_depth(
    corpus: store.Connection, settings: Settings, fake_embedder: FakeEmbedder, tmp_path: Path  # noqa: F811
) -> None:
    query = "paid vacation leave signing"
    fused = retrieval.search(corpus, query, embedder=fake_embedder, settings=settings.replace(rank_model="off"), k=6)
    assert len(fused) == 6 and all(h.rank_score is None for h in fused)
    assert [h.rrf_score for h in fused] == sorted((h.rrf_score for h in fused), reverse=True)
    # a model that reads only the headings, over the first 4 fused hits
    path = tmp_path / "heading.json"
    path.write_text(RankModel(_model(heading_coverage=6.0, position_rr=-1.0).weights, 0.0, 4).to_json(),
                    encoding="utf-8")
    learned = retrieval.search(corpus, query, embedder=fake_embedder, settings=settings.replace(rank_model=str(path)),
                               k=6)
    features = retrieval.rank_features(corpus, query, fused[:4])
    scores = RankModel.from_json(path.read_text(encoding="utf-8")).scores(features)
    expected = [fused[i].chunk_id for i in sorted(range(4), key=lambda i: -scores[i])]
    assert [h.chunk_id for h in learned[:4]] == expected
    assert [h.chunk_id for h in learned[4:]] == [h.chunk_id for h in fused[4:]]  # past the depth: fused order
    assert [h.rank_score for h in learned[:4]] == pytest.approx(sorted(scores, reverse=True))
    assert expected != [h.chunk_id for h in fused[:4]]  # the model did move something
    for stage in ("dense", "fts"):  # the learned order is hybrid's
        hits = retrieval.search(corpus, query, embedder=fake_embedder, settings=settings, stage=stage, k=6)
        assert all(h.rank_score is None for h in hits)


def test_first_relevant_and_the_order_check_by_hand() -> None:
    assert first_relevant([0, 0, 1, 1]) == 3
    assert first_relevant([0, 1, 1], order=[2, 0, 1]) == 1
    assert first_relevant([0, 0]) is None
    check = OrderCheck("s", ("t",), fused=(1, 5, None, 3, 2), learned=(1, 2, None, 7, 1))
    assert check.recall(4, False) == pytest.approx(0.6) == check.recall(4, True)
    assert check.recall(1, False) == pytest.approx(0.2) and check.recall(1, True) == pytest.approx(0.4)
    assert check.mrr(False) == pytest.approx((1 + 1 / 5 + 1 / 3 + 1 / 2) / 5)
    up, down, p = check.sign(4)
    assert (up, down) == (1, 1) and p == 1.0
    up, down, _ = check.sign(None)
    assert (up, down) == (2, 1)


def test_check_reorders_each_query_with_the_model() -> None:
    features = np.array([[0.0] * len(FEATURES), [1.0] * len(FEATURES)])
    rows = [RankedQuery("q1", features, (0, 1)), RankedQuery("q2", np.zeros((0, len(FEATURES))), ())]
    result = evaluate_ranker.check("s", rows, _model(fused=3.0))
    assert result.fused == (2, None) and result.learned == (1, None)
    with pytest.raises(RagError, match="at least two"):
        evaluate_ranker.leave_one_corpus_out({"s": rows}, 30)


GOLDEN = [
    {"id": "R1", "kind": "answerable", "question": "How do I sign my commits?", "paraphrases": ["gpg for git"],
     "groups": ["all"], "evidence": [{"source": "handbook/git.md", "quote": "Sign every commit with a gpg key."}]},
    {"id": "R2", "kind": "answerable", "question": "What does sick leave cover?",
     "paraphrases": ["ill, can I stay home"], "groups": ["all"],
     "evidence": [{"source": "handbook/leave.md", "quote": "Sick leave covers illness"}]},
    {"id": "R3", "kind": "answerable", "question": "How do I earn paid vacation?", "paraphrases": [],
     "groups": ["all"], "evidence": [{"source": "handbook/leave.md", "quote": "earn paid vacation days"}]},
    {"id": "R4", "kind": "unanswerable", "question": "What is the office wifi password?", "paraphrases": [],
     "groups": ["all"], "evidence": []},
]


def test_cli_eval_ranker_fits_checks_and_refuses_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import rag.registry
    from rag.cli import main

    monkeypatch.setattr(rag.registry, "load_embedder", lambda spec="minilm", threads=0: FakeEmbedder())
    monkeypatch.setenv("RAG_TRANSLATE_QUESTIONS", "0")
    docs = write_corpus(tmp_path / "docs", CORPUS)
    sets = []
    for name in ("first", "second"):
        db = tmp_path / f"{name}.db"
        assert main(["ingest", str(docs), "--db", str(db)]) == 0
        golden = tmp_path / f"golden_{name}.json"
        golden.write_text(json.dumps(GOLDEN), encoding="utf-8")
        sets += ["--set", str(db), str(golden)]
    capsys.readouterr()
    out = tmp_path / "model.json"
    assert main(["eval", "ranker", *sets, "--depth", "5", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "golden_first" in text and "golden_second" in text and "fitted on golden_first, golden_second" in text
    model = RankModel.from_json(out.read_text(encoding="utf-8"))
    assert model.depth == 5 and model.fitted_on == ("golden_first", "golden_second")

    monkeypatch.setenv("RAG_RANK_MODEL", str(out))
    assert main(["eval", "ranker", *sets[:3], "--check"]) == 0
    assert "golden_first" in capsys.readouterr().out

    assert main(["eval", "ranker", *sets[:3]]) == 1
    assert "at least two golden sets" in capsys.readouterr().err
    assert main(["eval", "ranker", *sets, "--depth", "0"]) == 1
    assert "--depth must be at least 1" in capsys.readouterr().err
    assert main(["eval", "ranker", "--set", str(tmp_path / "none.db"), sets[2]]) == 1
    assert "no database" in capsys.readouterr().err
    assert main(["eval", "ranker", *sets[:3], *sets[:3]]) == 1
    assert "two golden sets are named" in capsys.readouterr().err
