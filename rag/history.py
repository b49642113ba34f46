"""The evaluation history kept in the database (``db/migrations/0002_eval_runs.sql``).

``eval_runs`` holds one row per stored run (its configuration and ``summary``: the report without
``per_query``); ``eval_results`` one row per run, query and stage. ``load_report`` rebuilds the
``EvalReport`` that was saved, so a stored run reads exactly like the JSON of ``rag eval --json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rag import store
from rag.errors import NotFoundError
from rag.evaluate import EvalReport, StageResult, stage_ranks
from rag.metrics import flips

INSERT_RUN = """
INSERT INTO eval_runs (created_at, collection, embedder, strategy, stages, ks, gate_stage, threshold,
    recommended_threshold, max_sources, git_commit, golden_name, golden_hash, queries, leaks, destroyed,
    settings, summary)
VALUES (:created_at, :collection, :embedder, :strategy, :stages, :ks, :gate_stage, :threshold,
    :recommended_threshold, :max_sources, :git_commit, :golden_name, :golden_hash, :queries, :leaks, :destroyed,
    :settings, :summary)
"""

INSERT_RESULT = """
INSERT INTO eval_results (run_id, query_id, item_id, kind, wording, query, groups, stage, rank, min_distance,
    destroyed, leak, gate)
VALUES (:run_id, :query_id, :item_id, :kind, :wording, :query, :groups, :stage, :rank, :min_distance,
    :destroyed, :leak, :gate)
