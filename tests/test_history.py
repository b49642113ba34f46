"""rag.history: storing runs, reading them back exactly, listing them and their flips, and the
migration that makes the two tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rag import history, store
from rag.cli import format_history
from rag.config import Settings
from rag.errors import RagError
from rag.golden import Golden, parse_golden
from rag.history import Flip

from .evalkit import GOLDEN, SCRIPT, ScriptedSearch, build_db, run
from .fakes import FakeEmbedder


@pytest.fixture
def db_path(backend_db: Path | str) -> Path | str:
    """Every test here runs on SQLite and on PostgreSQL (tests/conftest.py)."""
    return backend_db


@pytest.fixture
def golden() -> Golden:
    return parse_golden(GOLDEN, "golden_test", "f" * 64)


@pytest.fixture
def built(conn: Any, fake_embedder: FakeEmbedder) -> Any:
    build_db(conn, fake_embedder)
    return conn


def test_no_flips_against_a_run_that_did_not_look_k_deep(built: Any, golden: Golden, settings: Settings) -> None:
    # A run with -k 1 retrieves max(1, max_sources) hits: "not found" at 8 there means not looked for.
    first_id = history.save_run(built, run(built, golden, settings))
    worse = dict(SCRIPT)
    worse[("How much leave after five years?", "dense")] = [("leave.md", 0, 0.3)]
    shallow = run(built, golden, settings.replace(max_sources=4), ScriptedSearch(worse), ks=[1])
    assert shallow.config.depth == 4
    shallow_id = history.save_run(built, shallow)
    assert history.run_flips(built, shallow_id, k=8) == []
    assert history.flips_since(built, shallow_id, k=8) == (
        [], f"R@8 flips are not shown: run #{shallow_id} retrieved fewer than 8 hits per query")
    assert history.flips_since(built, first_id, k=8) == ([], "")  # no run before it
    assert history.run_flips(built, shallow_id, k=4) == [Flip("G1/q", "dense", "lost", 2, None)]  # 4 deep: told


def test_history_round_trip_and_flips(built: Any, golden: Golden, settings: Settings) -> None:
    first = run(built, golden, settings, commit="abc123")
    first_id = history.save_run(built, first)
    loaded = history.load_report(built, first_id)
    assert loaded == first.with_run_id(first_id)
    assert loaded.to_json() == {**first.to_json(), "config": {**first.to_json()["config"], "run_id": first_id}}
    worse = dict(SCRIPT)
    worse[("How much leave after five years?", "dense")] = [("leave.md", 0, 0.3)]
    second_id = history.save_run(built, run(built, golden, settings, ScriptedSearch(worse)))
    assert history.previous_run(built, second_id) == first_id
    assert history.previous_run(built, first_id) is None
    assert history.run_flips(built, second_id, k=8) == [Flip("G1/q", "dense", "lost", 2, None)]
    assert history.run_flips(built, first_id, k=8) == []
    assert [f.to_json() for f in history.run_flips(built, first_id, k=8, previous=second_id)] == [
        {"query": "G1/q", "stage": "dense", "change": "gained", "before": None, "after": 2}
    ]
    runs = history.list_runs(built, golden_name="golden_test")
    assert [r.id for r in runs] == [second_id, first_id]
    assert runs[1].git_commit == "abc123" and runs[1].embedder == FakeEmbedder.model_id
    assert runs[1].metrics["dense"].hit_rate[4].value == 0.75
    stored = built.execute("SELECT count(*) FROM eval_results WHERE run_id = ?", (first_id,)).fetchone()[0]
    assert stored == 6 * 2
    assert "golden_test" in format_history(runs)
    with pytest.raises(RagError):
        history.load_report(built, 999)


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


def test_deleting_a_run_deletes_its_results(built: Any, golden: Golden, settings: Settings) -> None:
    run_id = history.save_run(built, run(built, golden, settings))
    built.execute("DELETE FROM eval_runs WHERE id = ?", (run_id,))
    assert built.execute("SELECT count(*) FROM eval_results").fetchone()[0] == 0


def test_list_runs_json_is_the_history_command_shape(built: Any, golden: Golden, settings: Settings) -> None:
    run_id = history.save_run(built, run(built, golden, settings, commit="abc123"))
    (stored,) = history.list_runs(built)
    assert list(stored.to_json()) == [*history.RUN_COLUMNS, "metrics"]
    assert stored.to_json()["id"] == run_id and stored.to_json()["stages"] == ["dense", "hybrid"]
    assert stored.to_json()["metrics"]["hybrid"]["recall@1"] == {"value": 0.75, "ci": [0.3006, 0.9544], "hits": 3}
    assert history.list_runs(built, golden_name="other") == []
    assert history.list_runs(built, collection="default", limit=1) == [stored]


def test_save_run_writes_one_result_row_per_query_and_stage(built: Any, golden: Golden, settings: Settings) -> None:
    report = run(built, golden, settings, ScriptedSearch(SCRIPT, leaky=True))
    run_id = history.save_run(built, report)
    rows = {(r["query_id"], r["stage"]): r for r in built.execute("SELECT * FROM eval_results WHERE run_id = ?",
                                                                   (run_id,))}
    assert rows[("G4/q", "dense")]["leak"] == 1 and rows[("G4/q", "hybrid")]["leak"] == 0
    assert rows[("G4/q", "hybrid")]["gate"] == "bluff" and rows[("G4/q", "dense")]["gate"] is None  # gate stage only
    assert rows[("G2/q", "dense")]["destroyed"] == 1 and rows[("G1/p1", "dense")]["rank"] == 4
    summary = built.execute("SELECT threshold, recommended_threshold, leaks FROM eval_runs WHERE id = ?",
                            (run_id,)).fetchone()
    assert tuple(summary) == (0.675, report.gate.recommended.threshold, 1)




def test_the_latest_recommendation_is_applied_to_the_collection(
    built: Any, golden: Golden, settings: Settings
) -> None:
    assert history.latest_recommendation(built, "default") is None
    with pytest.raises(RagError, match="no evaluation run"):
        history.apply_recommendation(built, "default")
    report = run(built, golden, settings)
    run_id = history.save_run(built, report)
    found = history.latest_recommendation(built, "default")
    assert found is not None and found.run_id == run_id
    assert found.threshold == report.gate.recommended.threshold and found.in_force == report.gate.current.threshold
    applied = history.apply_recommendation(built, "default")
    assert applied == found and store.require_collection(built, "default").max_distance == found.threshold


def test_a_run_made_with_another_model_recommends_nothing(built: Any, golden: Golden, settings: Settings) -> None:
    history.save_run(built, run(built, golden, settings))
    coll = store.require_collection(built, "default")
    store.set_collection_embedder(built, coll.id, "other/model", coll.dimension)
    assert history.latest_recommendation(built, "default") is None
