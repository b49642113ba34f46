from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from rank_bm25 import BM25Okapi

from rag import retrieval, store
from rag.config import Settings, load_settings
from rag.errors import IndexMismatchError, NotFoundError, QueryError
from rag.ingest import ingest
from rag.records import Chunk, Hit
from rag.retrieval import (
    RRF_K,
    STAGES,
    audit_channels,
    build_fts_query,
    chunk_fields,
    dense_sql,
    fields_in,
    fuse_convex,
    fuse_rrf,
    order_fused,
    search,
    search_fts,
    search_vectors,
)
from rag.text import fold

from .conftest import SQLITE_ONLY
from .fakes import FakeEmbedder


@pytest.fixture
def db_path(backend_db: Path | str) -> Path | str:
    """Every test here runs on SQLite and on PostgreSQL (tests/conftest.py), but the SQLITE_ONLY ones."""
    return backend_db


@pytest.fixture
def settings(db_path: Path | str) -> Settings:
    """The fused order, as fusion leaves it: these tests pin the branches and their fusion. The learned
    order over it (rank_model) has its own tests in test_ranker.py, on this module's corpus."""
    return load_settings(db_path=db_path, rank_model="off")

CORPUS = {
    "handbook/leave.md": (
        "---\ntitle: Leave\n---\n## Annual leave\n\nEmployees earn paid vacation days every pay period.\n\n"
        "## Sick leave\n\nSick leave covers illness and medical appointments.\n"
    ),
    "handbook/vpn.md": (
        "---\ntitle: Hướng dẫn VPN\n---\n## Lỗi thường gặp\n\nlỗi VPN-403 xử lý sao: khởi động lại ứng dụng "
        "rồi đăng nhập lại.\n\n## Cài đặt\n\nCài ứng dụng VPN từ cổng nội bộ, đăng nhập bằng tài khoản công ty.\n"
    ),
    "handbook/benefits.md": (
        "---\ntitle: Phúc lợi\n---\n## Lợi ích\n\nQuyền lợi bảo hiểm và đường dây hỗ trợ nhân viên.\n"
    ),
    "handbook/git.md": "---\ntitle: Git\n---\n## Signing\n\nSign every commit with a gpg key.\n",
    "hr/salary.md": (
        "---\ntitle: Salary\ngroups: [hr]\n---\n## Pay cap\n\nThe salary band cap for paid vacation payouts is "
        "191,900 dollars.\n"
    ),
    "hr/parental.md": (
        "---\ntitle: Parental leave\ngroups: [hr]\n---\n## Agreement\n\nPaid parental leave needs a twelve week "
        "return to work agreement; vacation days are separate.\n"
    ),
}
FORBIDDEN = ("hr/salary.md", "hr/parental.md")