"""

PREVIOUS_RUN = """
SELECT id FROM eval_runs
WHERE golden_name = :golden_name AND collection = :collection AND id < :id
ORDER BY id DESC LIMIT 1
"""

RUN_COLUMNS = (
    "id", "created_at", "collection", "embedder", "strategy", "stages", "ks", "gate_stage", "threshold",
    "recommended_threshold", "max_sources", "git_commit", "golden_name", "golden_hash", "queries", "leaks",
    "destroyed",
)


@dataclass(frozen=True, slots=True)
class StoredRun:
    """One row of ``eval_runs`` with its per-stage metrics (``rag eval history --json``)."""

    id: int
    created_at: str
    collection: str
    embedder: str
    strategy: str
    stages: tuple[str, ...]
    ks: tuple[int, ...]
    gate_stage: str
    threshold: float  # in force
    recommended_threshold: float
    max_sources: int
    git_commit: str | None
    golden_name: str
    golden_hash: str
    queries: int
    leaks: int
    destroyed: int  # queries
    metrics: dict[str, StageResult]  # stage -> its metrics

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "created_at": self.created_at, "collection": self.collection, "embedder": self.embedder,
            "strategy": self.strategy, "stages": list(self.stages), "ks": list(self.ks),
            "gate_stage": self.gate_stage, "threshold": self.threshold,
            "recommended_threshold": self.recommended_threshold, "max_sources": self.max_sources,
            "git_commit": self.git_commit, "golden_name": self.golden_name, "golden_hash": self.golden_hash,
            "queries": self.queries, "leaks": self.leaks, "destroyed": self.destroyed,
            "metrics": {s: m.to_json() for s, m in self.metrics.items()},
        }


@dataclass(frozen=True, slots=True)
class Flip:
    """A query whose hit-rate@k outcome changed between two runs, in one stage."""

    query: str
    stage: str
    change: str  # "lost" (passed before, fails now) | "gained"
    before: int | None  # first relevant rank before
    after: int | None  # and now

    def to_json(self) -> dict[str, Any]:
        return {"query": self.query, "stage": self.stage, "change": self.change, "before": self.before,
                "after": self.after}


def save_run(conn: store.Connection, report: EvalReport) -> int:
    """Store a report (its summary and one row per query and stage) in one transaction."""
    config, gate = report.config, report.gate
    params = {
        "created_at": config.timestamp,
        "collection": config.collection,
        "embedder": config.embedder,
        "strategy": config.strategy,
        "stages": json.dumps(list(config.stages)),
        "ks": json.dumps(list(config.ks)),
        "gate_stage": gate.stage,
        "threshold": gate.current.threshold,
        "recommended_threshold": gate.recommended.threshold,
        "max_sources": gate.max_sources,
        "git_commit": config.git_commit,
        "golden_name": config.golden.name,
        "golden_hash": config.golden.sha256,
        "queries": report.queries.total,
        "leaks": report.leaks.total,
        "destroyed": report.destroyed.queries,
        "settings": json.dumps(config.settings, ensure_ascii=False),
        "summary": json.dumps(report.summary_json(), ensure_ascii=False),
    }
    with store.transaction(conn):
        run_id = int(conn.execute(INSERT_RUN, params).lastrowid)
        for q in report.per_query:
            for stage in config.stages:
                conn.execute(INSERT_RESULT, {
                    "run_id": run_id, "query_id": q.id, "item_id": q.item, "kind": q.kind,
                    "wording": q.wording, "query": q.query, "groups": json.dumps(list(q.groups)),
                    "stage": stage, "rank": q.ranks[stage], "min_distance": q.min_distance[stage],
                    "destroyed": int(q.destroyed), "leak": int(stage in q.leaks),
                    "gate": q.gate if stage == gate.stage else None,
                })
    return run_id


def _stored_run(row: Any) -> StoredRun:  # a sqlite3.Row of eval_runs
    stages = json.loads(row["summary"])["stages"]
    return StoredRun(
        id=int(row["id"]), created_at=row["created_at"], collection=row["collection"], embedder=row["embedder"],
        strategy=row["strategy"], stages=tuple(json.loads(row["stages"])), ks=tuple(json.loads(row["ks"])),
        gate_stage=row["gate_stage"], threshold=row["threshold"], recommended_threshold=row["recommended_threshold"],
        max_sources=row["max_sources"], git_commit=row["git_commit"], golden_name=row["golden_name"],
        golden_hash=row["golden_hash"], queries=row["queries"], leaks=row["leaks"], destroyed=row["destroyed"],
        metrics={s: StageResult.from_json(block) for s, block in stages.items()},
    )


def list_runs(
    conn: store.Connection, golden_name: str | None = None, collection: str | None = None, limit: int = 50
) -> list[StoredRun]:
    """Recent runs, newest first, without their per-query rows."""
    where: list[str] = []
    params: dict[str, Any] = {"limit": limit}
    if golden_name:
        where.append("golden_name = :golden_name")
        params["golden_name"] = golden_name
    if collection:
        where.append("collection = :collection")
        params["collection"] = collection
    sql = (
        f"SELECT {', '.join(RUN_COLUMNS)}, summary FROM eval_runs"
        + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id DESC LIMIT :limit"
    )
    return [_stored_run(row) for row in conn.execute(sql, params)]


def load_report(conn: store.Connection, run_id: int) -> EvalReport:
    """A stored run, exactly the report ``save_run`` was given, recorded as run ``run_id``."""
    row = conn.execute("SELECT summary FROM eval_runs WHERE id = ?", (run_id,)).fetchone()
    if row is None:
        raise NotFoundError(f"no evaluation run {run_id} in this database")
    report = json.loads(row["summary"])
    report["config"]["run_id"] = run_id
    per_query: dict[str, dict[str, Any]] = {}
    for r in conn.execute("SELECT * FROM eval_results WHERE run_id = ? ORDER BY rowid", (run_id,)):
        q = per_query.setdefault(r["query_id"], {
            "id": r["query_id"], "item": r["item_id"], "kind": r["kind"], "wording": r["wording"],
            "query": r["query"], "groups": json.loads(r["groups"]), "destroyed": bool(r["destroyed"]),
            "ranks": {}, "min_distance": {}, "leaks": [], "gate": None,
        })
        q["ranks"][r["stage"]] = r["rank"]
        q["min_distance"][r["stage"]] = r["min_distance"]
        if r["leak"]:
            q["leaks"].append(r["stage"])
        if r["gate"] is not None:
            q["gate"] = r["gate"]
    report["per_query"] = list(per_query.values())
    return EvalReport.from_json(report)


def previous_run(conn: store.Connection, run_id: int) -> int | None:
    """The run before ``run_id`` on the same golden set and collection."""
    row = conn.execute("SELECT golden_name, collection FROM eval_runs WHERE id = ?", (run_id,)).fetchone()
    if row is None:
        raise NotFoundError(f"no evaluation run {run_id} in this database")
    found = conn.execute(
        PREVIOUS_RUN, {"golden_name": row["golden_name"], "collection": row["collection"], "id": run_id}
    ).fetchone()
    return None if found is None else int(found["id"])


def unmeasured_flips(before: EvalReport, after: EvalReport, k: int) -> str:
    """Why R@k flips between two runs cannot be told ("" when they can): a run that retrieved
    fewer than ``k`` hits per query (``rag eval -k 1``) records "not found" for a passage it
    never looked that far for."""
    shallow = [f"#{r.config.run_id}" if r.config.run_id is not None else "one run" for r in (before, after)
               if r.config.depth < k]
    if not shallow:
        return ""
    return f"R@{k} flips are not shown: run {' and '.join(shallow)} retrieved fewer than {k} hits per query"


def flips_since(conn: store.Connection, run_id: int, k: int = 8, previous: int | None = None) -> tuple[list[Flip], str]:
    """Queries whose hit-rate@k (R@k) outcome changed since the previous run (or ``previous``), per
    stage, and why none can be told ("" when they can: ``unmeasured_flips``), both runs read once."""
    before_id = previous if previous is not None else previous_run(conn, run_id)
    if before_id is None:
        return [], ""
    before, after = load_report(conn, before_id), load_report(conn, run_id)
    note = unmeasured_flips(before, after, k)
    if note:
        return [], note
    out: list[Flip] = []
    for stage in after.stages:
        if stage not in before.stages:
            continue
        old, new = stage_ranks(before, stage), stage_ranks(after, stage)
        lost, gained = flips(old, new, k)
        out.extend(Flip(q, stage, "lost", old[q], new[q]) for q in lost)
        out.extend(Flip(q, stage, "gained", old[q], new[q]) for q in gained)
    return out, ""


def run_flips(conn: store.Connection, run_id: int, k: int = 8, previous: int | None = None) -> list[Flip]:
    """The flips of ``flips_since`` (none when either run retrieved fewer than ``k`` hits)."""
    return flips_since(conn, run_id, k, previous)[0]


@dataclass(frozen=True, slots=True)
class Recommendation:
    """The gate threshold the last evaluation run of a collection recommends."""

    run_id: int
    created_at: str
    golden_name: str
    threshold: float  # recommended
    in_force: float  # the threshold that run measured with


def latest_recommendation(conn: store.Connection, collection: str) -> Recommendation | None:
    """The recommendation of the newest run on ``collection`` made with its current model, if any.

    A run made before the collection was rebuilt with another embedding model is skipped: its
    distances are not comparable with the new model's.
    """
    coll = store.get_collection(conn, collection)
    if coll is None:
        return None
    for run in list_runs(conn, collection=collection):
        if run.embedder == coll.embedder:
            return Recommendation(run.id, run.created_at, run.golden_name, run.recommended_threshold, run.threshold)
    return None


def apply_recommendation(conn: store.Connection, collection: str) -> Recommendation:
    """Stamp ``collection`` with its latest recommended threshold (what ``rag eval --calibrate`` does).

    Raises:
        NotFoundError: no evaluation run of the collection with its current model.
    """
    found = latest_recommendation(conn, collection)
    if found is None:
        raise NotFoundError(f"no evaluation run of “{collection}” with its current model: run one on the "
                            "Evaluation page first")
    store.set_collection_threshold(conn, collection, found.threshold)
    return found
