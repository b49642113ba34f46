"""`rag bench`: a tiny smoke run (fake embedders, no generation) so the benchmark keeps working.

No thresholds are asserted: timings belong to `rag bench` on a quiet machine, not to CI.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rag import bench, store
from rag.config import Settings
from rag.errors import RagError
from rag.ingest import ingest

from .fakes import FakeEmbedder
from .test_retrieval import CORPUS, write_corpus


def test_quick_run_produces_every_target_and_a_table(settings: Settings, tmp_path: Path) -> None:
    options = bench.BenchOptions(quick=True, sizes=(150, 200), repeats=1, generation=False, workdir=tmp_path / "w")
    report = bench.run_bench(settings, options, embedder=FakeEmbedder(),
                             reference=FakeEmbedder(model_id="fake/reference"),
                             multilingual=(FakeEmbedder(model_id="fake/e5"), FakeEmbedder(model_id="fake/e5-int8")))
    json.dumps(report)  # JSON-ready
    assert set(report["targets"]) == set(bench.TARGETS)
    for name, verdict in report["targets"].items():
        assert set(verdict) >= {"value", "bound", "met"}, name
        assert verdict["bound"] == bench.TARGETS[name][0]
    assert report["targets"]["first_token_s"]["met"] is None  # quick: no generation
    assert report["targets"]["hybrid_p50_ms"]["value"] is not None
    sizes = report["retrieval"]["sizes"]
    assert list(sizes) == ["150", "200"]
    assert sizes["200"]["chunks"] >= 200
    for name in ("dense_exact", "dense_binary_vec0", "dense_fast", "fts", "hybrid", "hybrid_exact", "embed_query"):
        assert sizes["200"][name]["n"] == report["corpus"]["queries"]
    assert 0.0 <= sizes["200"]["fast_vs_exact_top20_overlap"] <= 1.0
    assert report["ingest"]["chunks"] > 0 and 0.0 <= report["ingest"]["outside_embedding_share"] <= 1.0
    assert all(s["load_start"] >= 0 for s in report["sections"])
    e5 = report["embedding"]["e5"]
    assert (e5["q4"]["model"], e5["int8"]["model"]) == ("fake/e5", "fake/e5-int8") and e5["speedup"] > 0
    assert e5["recall@20"]["int8"] == {"dense": None, "hybrid": None}  # quick: no 4-bit ingest
    assert report["targets"]["e5_int8_speedup"]["value"] == e5["speedup"]
    assert report["targets"]["e5_int8_recall20_loss"]["met"] is None
    table = bench.format_report(report)
    assert "targets (2 cores):" in table and "hybrid_p50_ms" in table and "e5 int8 speedup" in table


def test_cli_bench_quick_writes_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from rag.cli import main

    monkeypatch.setattr(bench, "load_embedder", lambda spec="minilm", threads=0: FakeEmbedder(model_id=f"fake/{spec}"))
    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--sizes", "150", "--json", str(out)]) == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    assert "targets" in report and report["quick"] is True
    assert "targets (2 cores):" in capsys.readouterr().out


def test_synthetic_documents_grow_from_real_chunks(
    conn: store.Connection, settings: Settings, tmp_path: Path
) -> None:
    embedder = FakeEmbedder()
    ingest(conn, [write_corpus(tmp_path / "docs", CORPUS)], settings=settings, embedder=embedder)
    before = conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
    total = bench.grow_to(conn, settings.collection, before + 45, np.random.default_rng(1))
    assert total == before + 45
    rows = conn.execute(
        "SELECT d.source, d.groups, v.embedding FROM chunk_vectors v JOIN chunks k ON k.id = v.chunk_id "
        "JOIN documents d ON d.id = k.document_id WHERE d.source LIKE 'synthetic/%'"
    ).fetchall()
    assert len(rows) == 45
    assert {r[0] for r in rows} == {"synthetic/000000.md", "synthetic/000001.md", "synthetic/000002.md"}
    assert {r[1] for r in rows if r[0] == "synthetic/000000.md"} == {'["hr"]'}  # one in ten is restricted
    for r in rows:
        assert np.linalg.norm(store.deserialize_vector(r[2])) == pytest.approx(1.0, abs=1e-5)
    assert bench.grow_to(conn, settings.collection, 10, np.random.default_rng(1)) == total  # never shrinks


def test_target_verdicts_and_percentiles() -> None:
    assert bench.target("hybrid_p50_ms", 20.0) == {"value": 20.0, "bound": 25.0, "rule": "<=", "met": True}
    assert bench.target("embedding_speedup", 1.5)["met"] is False
    assert bench.target("rss_mb", None)["met"] is None
    assert bench.percentile([1, 2, 3, 4], 50) == 2.5
    assert bench.parse_sizes("1000,10_000") == (1000, 10000)
    with pytest.raises(RagError):
        bench.parse_sizes("10k")