def write_corpus(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


@pytest.fixture
def corpus(conn: store.Connection, settings: Settings, fake_embedder: FakeEmbedder, tmp_path: Path) -> store.Connection:
    report = ingest(conn, [write_corpus(tmp_path / "docs", CORPUS)], settings=settings, embedder=fake_embedder)
    assert not report.failed
    return conn


class ReverseReranker:
    """Scores by position, reversed: proves the rerank stage reorders and keeps the rest."""

    name = "reverse"

    def __init__(self) -> None:
        self.seen: list[int] = []

    def rank(self, query: str, hits: Sequence[Hit]) -> list[Hit]:
        self.seen = [h.chunk_id for h in hits]
        return [dataclasses.replace(h, rerank_score=float(i)) for i, h in reversed(list(enumerate(hits)))]


# ---------------------------------------------------------------------------------------------
# RRF arithmetic


def test_fuse_rrf_by_hand() -> None:
    scores = fuse_rrf([[1, 2, 3], [3, 1, 4]])
    assert scores[1] == pytest.approx(1 / 61 + 1 / 62)  # 0.0325224...
    assert scores[1] == pytest.approx(0.03252247488101534)
    assert scores[2] == pytest.approx(1 / 62)
    assert scores[3] == pytest.approx(1 / 63 + 1 / 61)  # 0.0322659...
    assert scores[3] == pytest.approx(0.03226647357650856)
    assert scores[4] == pytest.approx(1 / 63)
    assert order_fused(scores, [[1, 2, 3], [3, 1, 4]]) == [1, 3, 2, 4]
    assert RRF_K == 60


def test_fuse_rrf_other_k_and_empty() -> None:
    assert fuse_rrf([[7]], k=0) == {7: 1.0}
    assert fuse_rrf([[7, 8], []], k=1) == {7: 0.5, 8: pytest.approx(1 / 3)}
    assert fuse_rrf([]) == {}
    with pytest.raises(ValueError):
        fuse_rrf([[1]], k=-1)


def test_weighted_rrf_by_hand() -> None:
    scores = fuse_rrf([[1, 2], [2, 3]], weights=[0.4, 1.6])
    assert scores[1] == pytest.approx(0.4 / 61)
    assert scores[2] == pytest.approx(0.4 / 62 + 1.6 / 61)
    assert scores[3] == pytest.approx(1.6 / 62)
    assert fuse_rrf([[1, 2], [2, 3]], weights=[1.0, 1.0]) == fuse_rrf([[1, 2], [2, 3]])
    with pytest.raises(ValueError):
        fuse_rrf([[1]], weights=[1.0, 1.0])


def test_fuse_convex_by_hand() -> None:
    similarity = {1: 0.9, 2: 0.5, 3: 0.7}
    bm25 = {3: -8.0, 2: -2.0}  # FTS5: lower is better
    scores = fuse_convex(similarity, bm25, 0.7)
    assert scores[1] == pytest.approx(0.7 * 1.0 + 0.3 * 0.0)  # dense best, no keyword match
    assert scores[2] == pytest.approx(0.7 * 0.0 + 0.3 * 0.25)  # dense worst: min-max puts it at 0
    assert scores[3] == pytest.approx(0.7 * 0.5 + 0.3 * 1.0)
    assert fuse_convex(similarity, bm25, 1.0)[1] == pytest.approx(1.0)
    assert fuse_convex(similarity, bm25, 0.0) == {1: 0.0, 2: pytest.approx(0.25), 3: pytest.approx(1.0)}
    assert fuse_convex({}, {}, 0.5) == {}
    assert fuse_convex({4: 0.3, 5: 0.3}, {}, 0.5) == {4: 0.0, 5: 0.0}  # no spread, no evidence
    with pytest.raises(ValueError):
        fuse_convex(similarity, bm25, 1.5)


def test_convex_fusion_keeps_a_branch_s_clear_first() -> None:
    """python_docs PD22: first in the dense branch, absent from the keyword one, RRF ranked it 10th
    under chunks both branches put near rank 20; the scores say it is far nearer than they are."""
    dense = list(range(1, 31))  # chunk 1 first; 2..30 shared with the keyword branch
    sparse = list(range(30, 1, -1))
    rrf = order_fused(fuse_rrf([dense, sparse]), [dense, sparse])
    assert rrf.index(1) > 3
    similarity = {cid: (0.85 if cid == 1 else 0.55 - 0.002 * cid) for cid in dense}
    bm25 = {cid: -5.0 - 0.01 * rank for rank, cid in enumerate(sparse)}  # a flat keyword branch
    convex = order_fused(fuse_convex(similarity, bm25, 0.7), [dense, sparse])
    assert convex[0] == 1


def test_branch_weights_by_question_and_passage_language() -> None:
    weights = {"toneless_dense_share": 0.2, "cross_language_dense_share": 0.8}
    assert retrieval.branch_weights("en", "en", **weights) == (1.0, 1.0)
    assert retrieval.branch_weights("vi", "vi", **weights) == (1.0, 1.0)
    assert retrieval.branch_weights("vi-toneless", "vi", **weights) == pytest.approx((0.4, 1.6))
    # toneless keeps its own share whatever the passages: the embedder that cannot read it picked them
    assert retrieval.branch_weights("vi-toneless", "en", **weights) == pytest.approx((0.4, 1.6))
    assert retrieval.branch_weights("en", "vi", **weights) == pytest.approx((1.6, 0.4))
    assert retrieval.branch_weights("vi", "en", **weights) == pytest.approx((1.6, 0.4))
    plain = {"toneless_dense_share": 0.5, "cross_language_dense_share": 0.5}
    for asked, landed in [("en", "vi"), ("vi-toneless", "vi"), ("vi", "en")]:
        assert retrieval.branch_weights(asked, landed, **plain) == (1.0, 1.0)
    # the convex fusion's share for the plain case; the two languages' own rules are unchanged
    assert retrieval.dense_share("en", "en", **weights, plain_dense_share=0.7) == pytest.approx(0.7)
    assert retrieval.dense_share("vi-toneless", "vi", **weights, plain_dense_share=0.7) == pytest.approx(0.2)
    assert retrieval.dense_share("en", "vi", **weights, plain_dense_share=0.7) == pytest.approx(0.8)


def test_passage_language_needs_four_of_five() -> None:
    vi = "Chọn ô cần định dạng rồi bấm chuột phải."
    en = "Select the cells to format, then right-click."
    assert retrieval.passage_language([vi, vi, vi, vi, en]) == "vi"
    assert retrieval.passage_language([en, en, en, en, vi]) == "en"
    assert retrieval.passage_language([vi, vi, vi, en, en]) == "mixed"
    assert retrieval.passage_language([]) == "mixed"
    assert retrieval.passage_language([en * 40 + vi * 40]) == "en"  # only the first LANGUAGE_CHARS are read
    weights = {"toneless_dense_share": 0.2, "cross_language_dense_share": 0.8}
    assert retrieval.branch_weights("en", "mixed", **weights) == (1.0, 1.0)
    assert retrieval.branch_weights("vi", "mixed", **weights) == (1.0, 1.0)


VI_HELP = {
    f"help/{i}.md": f"---\ntitle: Trợ giúp {i}\n---\n## Mục {i}\n\n{body}\n"
    for i, body in enumerate([
        "Khi gặp lỗi VPN-403, hãy khởi động lại ứng dụng rồi đăng nhập lại.",
        "Bảng tính lưu tệp theo định dạng mặc định của chương trình.",
        "Chèn hình ảnh vào văn bản bằng trình đơn Chèn.",
        "Đặt mật khẩu cho tài liệu trong hộp thoại Lưu.",
        "Đổi phông chữ của đoạn văn trong thanh định dạng.",
    ])
}


def test_an_english_question_over_vietnamese_passages_follows_the_vectors(
    conn: store.Connection, settings: Settings, fake_embedder: FakeEmbedder, tmp_path: Path
) -> None:
    ingest(conn, [write_corpus(tmp_path / "docs", VI_HELP)], settings=settings, embedder=fake_embedder)
    question = "What should I do about error VPN-403?"  # English: only "vpn-403" can match the keywords
    convex = search(conn, question, embedder=fake_embedder, settings=settings)
    assert settings.fusion == "convex" and len(convex) == len(VI_HELP)  # every chunk is a candidate
    similarity = {h.chunk_id: 1.0 - h.distance for h in convex}  # no windows: the chunks are short
    low, high = min(similarity.values()), max(similarity.values())
    top = max(-h.fts_score for h in convex if h.fts_score is not None)
    for h in convex:  # the cross-language share, 0.8 dense, as in RRF
        keyword = -h.fts_score / top if h.fts_score is not None else 0.0
        assert h.rrf_score == pytest.approx(0.8 * (similarity[h.chunk_id] - low) / (high - low) + 0.2 * keyword)
    settings = settings.replace(fusion="rrf")  # the weights checked by hand below are RRF's
    led = search(conn, question, embedder=fake_embedder, settings=settings)
    plain = search(conn, question, embedder=fake_embedder, settings=settings.replace(cross_language_dense_share=0.5))
    assert any(h.sparse_rank for h in led) and any(h.dense_rank and not h.sparse_rank for h in led)
    for hits, (dense_w, sparse_w) in ((led, (1.6, 0.4)), (plain, (1.0, 1.0))):
        for h in hits:
            expected = (dense_w / (60 + h.dense_rank) if h.dense_rank else 0) + (
                sparse_w / (60 + h.sparse_rank) if h.sparse_rank else 0)
            assert h.rrf_score == pytest.approx(expected)
    # the same question in Vietnamese over the same passages: plain RRF
    same = search(conn, "Gặp lỗi VPN-403 thì phải làm gì?", embedder=fake_embedder, settings=settings)
    for h in same:
        assert h.rrf_score == pytest.approx((1 / (60 + h.dense_rank) if h.dense_rank else 0) + (
            1 / (60 + h.sparse_rank) if h.sparse_rank else 0))


class TableTranslator:
    """A ``rag.translate.Translator`` from a table; records what it was asked."""

    def __init__(self, table: dict[str, str]) -> None:
        self.table = table
        self.asked: list[tuple[str, str]] = []

    def translate(self, text: str, target: str) -> str | None:
        self.asked.append((text, target))
        return self.table.get(text)


def test_translation_target_by_hand() -> None:
    vi, en = "Chèn hình ảnh vào văn bản bằng trình đơn Chèn.", "Insert a picture with the Insert menu."
    assert retrieval.translation_target("en", [en, en, vi, en, en]) == "vi"  # one passage in the other language
    assert retrieval.translation_target("vi", [vi, en]) is None  # Vietnamese is searched as typed
    assert retrieval.translation_target("vi", [en, en]) is None
    assert retrieval.translation_target("en", [en, en]) is None
    assert retrieval.translation_target("vi", [vi, vi]) is None
    assert retrieval.translation_target("en", []) is None
    assert retrieval.translation_target("vi-toneless", [en, en]) is None


def _hit(cid: int, distance: float) -> Hit:
    return Hit(chunk_id=cid, document_id=1, source="a.md", title="A", section="", content=f"chunk {cid}",
               char_from=0, char_to=1, page=None, distance=distance, dense_rank=cid)


def test_fuse_wordings_by_hand() -> None:
    first = [_hit(1, 0.4), _hit(2, 0.5), _hit(3, 0.6)]
    second = [_hit(3, 0.2), _hit(4, 0.3)]
    fused = retrieval.fuse_wordings(first, second, rrf_k=60)
    assert [h.chunk_id for h in fused] == [3, 1, 2, 4]  # 1/63 + 1/61; 1/61; 1/62 twice (same best rank: lower id)
    by_id = {h.chunk_id: h for h in fused}
    assert by_id[3].rrf_score == pytest.approx(1 / 63 + 1 / 61)
    assert by_id[1].rrf_score == pytest.approx(1 / 61) and by_id[2].rrf_score == by_id[4].rrf_score == 1 / 62
    assert by_id[3].distance == pytest.approx(0.6) and by_id[3].dense_rank == 3  # the first's record
    assert by_id[4].distance == pytest.approx(0.3)
    own = retrieval.fuse_wordings(first, second, rrf_k=60, distances={4: 0.9, 3: 0.1})
    assert [(h.chunk_id, h.distance) for h in own] == [(3, 0.6), (1, 0.4), (2, 0.5), (4, 0.9)]
    assert retrieval.fuse_wordings(first, []) == [dataclasses.replace(h, rrf_score=1 / (60 + i))
                                                   for i, h in enumerate(first, start=1)]


def test_an_english_question_over_vietnamese_passages_is_also_searched_translated(
    conn: store.Connection, settings: Settings, fake_embedder: FakeEmbedder, tmp_path: Path
) -> None:
    ingest(conn, [write_corpus(tmp_path / "docs", VI_HELP)], settings=settings, embedder=fake_embedder)
    question = "How do I insert a picture into a document?"  # no word in common with the help
    translation = "Chèn hình ảnh vào văn bản thế nào?"
    translator = TableTranslator({question: translation})
    plain = search(conn, question, embedder=fake_embedder, settings=settings, k=5)
    hits = search(conn, question, embedder=fake_embedder, settings=settings, k=5, translator=translator)
    assert translator.asked == [(question, "vi")]
    assert not any(h.sparse_rank for h in plain)  # as typed, the keywords find nothing
    expected = retrieval.fuse_wordings(
        search(conn, question, embedder=fake_embedder, settings=settings, k=50),
        search(conn, translation, embedder=fake_embedder, settings=settings, k=50), settings.rrf_k)[:5]
    assert [(h.chunk_id, h.rrf_score) for h in hits] == [(h.chunk_id, pytest.approx(h.rrf_score)) for h in expected]
    own = {h.chunk_id: h.distance for h in search(conn, question, embedder=fake_embedder, settings=settings,
                                                  stage="dense", k=50)}
    assert [h.distance for h in hits] == [pytest.approx(own[h.chunk_id]) for h in hits]  # the question's own
    assert hits[0].source.endswith("help/2.md") and plain[0].source != hits[0].source
    # the rerank stage reranks the fused hits; the fts stage has no dense branch to tell the language
    reranker = ReverseReranker()
    search(conn, question, embedder=fake_embedder, settings=settings, stage="rerank", k=2, reranker=reranker,
           translator=translator)
    assert reranker.seen[: len(hits)] == [h.chunk_id for h in hits]
    search(conn, question, embedder=fake_embedder, settings=settings, stage="fts", translator=translator)
    assert len(translator.asked) == 2


def test_a_question_is_searched_as_typed_when_nothing_is_crossed_or_translation_is_off(
    conn: store.Connection, settings: Settings, fake_embedder: FakeEmbedder, tmp_path: Path
) -> None:
    ingest(conn, [write_corpus(tmp_path / "docs", VI_HELP)], settings=settings, embedder=fake_embedder)
    question = "How do I insert a picture into a document?"
    plain = search(conn, question, embedder=fake_embedder, settings=settings)
    translator = TableTranslator({})  # translates nothing: the hits are the plain ones
    assert search(conn, question, embedder=fake_embedder, settings=settings, translator=translator) == plain
    assert translator.asked == [(question, "vi")]
    off = TableTranslator({question: "Chèn hình ảnh vào văn bản thế nào?"})
    assert search(conn, question, embedder=fake_embedder, settings=settings.replace(translate_questions=False),
                  translator=off) == plain
    for same_language in ("Chèn hình ảnh vào văn bản thế nào?", "chen hinh anh vao van ban the nao"):
        search(conn, same_language, embedder=fake_embedder, settings=settings, translator=off)
    assert off.asked == []


def test_a_toneless_question_follows_the_keyword_branch(
    corpus: store.Connection, settings: Settings, fake_embedder: FakeEmbedder
) -> None:
    question = "loi vpn 403 xu ly sao"
    settings = settings.replace(fusion="rrf")  # the weights checked by hand below are RRF's
    plain = search(corpus, question, embedder=fake_embedder, settings=settings.replace(toneless_dense_share=0.5))
    keyword_led = search(corpus, question, embedder=fake_embedder, settings=settings)
    only_fts = search(corpus, question, embedder=fake_embedder, settings=settings.replace(toneless_dense_share=0.0))
    ranks = [h.sparse_rank for h in only_fts]  # share 0: the keyword order, dense-only hits after it
    assert ranks[0] == 1 and [r for r in ranks if r] == sorted(r for r in ranks if r)
    assert all(r is None for r in ranks[len([r for r in ranks if r]):])
    fused = {h.chunk_id: h.rrf_score for h in keyword_led}
    for h in keyword_led:  # the weights are the ones branch_weights gives: 0.4 dense, 1.6 keywords
        expected = (0.4 / (60 + h.dense_rank) if h.dense_rank else 0) + (
            1.6 / (60 + h.sparse_rank) if h.sparse_rank else 0)
        assert fused[h.chunk_id] == pytest.approx(expected)
    assert {h.chunk_id for h in plain} == {h.chunk_id for h in keyword_led}


def test_seed_001_example_rank_12_jumps_to_2() -> None:
    """Seed 001: the only chunk with the exact code sits at dense rank 12 and sparse rank 1."""
    dense = [101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 999]
    sparse = [999, 101, 200]
    order = order_fused(fuse_rrf([dense, sparse]), [dense, sparse])
    assert order[:2] == [101, 999]


def test_order_fused_breaks_ties_by_best_rank_then_id() -> None:
    rankings = [[5, 9], [9, 5], [3]]
    scores = fuse_rrf(rankings)
    assert scores[5] == scores[9]
    assert order_fused(scores, rankings) == [5, 9, 3]
    assert order_fused({4: 0.1, 2: 0.1}, [[4], [2]]) == [2, 4]


# ---------------------------------------------------------------------------------------------
# search(): signals on every hit


@pytest.mark.parametrize("fusion", ["rrf", "convex"])
def test_hybrid_hits_carry_ranks_fused_score_and_cosine_distance(
    corpus: store.Connection, settings: Settings, fake_embedder: FakeEmbedder, fusion: str
) -> None:
    query = "paid vacation days"
    settings = settings.replace(fusion=fusion, window_weight=0.0)  # similarity = 1 - the chunk's distance
    dense = search(corpus, query, embedder=fake_embedder, settings=settings, stage="dense", k=50)
    sparse = search(corpus, query, embedder=fake_embedder, settings=settings, stage="fts", k=50)
    hybrid = search(corpus, query, embedder=fake_embedder, settings=settings, stage="hybrid", k=50)
    dense_rank = {h.chunk_id: i for i, h in enumerate(dense, 1)}
    sparse_rank = {h.chunk_id: i for i, h in enumerate(sparse, 1)}
    assert sparse and dense
    assert {h.chunk_id for h in hybrid} == set(dense_rank) | set(sparse_rank)
    vectors = {int(r["id"]): fake_embedder.embed_passages([r["text"]])[0] for r in store.chunk_rows(corpus)}
    q = fake_embedder.embed_queries([query])[0]
    similarity = [1.0 - h.distance for h in hybrid]
    top = max(-h.fts_score for h in hybrid if h.fts_score is not None)
    for hit in hybrid:
        assert hit.dense_rank == dense_rank.get(hit.chunk_id)
        assert hit.sparse_rank == sparse_rank.get(hit.chunk_id)
        if fusion == "rrf":
            expected = sum(1 / (RRF_K + r) for r in (hit.dense_rank, hit.sparse_rank) if r is not None)
        else:  # share 0.7 of the min-max similarity, 0.3 of the bm25 over the best one
            expected = (0.7 * (1.0 - hit.distance - min(similarity)) / (max(similarity) - min(similarity))
                        + 0.3 * (-hit.fts_score / top if hit.fts_score is not None else 0.0))
        assert hit.rrf_score == pytest.approx(expected)
        assert hit.distance == pytest.approx(1 - float(q @ vectors[hit.chunk_id]), abs=1e-5)
        assert (hit.fts_score is None) == (hit.sparse_rank is None)
    scores = [h.rrf_score for h in hybrid]
    assert scores == sorted(scores, reverse=True)


def test_fts_only_hit_distance_equals_the_dense_branch_distance(
    corpus: store.Connection, settings: Settings, fake_embedder: FakeEmbedder
) -> None:
    sparse = search(corpus, "gpg commit", embedder=fake_embedder, settings=settings, stage="fts")
    dense = {h.chunk_id: h.distance for h in search(corpus, "gpg commit", embedder=fake_embedder, settings=settings,
                                                    stage="dense", k=100)}
    assert sparse
    for hit in sparse:
        assert hit.dense_rank is None
        assert hit.distance == pytest.approx(dense[hit.chunk_id], abs=1e-6)


def test_stage_results_are_cut_to_k(corpus: store.Connection, settings: Settings, fake_embedder: FakeEmbedder) -> None:
    for stage in STAGES:
        assert len(search(corpus, "leave vacation", embedder=fake_embedder, settings=settings, stage=stage, k=2)) == 2
    assert len(search(corpus, "leave vacation", embedder=fake_embedder, settings=settings.replace(top_k=3))) == 3


# ---------------------------------------------------------------------------------------------
# Permissions


@pytest.mark.parametrize("mode", ["exact", "binary", "hamming"])
@pytest.mark.parametrize("stage", STAGES)
def test_forbidden_documents_never_appear(
    corpus: store.Connection, settings: Settings, fake_embedder: FakeEmbedder, stage: str, mode: str
) -> None:
    tuned = settings.replace(dense_mode=mode)
    for query in ("salary band cap for paid vacation payouts", "parental leave return to work agreement"):
        hits = search(corpus, query, embedder=fake_embedder, settings=tuned, stage=stage, k=50,
                      reranker=ReverseReranker())
        assert hits
        assert not {h.source for h in hits} & set(FORBIDDEN)
        # The same search for a reader holding the group does find them.
        allowed = search(corpus, query, embedder=fake_embedder, settings=tuned, stage=stage, k=50, groups=["hr"],
                         reranker=ReverseReranker())
        assert {h.source for h in allowed} & set(FORBIDDEN)


ACCESS_CONDITIONS = {
    "DENSE_EXACT_SQL": "AND acl IN (SELECT value FROM json_each(:access_keys))",
    "DENSE_BINARY_SQL": "AND acl IN (SELECT value FROM json_each(:access_keys))",
    "HAMMING_CODES_SQL": "AND acl IN (SELECT value FROM json_each(:access_keys))",
    "HAMMING_RESCORE_SQL": "AND acl IN (SELECT value FROM json_each(:access_keys))",
    "FTS_SQL": "AND k.access_key IN (SELECT value FROM json_each(:access_keys))",
    "HIT_ROWS_SQL": "AND k.access_key IN (SELECT value FROM json_each(:access_keys))",
}


@SQLITE_ONLY  # PostgreSQL's counterpart: tests/test_pg.py (row-level security with the filter removed)
@pytest.mark.parametrize("stage", ["dense", "fts", "hybrid"])
def test_the_leak_check_can_fail_without_the_filter(
    corpus: store.Connection, settings: Settings, fake_embedder: FakeEmbedder, monkeypatch: pytest.MonkeyPatch,
    stage: str,
) -> None:
    """Companion to the test above: with the access condition removed from the SQL, the same
    search as an "all" reader returns the restricted documents, so that test is able to fail."""
    for name, condition in ACCESS_CONDITIONS.items():
        sql = getattr(retrieval, name)
        assert condition in sql, f"{name} no longer carries the access condition this test removes"
        monkeypatch.setattr(retrieval, name, sql.replace(condition, ""))
    hits = search(corpus, "salary band cap for paid vacation payouts", embedder=fake_embedder, settings=settings,
                  stage=stage, k=50)
    assert {h.source for h in hits} & set(FORBIDDEN)


@pytest.mark.parametrize("mode", ["exact", "binary", "hamming"])
@pytest.mark.parametrize("stage", ["dense", "fts", "hybrid"])
def test_reader_who_sees_few_chunks_still_gets_k(
    conn: store.Connection, settings: Settings, fake_embedder: FakeEmbedder, tmp_path: Path, stage: str, mode: str
) -> None:
    files = {f"eng/{i:03}.md": f"---\ngroups: [eng]\n---\nVPN client install guide step {i}.\n" for i in range(150)}
    files |= {f"pub/{i}.md": f"Public note {i}: the VPN client install guide lives on the portal.\n" for i in range(4)}
    ingest(conn, [write_corpus(tmp_path / "many", files)], settings=settings, embedder=fake_embedder)
    tuned = settings.replace(dense_mode=mode, candidates=4, binary_oversample=2)
    query = "VPN client install guide step"
    for_eng = search(conn, query, embedder=fake_embedder, settings=tuned, stage=stage, k=4, groups=["eng"])
    assert all(h.source.startswith("eng/") for h in for_eng)  # so filtering a global top 4 would leave nothing
    hits = search(conn, query, embedder=fake_embedder, settings=tuned, stage=stage, k=4)
    assert sorted(h.source for h in hits) == [f"pub/{i}.md" for i in range(4)]


# ---------------------------------------------------------------------------------------------
# FTS branch


INJECTIONS = ['"', "*", "NEAR(", "OR", "AND", "NOT", "^", "-", "(", ")", ":", '")', "fts_body:", "NEAR(a b, 2)", "''"]


@pytest.mark.parametrize("injection", INJECTIONS)
def test_fts_syntax_in_a_question_neither_raises_nor_changes_results(
    corpus: store.Connection, settings: Settings, fake_embedder: FakeEmbedder, injection: str
) -> None:
    plain = search(corpus, "vacation days", embedder=fake_embedder, settings=settings, stage="fts")
    assert plain
    for text in (f"vacation {injection} days", f"{injection} vacation days", f"vacation days {injection}"):
        hits = search(corpus, text, embedder=fake_embedder, settings=settings, stage="fts")
        if re.search(r"[^\W_]", injection):  # a word such as NEAR or fts_body becomes one more quoted keyword
            assert {h.chunk_id for h in plain} <= {h.chunk_id for h in hits}
        else:
            assert [h.chunk_id for h in hits] == [h.chunk_id for h in plain]


@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.sampled_from(list('abđệ0-.:*^"()_ NEAROTD\'')), max_size=30) | st.text(max_size=30))
def test_any_text_gives_a_valid_fts_query(corpus: store.Connection, settings: Settings, text: str) -> None:
    coll = store.require_collection(corpus, settings.collection)
    # Never an SQLite error: either no keyword (nothing to run) or a query FTS5 accepts.
    search_fts(corpus, build_fts_query(text), collection_id=coll.id, access_keys=[1, 2, 3], k=5)


