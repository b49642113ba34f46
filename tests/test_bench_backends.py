"""`rag bench --backend postgres` on a small run (fake embedder, the demo guide): both backends
grow with the same documents, the PostgreSQL step that more than doubles the chunks is a bulk
load whose indexes are back afterwards, and the crossover's share groups give the shares they
name. No timing is asserted: timings belong to a quiet machine, not to CI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rag import bench, bench_backends, pg, store
from rag.config import Settings

from .fakes import FakeEmbedder


def test_share_groups_cover_one_five_and_twenty_percent() -> None:
    groups = [bench_backends.share_group(n) for n in range(1000)]
    assert groups.count("s1") == 10 and groups.count("s5") == 40 and groups.count("s20") == 150
    assert groups.count(None) == 800


def test_small_run_grows_both_backends_alike(settings: Settings, pg_url: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "SHARED_EVAL", tmp_path / "no-shared-eval")  # the demo guide, on any machine
    options = bench_backends.BackendBenchOptions(sizes=(3000, 2000), repeats=1, pg_url=pg_url,
                                                 workdir=tmp_path / "w", incremental_chunks=500)
    # exact dense search on SQLite too (its 1-bit prefilter is coarse on the fake 64-d vectors), so
    # that both backends must find the same chunks (PostgreSQL scans exactly below 10k vectors)
    report = bench_backends.run_backend_bench(settings.replace(dense_mode="exact"), options, embedder=FakeEmbedder())
    json.dumps(report)  # JSON-ready
    assert report["corpus"] == "docs/guide" and report["transfer"]["verified"]
    assert list(report["sizes"]) == ["2000", "3000"]
    first, second = report["sizes"]["2000"], report["sizes"]["3000"]
    for block, size in ((first, 2000), (second, 3000)):
        lite, server = block["sqlite"], block["postgres"]
        assert lite["chunks"] == server["chunks"] == size
        assert lite["incremental_chunks"] == server["incremental_chunks"] == 500
        assert not lite["bulk"]
        assert lite["hybrid_recall@20"] == server["hybrid_recall@20"] is not None
        assert lite["hybrid"]["n"] == server["hybrid"]["n"] == report["queries"]
    # 2,000 from the guide's few hundred: more than doubled, a bulk load; 3,000 from 2,000: not
    assert first["postgres"]["bulk"] and not second["postgres"]["bulk"]
    assert set(first["postgres"]["index_build_seconds"]) == {*pg.bulk_index_names([FakeEmbedder.dimension]),
                                                             "vacuum analyze"}
    shares = second["postgres"]["crossover"]
    assert [c["share"] for c in shares] == list(bench_backends.SHARES)
    assert shares[-1]["visible"] == shares[-1]["of"] == 3000
    conn = store.open_db(pg_url)
    documents = [(int(r["source"].split("/")[1].split(".")[0]), int(r["chunk_count"]))
                 for r in store.document_rows(conn) if r["source"].startswith("synthetic/")]
    for c in shares[:-1]:
        wanted = bench_backends.SHARE_KEYS[c["share"]]
        assert c["visible"] == sum(n for number, n in documents if bench_backends.share_group(number) in wanted) > 0
    assert shares[0]["visible"] < shares[1]["visible"] < shares[2]["visible"] < shares[3]["visible"]
    assert pg.missing_bulk_indexes(conn, [FakeEmbedder.dimension]) == []
    conn.close()
    table = bench_backends.format_backend_report(report)
    assert "| 3,000 | postgres |" in table and "(bulk)" in table and "| 2,000 | 20% |" in table