def test_every_keyword_form_is_searchable(
    corpus: store.Connection, settings: Settings, fake_embedder: FakeEmbedder
) -> None:
    hits = search(corpus, "VPN-403", embedder=fake_embedder, settings=settings, stage="fts")
    assert [h.source for h in hits] == ["handbook/vpn.md"]
    assert "VPN-403" in hits[0].content
    assert search(corpus, "191,900", embedder=fake_embedder, settings=settings, stage="fts", groups=["hr"])


def test_toneless_question_finds_toned_text(
    corpus: store.Connection, settings: Settings, fake_embedder: FakeEmbedder
) -> None:
    for stage in ("fts", "hybrid"):
        hits = search(corpus, "loi VPN-403 xu ly sao", embedder=fake_embedder, settings=settings, stage=stage)
        assert "lỗi VPN-403 xử lý sao" in hits[0].content
    # đ is folded too (unicode61 alone never maps it to d).
    hits = search(corpus, "duong day ho tro", embedder=fake_embedder, settings=settings, stage="fts")
    assert "đường dây hỗ trợ" in hits[0].content


def _bm25_corpus(conn: store.Connection, texts: list[str], embedder: FakeEmbedder) -> list[int]:
    """Store one chunk per text with an empty heading column, so FTS5 sees exactly the body tokens."""
    coll = store.create_collection(conn, "bm25", embedder.model_id, embedder.dimension)
    ids = []
    for i, text in enumerate(texts):
        chunk = Chunk(0, "", text, text, 0, len(text))
        version = store.DocumentVersion(
            source=f"d{i}.txt", path=f"/d{i}.txt", title="", groups=["all"], content_hash=str(i), bytes_hash=str(i),
            canonical_text=text, extractor="text", extractor_version="1", embedder=embedder.model_id,
            dimension=embedder.dimension, pipeline_version="test",
        )
        vector = embedder.embed_passages([text])[0]
        doc_id = store.replace_document(conn, coll, version, [store.StoredChunk(chunk, vector, "", fold(text))])
        ids.append(int(conn.execute("SELECT id FROM chunks WHERE document_id = ?", (doc_id,)).fetchone()[0]))
    return ids


BM25_TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "a fox and another fox met a badger by the old oak",
    "badger setts are dug deep in woodland",
    "woodland birds sing at dawn near the river",
    "the river otter hunts fish at dawn",
    "otter and badger and fox share the woodland in winter",
    "fish swim upstream in the cold river water every spring",
    "cold water fish include trout and salmon",
]


@pytest.mark.parametrize("query", ["fox badger", "otter", "trout salmon", "cold river fish", "oak winter dawn"])
def test_fts_order_and_scores_match_rank_bm25(
    conn: store.Connection, fake_embedder: FakeEmbedder, query: str
) -> None:
    """FTS5 bm25() is Okapi BM25 with k1 = 1.2, b = 0.75 and idf = ln((N - n + 0.5) / (n + 0.5)).

    Every query term is rare (in fewer than half of the documents), where rank_bm25's idf floor
    does not apply, so scores agree and not only the order.
    """
    ids = _bm25_corpus(conn, BM25_TEXTS, fake_embedder)
    tokenised = [re.findall(r"[^\W_]+", fold(t)) for t in BM25_TEXTS]
    terms = [t for t in re.findall(r"[^\W_]+", build_fts_query(query)) if t != "OR"]
    for term in terms:
        assert sum(term in doc for doc in tokenised) < len(BM25_TEXTS) / 2
    reference = BM25Okapi(tokenised, k1=1.2, b=0.75).get_scores(terms)
    expected = sorted((i for i in range(len(ids)) if reference[i] > 0), key=lambda i: (-reference[i], ids[i]))
    coll = store.require_collection(conn, "bm25")
    found = search_fts(conn, build_fts_query(query), collection_id=coll.id, access_keys=[1], k=10, weights=(3.0, 1.0))
    assert [cid for cid, _ in found] == [ids[i] for i in expected]
    assert [-score for _, score in found] == pytest.approx([reference[i] for i in expected], rel=1e-6)


def test_heading_column_weighs_more_than_body(conn: store.Connection, fake_embedder: FakeEmbedder) -> None:
    coll = store.create_collection(conn, "w", fake_embedder.model_id, fake_embedder.dimension)
    rows = []
    pairs = [("Overtime", "Rules for extra hours."), ("Travel", "Overtime while travelling.")]
    for i, (heading, body) in enumerate(pairs):
        chunk = Chunk(0, heading, body, f"{heading}\n\n{body}", 0, len(body))
        version = store.DocumentVersion(
            source=f"{i}.md", path=f"/{i}.md", title=heading, groups=["all"], content_hash=str(i), bytes_hash=str(i),
            canonical_text=body, extractor="text", extractor_version="1", embedder=fake_embedder.model_id,
            dimension=fake_embedder.dimension, pipeline_version="test",
        )
        stored = store.StoredChunk(chunk, fake_embedder.embed_passages([chunk.text])[0], fold(heading), fold(body))
        rows.append(store.replace_document(conn, coll, version, [stored]))
    heavy = search_fts(conn, '"overtime"', collection_id=coll.id, access_keys=[1], k=5, weights=(3.0, 1.0))
    light = search_fts(conn, '"overtime"', collection_id=coll.id, access_keys=[1], k=5, weights=(0.1, 1.0))
    assert [cid for cid, _ in heavy] != [cid for cid, _ in light]
    assert heavy[0][0] == rows[0]  # chunk ids equal document ids here (one chunk each)


# ---------------------------------------------------------------------------------------------
# Dense branch


@SQLITE_ONLY  # SQLite's vec0 / Hamming machinery
def test_binary_prefilter_with_enough_candidates_equals_exact(
    corpus: store.Connection, settings: Settings, fake_embedder: FakeEmbedder
) -> None:
    coll = store.require_collection(corpus, settings.collection)
    q = fake_embedder.embed_queries(["sick leave and illness"])[0]
    common = dict(collection_id=coll.id, dimension=coll.dimension, access_keys=[1, 2], k=5)
    exact = search_vectors(corpus, q, mode="exact", **common)  # type: ignore[arg-type]
    binary = search_vectors(corpus, q, mode="binary", oversample=100, **common)  # type: ignore[arg-type]
    assert [c for c, _ in binary] == [c for c, _ in exact]
    assert [d for _, d in binary] == pytest.approx([d for _, d in exact])


def sixty_notes(
    conn: store.Connection, settings: Settings, fake_embedder: FakeEmbedder, tmp_path: Path
) -> tuple[Any, np.ndarray]:
    """Sixty one-line notes ingested with the fake embedder, and a query vector over them."""
    files = {f"{i:03}.md": f"note {i} about topic {i % 7} and item {i % 11}\n" for i in range(60)}
    ingest(conn, [write_corpus(tmp_path / "n", files)], settings=settings, embedder=fake_embedder)
    return store.require_collection(conn, settings.collection), fake_embedder.embed_queries(["topic 3 item 5"])[0]


@SQLITE_ONLY  # SQLite's vec0 / Hamming machinery
def test_binary_prefilter_rescores_only_its_candidates(
    conn: store.Connection, settings: Settings, fake_embedder: FakeEmbedder, tmp_path: Path
) -> None:
    coll, q = sixty_notes(conn, settings, fake_embedder, tmp_path)
    table = store.vector_table(coll.dimension)
    coarse = {int(r[0]) for r in conn.execute(
        f"SELECT chunk_id FROM {table} WHERE embedding_bit MATCH vec_quantize_binary(?) AND k = 6",
        (store.serialize_vector(q),))}
    binary = search_vectors(conn, q, collection_id=coll.id, dimension=coll.dimension, access_keys=[1], k=3,
                            mode="binary", oversample=2)
    assert len(binary) == 3
    assert {c for c, _ in binary} <= coarse
    exact_distances = dict(search_vectors(conn, q, collection_id=coll.id, dimension=coll.dimension,
                                          access_keys=[1], k=60))
    for cid, distance in binary:
        assert distance == pytest.approx(exact_distances[cid])
    assert [d for _, d in binary] == sorted(d for _, d in binary)


def test_binary_mode_without_a_bit_column_uses_exact() -> None:
    assert "embedding_bit" in dense_sql(64, "binary")
    assert "embedding_bit" not in dense_sql(60, "binary")
    with pytest.raises(ValueError, match="exact, binary"):
        dense_sql(64, "hnsw")


def test_search_works_on_a_dimension_without_bit_column(
    conn: store.Connection, settings: Settings, tmp_path: Path
) -> None:
    embedder = FakeEmbedder(dimension=60)
    ingest(conn, [write_corpus(tmp_path / "d", {"a.md": "alpha beta\n", "b.md": "gamma delta\n"})],
           settings=settings, embedder=embedder)
    hits = search(conn, "gamma", embedder=embedder, settings=settings.replace(dense_mode="binary"), stage="dense")
    assert hits[0].source == "b.md"


# ---------------------------------------------------------------------------------------------
# Dense branch: the "hamming" fast path (in-memory Hamming scan + float rescoring in SQL)


def test_hamming_distances_and_nearest_by_hand() -> None:
    words = np.array([[0b0000, 0b1111, 0b0101, 0b0001]], dtype=np.uint64)  # four 64-bit codes
    assert retrieval.hamming_distances(words, np.array([0b0001], dtype=np.uint64)).tolist() == [1, 3, 1, 0]
    distances = np.array([5, 1, 3, 1, 2, 3, 9], dtype=np.uint16)
    assert retrieval.nearest_by_distance(distances, 2).tolist() == [1, 3]
    assert retrieval.nearest_by_distance(distances, 4).tolist() == [1, 2, 3, 4, 5]  # the tie at 3 is kept whole
    assert retrieval.nearest_by_distance(distances, 10).tolist() == list(range(7))


def test_query_code_words_pack_sign_bits_little_endian() -> None:
    vector = np.array([1.0, -1.0, 0.5] + [-1.0] * 61 + [1.0] * 6, dtype=np.float32)  # 70 dimensions
    words = retrieval.query_code_words(vector, 2)
    assert words.tolist() == [0b101, 0b111111]


@SQLITE_ONLY  # SQLite's vec0 / Hamming machinery
def test_hamming_with_enough_candidates_equals_exact(
    corpus: store.Connection, settings: Settings, fake_embedder: FakeEmbedder
) -> None:
    coll = store.require_collection(corpus, settings.collection)
    for text in ("sick leave and illness", "VPN-403", "paid vacation payouts"):
        q = fake_embedder.embed_queries([text])[0]
        common = dict(collection_id=coll.id, dimension=coll.dimension, access_keys=[1, 2], k=5)
        exact = search_vectors(corpus, q, mode="exact", **common)  # type: ignore[arg-type]
        fast = search_vectors(corpus, q, mode="hamming", oversample=100, **common)  # type: ignore[arg-type]
        assert [d for _, d in fast] == pytest.approx([d for _, d in exact], abs=1e-6)
        last = exact[-1][1]  # chunks tied at the cut may come in either order, or either one
        assert {c for c, d in fast if d < last - 1e-6} == {c for c, d in exact if d < last - 1e-6}


@SQLITE_ONLY  # SQLite's vec0 / Hamming machinery
def test_hamming_rescores_only_its_nearest_codes(
    conn: store.Connection, settings: Settings, fake_embedder: FakeEmbedder, tmp_path: Path
) -> None:
    coll, q = sixty_notes(conn, settings, fake_embedder, tmp_path)
    rows = conn.execute(f"SELECT chunk_id, embedding FROM {store.vector_table(coll.dimension)}").fetchall()
    qbits = (q > 0)
    hamming = {int(r[0]): int(((store.deserialize_vector(r[1]) > 0) != qbits).sum()) for r in rows}
    fast = search_vectors(conn, q, collection_id=coll.id, dimension=coll.dimension, access_keys=[1], k=3,
                          mode="hamming", oversample=2)
    cut = sorted(hamming.values())[5]  # the 6th smallest Hamming distance: ties with it are candidates too
    assert len(fast) == 3
    assert all(hamming[c] <= cut for c, _ in fast)
    exact_distances = dict(search_vectors(conn, q, collection_id=coll.id, dimension=coll.dimension,
                                          access_keys=[1], k=60))
    for cid, distance in fast:
        assert distance == pytest.approx(exact_distances[cid], abs=1e-6)
    assert [d for _, d in fast] == sorted(d for _, d in fast)


def test_hamming_codes_reload_when_vectors_change(
    conn: store.Connection, settings: Settings, fake_embedder: FakeEmbedder, tmp_path: Path
) -> None:
    """The in-memory codes follow every write: a new document, a permission change, a deletion."""
    fast = settings.replace(dense_mode="hamming")
    ingest(conn, [write_corpus(tmp_path / "a", {"a.md": "alpha beta\n"})], settings=settings, embedder=fake_embedder)
    assert [h.source for h in search(conn, "gamma delta", embedder=fake_embedder, settings=fast, stage="dense")] \
        == ["a.md"]
    ingest(conn, [write_corpus(tmp_path / "a", {"b.md": "gamma delta\n"})], settings=settings, embedder=fake_embedder)
    hits = search(conn, "gamma delta", embedder=fake_embedder, settings=fast, stage="dense")
    assert hits[0].source == "b.md"
    coll = store.require_collection(conn, settings.collection)
    row = store.find_document(conn, coll.id, "b.md")
    store.update_document_groups(conn, coll, row["id"], ["hr"])
    assert [h.source for h in search(conn, "gamma delta", embedder=fake_embedder, settings=fast, stage="dense")] \
        == ["a.md"]
    assert search(conn, "gamma delta", embedder=fake_embedder, settings=fast, stage="dense", groups=["hr"])[0].source \
        == "b.md"
    store.delete_document(conn, row["id"])
    assert [h.source for h in search(conn, "gamma delta", embedder=fake_embedder, settings=fast, stage="dense",
                                     groups=["hr"])] == ["a.md"]


@SQLITE_ONLY  # SQLite's vec0 / Hamming machinery
def test_hamming_codes_are_cached_per_version(
    corpus: store.Connection, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    coll = store.require_collection(corpus, settings.collection)
    reads: list[int] = []
    real = retrieval.read_hamming_codes

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        reads.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(retrieval, "read_hamming_codes", counting)
    first = retrieval.hamming_codes(corpus, coll.id, [1, 2])
    assert retrieval.hamming_codes(corpus, coll.id, [2, 1]) is first and len(reads) == 1
    retrieval.hamming_codes(corpus, coll.id, [1])  # another set of readers: its own entry
    assert len(reads) == 2
    corpus.execute("UPDATE vector_versions SET version = version + 1 WHERE collection_id = ?", (coll.id,))
    assert retrieval.hamming_codes(corpus, coll.id, [1, 2]) is not first and len(reads) == 3


@SQLITE_ONLY  # SQLite's vec0 / Hamming machinery
def test_hamming_and_fts_queries_use_the_intended_plans(conn: store.Connection) -> None:
    """The rescoring and distance lookups go by rowid, and FTS5 is the outer loop of the sparse query
    (with chunks outer, SQLite re-ran the MATCH once per chunk of the collection)."""
    params = {"query": b"", "ids": "[1]", "collection": 1, "access_keys": "[1]", "k": 3, "match": '"a"',
              "weight_heading": 3.0, "weight_body": 1.0}
    plan = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + retrieval.HAMMING_RESCORE_SQL, params)]
    assert any("chunk_vectors USING INTEGER PRIMARY KEY" in line for line in plan)
    plan = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + retrieval.distance_sql(64), params)]
    assert any("USING INTEGER PRIMARY KEY" in line for line in plan)
    plan = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + retrieval.FTS_SQL, params)]
    assert plan[0].startswith("SCAN chunks_fts")
    assert any("SEARCH k USING INTEGER PRIMARY KEY" in line for line in plan)


def test_dense_sql_names_every_mode() -> None:
    assert dense_sql(64, "hamming") == retrieval.HAMMING_RESCORE_SQL
    with pytest.raises(ValueError, match="exact, binary, hamming"):
        dense_sql(64, "ivf")


@pytest.mark.slow
@SQLITE_ONLY  # reads vec0 (PostgreSQL's distances: tests/test_pg.py, same hits on both backends)
def test_cosine_distance_is_half_squared_l2_on_real_vectors(
    conn: store.Connection, settings: Settings, real_embedder, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    files = {
        "leave.md": "## Leave\n\nEmployees earn annual leave every pay period.\n\n## Sick\n\nSick leave is separate.\n",
        "vpn.md": "## VPN\n\nlỗi VPN-403 xử lý sao: khởi động lại ứng dụng.\n",
    }
    ingest(conn, [write_corpus(tmp_path / "real", files)], settings=settings, embedder=real_embedder)
    coll = store.require_collection(conn, settings.collection)
    q = real_embedder.embed_queries(["how much annual leave do I get"])[0]
    rows = list(conn.execute(
        f"SELECT chunk_id, vec_distance_cosine(embedding, :q), vec_distance_l2(embedding, :q), embedding "
        f"FROM {store.vector_table(coll.dimension)}", {"q": store.serialize_vector(q)}))
    assert len(rows) >= 3
    hits = {h.chunk_id: h.distance for h in search(conn, "how much annual leave do I get", embedder=real_embedder,
                                                       settings=settings, stage="hybrid", k=50)}
    for chunk_id, cosine, l2, blob in rows:
        assert np.linalg.norm(store.deserialize_vector(blob)) == pytest.approx(1.0, abs=1e-5)
        assert cosine == pytest.approx(l2 * l2 / 2, abs=1e-5)
        assert hits[chunk_id] == pytest.approx(cosine, abs=1e-6)


# ---------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize("query", ["", "   ", "?!", "“…”"])
def test_unusable_questions_raise_query_error(
    corpus: store.Connection, settings: Settings, fake_embedder: FakeEmbedder, query: str
) -> None:
    with pytest.raises(QueryError):
        search(corpus, query, embedder=fake_embedder, settings=settings)


def test_all_stopword_question_still_searches(
    corpus: store.Connection, settings: Settings, fake_embedder: FakeEmbedder
) -> None:
    assert search(corpus, "what is the", embedder=fake_embedder, settings=settings, stage="hybrid")


def test_bad_stage_collection_model_and_k(
    corpus: store.Connection, settings: Settings, fake_embedder: FakeEmbedder
) -> None:
    with pytest.raises(ValueError, match="dense, fts, hybrid, rerank"):
        search(corpus, "leave", embedder=fake_embedder, settings=settings, stage="bm25")
    with pytest.raises(NotFoundError):
        search(corpus, "leave", embedder=fake_embedder, settings=settings, collection="nope")
    with pytest.raises(IndexMismatchError):
        search(corpus, "leave", embedder=FakeEmbedder(model_id="other"), settings=settings)
    with pytest.raises(QueryError):
        search(corpus, "leave", embedder=fake_embedder, settings=settings, k=0)


# ---------------------------------------------------------------------------------------------
# Rerank stage


def test_rerank_stage_reorders_the_first_depth_hits_only(
    corpus: store.Connection, settings: Settings, fake_embedder: FakeEmbedder
) -> None:
    tuned = settings.replace(rerank_depth=3)
    hybrid = search(corpus, "leave vacation days", embedder=fake_embedder, settings=tuned, stage="hybrid", k=6)
    assert len(hybrid) == 6
    reranker = ReverseReranker()
    hits = search(corpus, "leave vacation days", embedder=fake_embedder, settings=tuned, stage="rerank", k=6,
                  reranker=reranker)
    assert reranker.seen == [h.chunk_id for h in hybrid[:3]]
    assert [h.chunk_id for h in hits] == [h.chunk_id for h in hybrid[2::-1] + hybrid[3:]]
    assert [h.rerank_score for h in hits[:3]] == [2.0, 1.0, 0.0]


def test_rerank_stage_with_settings_none_keeps_hybrid_order(
    corpus: store.Connection, settings: Settings, fake_embedder: FakeEmbedder
) -> None:
    hybrid = search(corpus, "leave vacation", embedder=fake_embedder, settings=settings, stage="hybrid")
    reranked = search(corpus, "leave vacation", embedder=fake_embedder, settings=settings, stage="rerank")
    assert reranked == hybrid


# ---------------------------------------------------------------------------------------------
# Channel audit


def test_chunk_fields_and_fields_in() -> None:
    fields = chunk_fields("Leave", "Leave > Annual leave", "Leave > Annual leave\n\nEarn leave monthly.",
                          "Earn leave monthly.")
    assert fields == {"title": "Leave", "section path": "Annual leave", "header": "Leave > Annual leave",
                      "content": "Earn leave monthly."}
    # The title word "leave" occurs in the content: that alone does not make the title feed the body.
    assert fields_in(fold("Earn leave monthly."), fields) == {
        "content": True, "title": False, "section path": False, "header": False}
    assert fields_in("leave > annual leave", fields) == {
        "content": False, "title": True, "section path": True, "header": True}


def test_audit_counts_each_field_in_two_channels_without_rerank(
    corpus: store.Connection, settings: Settings
) -> None:
    audit = audit_channels(corpus, settings)
    assert audit.chunks == len(store.chunk_rows(corpus))
    assert audit.feeds["content"] == ["vector", "fts_body"]
    assert audit.feeds["title"] == ["vector", "fts_heading"]
    assert audit.flagged == []
    with_rerank = audit_channels(corpus, settings.replace(rerank="llm"))
    assert with_rerank.feeds["content"] == ["vector", "fts_body", "reranker input"]
    assert "content" in with_rerank.flagged


def test_audit_flags_a_field_indexed_in_both_fts_columns(
    conn: store.Connection, settings: Settings, fake_embedder: FakeEmbedder
) -> None:
    """The seed-004 bug: the body column also carries the header, so the title counts three times."""
    coll = store.create_collection(conn, settings.collection, fake_embedder.model_id, fake_embedder.dimension)
    for i in range(3):
        content = f"Paragraph {i} about pay periods."
        section = f"Pay > Part {i}"
        chunk = Chunk(0, section, content, f"{section}\n\n{content}", 0, len(content))
        version = store.DocumentVersion(
            source=f"{i}.md", path=f"/{i}.md", title="Pay", groups=["all"], content_hash=str(i), bytes_hash=str(i),
            canonical_text=content, extractor="text", extractor_version="1", embedder=fake_embedder.model_id,
            dimension=fake_embedder.dimension, pipeline_version="test",
        )
        stored = store.StoredChunk(chunk, fake_embedder.embed_passages([chunk.text])[0], fold(section),
                                   fold(chunk.text))
        store.replace_document(conn, coll, version, [stored])
    audit = audit_channels(conn, settings)
    assert audit.feeds["title"] == ["vector", "fts_heading", "fts_body"]
    assert set(audit.flagged) == {"title", "section path", "header"}


# ---------------------------------------------------------------------------------------------
# CLI: rag search, rag audit channels


@pytest.fixture
def cli_db(corpus: store.Connection, db_path: Path, fake_embedder: FakeEmbedder,
           monkeypatch: pytest.MonkeyPatch) -> Path:
    import rag.registry

    monkeypatch.setattr(rag.registry, "load_embedder", lambda spec="minilm", threads=0: fake_embedder)
    return db_path


def test_cli_search_json(cli_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rag.cli import main

    assert main(["search", "loi VPN-403 xu ly sao", "--db", str(cli_db), "--stage", "hybrid", "-k", "3",
                 "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert 1 <= len(hits) <= 3
    assert set(hits[0]) >= {"rank", "chunk_id", "source", "section", "from", "to", "page", "distance", "dense_rank",
                            "sparse_rank", "rrf_score", "rerank_score", "content"}
    assert hits[0]["rank"] == 1 and hits[0]["source"] == "handbook/vpn.md"


def test_cli_search_batch(cli_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rag.cli import main

    queries = tmp_path / "q.jsonl"
    queries.write_text(
        json.dumps({"id": "a", "query": "salary band cap", "groups": ["all"]}) + "\n"
        + json.dumps({"id": "b", "query": "salary band cap", "groups": ["hr"]}) + "\n\n"
        + json.dumps({"id": "c", "query": "?!", "groups": ["all"]}) + "\n",
        encoding="utf-8",
    )
    assert main(["search", "--queries", str(queries), "--db", str(cli_db), "--stage", "fts"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["id"] for line in lines] == ["a", "b", "c"]
    assert not any(h["source"].startswith("hr/") for h in lines[0]["hits"])
    assert any(h["source"] == "hr/salary.md" for h in lines[1]["hits"])
    assert lines[2]["hits"] == [] and "letter or digit" in lines[2]["error"]


def test_cli_search_error_is_one_line(cli_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rag.cli import main

    assert main(["search", "   ", "--db", str(cli_db)]) == 1
    assert capsys.readouterr().err.startswith("error: the question is empty")


def test_cli_audit_channels(cli_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rag.cli import main

    assert main(["audit", "channels", "--db", str(cli_db), "--json"]) == 0
    audit = json.loads(capsys.readouterr().out)
    assert audit["flagged"] == []
    assert [c["name"] for c in audit["channels"]] == ["vector", "fts_heading", "fts_body", "reranker input"]
    assert main(["audit", "channels", "--db", str(cli_db), "--rerank", "llm"]) == 0
    out = capsys.readouterr().out
    assert "content" in out and "more than 2" in out



# ---------------------------------------------------------------------------------------------
# Keyword coverage: which FTS hits may vote in fusion


def test_keyword_idf_by_hand() -> None:
    idf = retrieval.keyword_idf(10, {"vpn": 1, "403": 3, "leave": 9}, ["vpn-403", "leave", "zebra"])
    assert idf["vpn-403"] == pytest.approx(np.log((10 - 1 + 0.5) / (1 + 0.5) + 1))  # rarest word decides
    assert idf["leave"] == pytest.approx(np.log((10 - 9 + 0.5) / (9 + 0.5) + 1))
    assert "zebra" not in idf  # in no chunk: a typo or unknown word carries no lexical evidence


def test_keyword_coverage_counts_whole_words_and_phrases() -> None:
    idf = {"vpn-403": 3.0, "leave": 1.0}
    assert retrieval.keyword_coverage("loi vpn 403 xu ly", idf) == pytest.approx(0.75)
    assert retrieval.keyword_coverage("vpn then 403; annual leave", idf) == pytest.approx(0.25)
    assert retrieval.keyword_coverage("leaves are green", idf) == 0.0  # no partial words
    assert retrieval.keyword_coverage("anything", {}) == 0.0


def test_only_well_covered_fts_hits_vote_in_hybrid(
    corpus: store.Connection, settings: Settings, fake_embedder: FakeEmbedder
) -> None:
    question = "vpn 403 error after the paid vacation"
    sparse = search_fts(
        corpus, build_fts_query(question), collection_id=1, access_keys=store.visible_access_keys(corpus, ["hr"]),
        k=50,
    )
    kept = retrieval.covered_fts_hits(corpus, sparse, retrieval.keywords(question), 0.5)
    texts = {r["id"]: r["fts_body"] for r in corpus.execute("SELECT id, fts_body FROM chunks")}
    assert kept and len(kept) < len(sparse)
    assert all("403" in texts[cid] for cid, _ in kept)  # the rare keywords carry the weight
    assert retrieval.covered_fts_hits(corpus, sparse, retrieval.keywords(question), 0.0) == sparse
    hybrid = search(corpus, question, embedder=fake_embedder, settings=settings, groups=["hr"], stage="hybrid")
    voted = {h.chunk_id for h in hybrid if h.sparse_rank is not None}
    assert voted == {cid for cid, _ in kept}


def test_necessary_keywords_by_hand() -> None:
    # total 6, bar 3: "a" and "b" (1 + 1 = 2 < 3) cannot reach it alone; every covered chunk holds "c".
    assert retrieval.necessary_keywords({"a": 1.0, "b": 1.0, "c": 4.0}, 0.5) == ["c"]
    assert retrieval.necessary_keywords({"a": 1.0, "b": 1.0}, 0.5) == ["a", "b"]  # either alone reaches 1 of 2
    assert sorted(retrieval.necessary_keywords({"a": 1.0, "b": 2.0}, 0.0)) == ["a", "b"]
    assert retrieval.necessary_keywords({}, 0.5) == []


@given(
    st.dictionaries(st.sampled_from("abcdefgh"), st.floats(0.01, 10.0), min_size=1),
    st.floats(0.05, 1.0),
    st.sets(st.sampled_from("abcdefgh")),
)
def test_a_chunk_without_a_necessary_keyword_never_reaches_the_bar(
    idf: dict[str, float], bar: float, held: set[str]
) -> None:
    needed = set(retrieval.necessary_keywords(idf, bar))
    text = " ".join(sorted(held & set(idf)))
    if not needed & held:
        assert retrieval.keyword_coverage(text, idf) < bar + 1e-12  # (float sums in another order)


def test_matching_only_necessary_keywords_keeps_every_covered_hit(
    corpus: store.Connection, settings: Settings, fake_embedder: FakeEmbedder
) -> None:
    question = "vpn 403 error after the paid vacation"
    runs = {
        flag: search(corpus, question, embedder=fake_embedder, settings=settings.replace(fts_necessary_only=flag),
                     groups=["hr"], stage="hybrid")
        for flag in (False, True)
    }
    voted = {flag: {h.chunk_id for h in hits if h.sparse_rank is not None} for flag, hits in runs.items()}
    assert voted[True] and voted[True] == voted[False]


# ---------------------------------------------------------------------------------------------
# Window vectors (issue 16)


def test_window_rescore_by_hand() -> None:
    dense = [(1, 0.30), (2, 0.40), (3, 0.50)]
    # chunk 2: 0.40 - 0.5 * (0.40 - 0.10) = 0.25 beats chunk 1 (no window); chunk 3's window is
    # farther than the chunk itself, so it stays at 0.50; chunk 1's window adds 0.5 * 0.02.
    assert retrieval.window_rescore(dense, {1: 0.28, 2: 0.10, 3: 0.70}, 0.5) == [(2, 0.40), (1, 0.30), (3, 0.50)]
    assert retrieval.window_rescore(dense, {2: 0.10}, 0.0) == dense  # weight 0: the dense order
    assert retrieval.window_rescore(dense, {2: 0.20}, 1.0) == [(2, 0.40), (1, 0.30), (3, 0.50)]
    assert retrieval.window_rescore([(5, 0.3), (4, 0.3)], {}, 0.5) == [(5, 0.3), (4, 0.3)]  # ties keep order


LONG_PAGE = (
    "---\ntitle: Office\n---\n## Notes\n\n"
    "The kitchen has a kettle, mugs and a fridge for shared lunches. "
    "Printers on the second floor need a badge before they print anything. "
    "Meeting rooms are booked through the calendar with a short agenda. "
    "Plants near the windows are watered by the facilities team on Mondays. "
    "The garage closes at seven pm sharp on weekdays. "
    "Visitors sign in at reception and wear a sticker while they stay. "
    "Quiet hours run from two to four in the afternoon across the open floor.\n"
)


def test_a_needle_in_a_long_chunk_rises_through_its_window(
    conn: store.Connection, settings: Settings, fake_embedder: FakeEmbedder, tmp_path: Path
) -> None:
    cafe = "---\ntitle: Cafe\n---\n## Menu\n\nThe garage is near the cafe on weekdays.\n"
    settings = settings.replace(window_chars=60)  # one sentence per window: the fake embedder is a bag of words
    ingest(conn, [write_corpus(tmp_path / "docs", {"office.md": LONG_PAGE, "cafe.md": cafe})], settings=settings,
           embedder=fake_embedder)
    windows = conn.execute("SELECT count(*) FROM window_vectors").fetchone()[0]
    assert windows >= 2  # the long chunk has windows, the one-sentence chunk none
    question = "when does the garage close at seven pm on weekdays"
    plain = search(conn, question, embedder=fake_embedder, settings=settings.replace(window_weight=0.0),
                   stage="dense", k=2)
    with_windows = search(conn, question, embedder=fake_embedder, settings=settings, stage="dense", k=2)
    assert [h.source for h in plain] == ["cafe.md", "office.md"]
    assert [h.source for h in with_windows] == ["office.md", "cafe.md"]
    assert [h.distance for h in with_windows] == sorted(h.distance for h in plain)[::-1]  # own distances kept


def test_window_vectors_go_with_their_chunks(
    conn: store.Connection, settings: Settings, fake_embedder: FakeEmbedder, tmp_path: Path
) -> None:
    settings = settings.replace(window_chars=200)  # the page's ~480 characters make several windows
    ingest(conn, [write_corpus(tmp_path / "docs", {"office.md": LONG_PAGE})], settings=settings,
           embedder=fake_embedder)
    owners = {r[0] for r in conn.execute("SELECT chunk_id FROM window_vectors")}
    assert owners and owners <= {r[0] for r in conn.execute("SELECT id FROM chunks")}
    store.delete_document(conn, int(conn.execute("SELECT id FROM documents").fetchone()[0]))
    assert conn.execute("SELECT count(*) FROM window_vectors").fetchone()[0] == 0
    ingest(conn, [tmp_path / "docs"], settings=settings.replace(window_chars=0), embedder=fake_embedder)
    assert conn.execute("SELECT count(*) FROM window_vectors").fetchone()[0] == 0  # window_chars 0: none


# ---------------------------------------------------------------------------------------------
# Tones for a toneless question


def test_restore_tones_follows_the_bigrams_not_just_the_counts() -> None:
    model = retrieval.tone_model(["bạn đọc", "bạn đọc", "bạn bè", "bản in", "bản in"])
    assert model.forms["ban"] == ("bạn", "bản")  # bạn 3, bản 2
    assert retrieval.restore_tones("ban doc", model) == "bạn đọc"
    assert retrieval.restore_tones("ban in", model) == "bản in"  # the unigram alone would say bạn
    assert retrieval.restore_tones("in ban", model) == "in bạn"  # no "in b*" pair: the likelier word


def test_restore_tones_keeps_what_it_does_not_know() -> None:
    model = retrieval.tone_model(["Lỗi mạng: khởi động lại máy.", "lỗi VPN-403"])
    assert retrieval.restore_tones("Loi VPN-403, khoi dong lai!", model) == "Lỗi VPN-403, khởi động lại!"
    assert retrieval.restore_tones("LOI mang", model) == "LỖI mạng"  # capitals kept
    assert retrieval.restore_tones("lỗi mang xyz 42", model) == "lỗi mạng xyz 42"  # toned, unknown, digits
    assert retrieval.restore_tones("", model) == ""
    assert retrieval.restore_tones("loi", retrieval.tone_model([])) == "loi"


class RecordingEmbedder(FakeEmbedder):
    """The fake embedder, noting every query text it embeds."""

    def __init__(self) -> None:
        super().__init__()
        self.queries: list[str] = []

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        self.queries += list(texts)
        return super().embed_queries(texts)


@pytest.mark.parametrize("stage", ["dense", "hybrid"])
def test_a_toneless_question_is_embedded_with_its_tones(
    corpus: store.Connection, settings: Settings, stage: str
) -> None:
    embedder = RecordingEmbedder()
    search(corpus, "loi vpn-403 xu ly sao", embedder=embedder, settings=settings, stage=stage)
    search(corpus, "loi vpn-403 xu ly sao", embedder=embedder, settings=settings.replace(tone_restore_depth=0),
           stage=stage)
    search(corpus, "How do I sign a commit?", embedder=embedder, settings=settings, stage=stage)
    assert embedder.queries == ["lỗi vpn-403 xử lý sao", "loi vpn-403 xu ly sao", "How do I sign a commit?"]


def test_tones_come_only_from_passages_the_reader_may_see(
    conn: store.Connection, settings: Settings, tmp_path: Path
) -> None:
    files = {
        "public.md": "---\ntitle: In\n---\n## In ấn\n\nMáy in tầng hai: muốn in thì chọn bản in rồi bấm in.\n",
        "hr/private.md": ("---\ntitle: Nhân sự\ngroups: [hr]\n---\n## Bạn in\n\n"
                          "muốn chọn bạn in: chọn bạn in, chọn bạn in nhé.\n"),
    }
    ingest(conn, [write_corpus(tmp_path / "docs", files)], settings=settings, embedder=FakeEmbedder())
    assert retrieval.query_language("muon chon ban in") == "vi-toneless"
    for groups, toned in ((["all"], "muốn chọn bản in"), (["hr"], "muốn chọn bạn in")):
        embedder = RecordingEmbedder()
        search(conn, "muon chon ban in", embedder=embedder, settings=settings, groups=groups)
        assert embedder.queries == [toned]


# ---------------------------------------------------------------------------------------------
# Query spelling (rag.spelling): misspelt English words mended against the visible vocabulary


@pytest.mark.parametrize("stage", ["fts", "dense", "hybrid"])
def test_a_misspelt_question_is_searched_mended(corpus: store.Connection, settings: Settings, stage: str) -> None:
    embedder = RecordingEmbedder()
    hits = search(corpus, "how much paid vacaton do emploees earn", embedder=embedder, settings=settings,
                  stage=stage)
    assert hits and hits[0].source.endswith("leave.md")
    if stage != "fts":
        assert embedder.queries == ["how much paid vacation do employees earn"]
    off = settings.replace(spell_correct=False)
    plain = RecordingEmbedder()
    typed = search(corpus, "vacaton emploees", embedder=plain, settings=off, stage=stage)
    if stage == "fts":
        assert typed == []  # neither misspelt word is in any chunk
    else:
        assert plain.queries == ["vacaton emploees"]


def test_a_correction_comes_only_from_words_the_reader_may_see(corpus: store.Connection, settings: Settings) -> None:
    coll = store.require_collection(corpus, settings.collection)
    typed = "what is the salray band cap"  # "salary" is only in hr/salary.md
    for groups, expected in ((["all"], ()), (["hr"], (("salray", "salary"),))):
        keys = store.visible_access_keys(corpus, groups)
        mended = retrieval.mend_spelling(corpus, typed, collection_id=coll.id, access_keys=keys)
        assert mended.changes == expected
    assert retrieval.term_docs(corpus, ["salary", "vacation", "nowhere"]) == {"salary": 1, "vacation": 3}


@SQLITE_ONLY
def test_term_counts_are_remembered_until_any_chunk_changes(
    corpus: store.Connection, settings: Settings, fake_embedder: FakeEmbedder, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rag.ingest import delete_documents

    reads: list[list[str]] = []
    read = retrieval.read_term_docs
    monkeypatch.setattr(retrieval, "read_term_docs", lambda conn, terms: reads.append(list(terms)) or read(conn, terms))
    cache = retrieval.TermDocsCache()
    assert cache.term_docs(corpus, ["vacation", "nowhere"]) == {"vacation": 3}
    assert cache.term_docs(corpus, ["nowhere", "vacation", "gpg"]) == {"vacation": 3, "gpg": 1}
    assert reads == [["vacation", "nowhere"], ["gpg"]]  # a word found in no chunk is remembered too
    other = store.open_db(settings.db_path)  # another connection (another process) adds a document
    try:
        write_corpus(tmp_path / "docs", {"handbook/extra.md": "---\ntitle: Extra\n---\n## More\n\nMore vacation.\n"})
        assert not ingest(other, [tmp_path / "docs"], settings=settings, embedder=fake_embedder).failed
        assert cache.term_docs(corpus, ["vacation", "nowhere"]) == {"vacation": 4}
        extra = other.execute("SELECT id FROM documents WHERE source LIKE '%extra.md'").fetchone()[0]
        delete_documents(other, [extra])
    finally:
        other.close()
    assert cache.term_docs(corpus, ["vacation"]) == {"vacation": 3}
    assert reads[2:] == [["vacation", "nowhere"], ["vacation"]]


def test_the_coverage_bar_drops_to_the_best_hit_only_when_asked(corpus: store.Connection, settings: Settings) -> None:
    coll = store.require_collection(corpus, settings.collection)
    keys = store.visible_access_keys(corpus, ["all"])
    sparse = search_fts(corpus, build_fts_query("vacation gpg"), collection_id=coll.id, access_keys=keys, k=10)
    idf = {"vacation": 1.0, "gpg": 1.0, "insurance": 2.0}  # no chunk holds "insurance": best coverage 1/4
    assert retrieval.covered_fts_hits(corpus, sparse, list(idf), 0.5, idf) == []
    floored = retrieval.covered_fts_hits(corpus, sparse, list(idf), 0.5, idf, floor_to_best=True)
    assert floored and len(floored) == len(sparse)  # every hit holds one keyword of weight 1 of 4
    idf["vacation"] = 1.5  # now the vacation hits cover more than the gpg one: only they vote
    best = retrieval.covered_fts_hits(corpus, sparse, list(idf), 0.5, idf, floor_to_best=True)
    rows = retrieval.hit_rows(corpus, [cid for cid, _ in best], collection_id=coll.id, access_keys=keys)
    assert best and all("vacation" in fold(rows[cid]["content"]) for cid, _ in best)
    assert retrieval.covered_fts_hits(corpus, sparse, list(idf), 0.2, idf, floor_to_best=True) == sparse


# ---------------------------------------------------------------------------------------------
# Vietnamese typed in Telex or VNI with the input method off (rag.keyboard, rag.spelling.decode_question)

VI_CORPUS = {
    "it/printer.md": ("---\ntitle: Máy in\n---\n## Kẹt giấy\n\nMáy in bị kẹt giấy: mở nắp sau, rút tờ giấy ra "
                      "rồi bật lại máy.\n\n## Mực in\n\nHết mực thì thay hộp mực mới.\n"),
    "it/leave.md": "---\ntitle: Nghỉ phép\n---\n## Số ngày\n\nMỗi năm nhân viên được mười hai ngày nghỉ phép.\n",
    "hr/salary.md": ("---\ntitle: Lương\ngroups: [hr]\n---\n## Thưởng\n\nKhoản thưởng cuối năm bằng một tháng "
                     "lương.\n"),
}


@pytest.fixture
def vi_corpus(conn: store.Connection, settings: Settings, fake_embedder: FakeEmbedder, tmp_path: Path
              ) -> store.Connection:
    report = ingest(conn, [write_corpus(tmp_path / "vi", VI_CORPUS)], settings=settings, embedder=fake_embedder)
    assert not report.failed
    return conn


@pytest.mark.parametrize("stage", ["fts", "dense", "hybrid"])
@pytest.mark.parametrize("typed", ["mays in bij ketj giaays", "ma1y in bi5 ke5t gia6y1", "may1 in bi5 ket5 giay61"])
def test_a_telex_or_vni_question_is_searched_as_the_toned_one(
    vi_corpus: store.Connection, settings: Settings, stage: str, typed: str
) -> None:
    toned = RecordingEmbedder()
    expected = search(vi_corpus, "máy in bị kẹt giấy", embedder=toned, settings=settings, stage=stage)
    embedder = RecordingEmbedder()
    hits = search(vi_corpus, typed, embedder=embedder, settings=settings, stage=stage)
    assert hits and hits[0].source.endswith("printer.md")
    assert [h.chunk_id for h in hits] == [h.chunk_id for h in expected]
    assert embedder.queries == toned.queries  # the dense branch embeds the toned question
    spelled = retrieval.question_spelling(vi_corpus, typed, settings=settings)
    assert spelled.text == "máy in bị kẹt giấy" and retrieval.query_language(spelled.text) == "vi"
    off = search(vi_corpus, typed, embedder=RecordingEmbedder(), settings=settings.replace(decode_telex=False),
                 stage="fts")
    assert not off or [h.chunk_id for h in off] != [h.chunk_id for h in expected]


def test_a_decoded_word_comes_only_from_documents_the_reader_may_see(
    vi_corpus: store.Connection, settings: Settings
) -> None:
    typed = "khoanr thuwowngr cuoois nawm"  # "thưởng" and "khoản" are only in hr/salary.md
    public = retrieval.question_spelling(vi_corpus, typed, settings=settings)
    assert "thưởng" not in public.text and "khoản" not in public.text
    assert ("nawm", "năm") in public.changes  # "năm" is in a public document too
    hr = retrieval.question_spelling(vi_corpus, typed, settings=settings, groups=["hr"])
    assert hr.text == "khoản thưởng cuối năm"


def test_an_english_question_over_english_documents_is_never_decoded(
    corpus: store.Connection, settings: Settings
) -> None:
    for question in ("does the process class keys box ex", "how do I sign a commit with gpg",
                     "is the vacation box for ex employees"):
        assert retrieval.question_spelling(corpus, question, settings=settings).changes == ()
    # the same corpus's Vietnamese page is found by a Telex question
    spelled = retrieval.question_spelling(corpus, "looix vpn-403 xwr lys sao", settings=settings)
    assert spelled.text == "lỗi vpn-403 xử lý sao"
