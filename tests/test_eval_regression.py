"""CI regression gate: the bundled demo corpus (docs/guide) with its golden set.

Ingests docs/guide with the real all-MiniLM-L6-v2 into a temporary database, runs every stage
the baseline has, and fails when anything leaks or when more than ``TOLERANCE`` queries that
passed at R@8 (hit rate at 8) in ``tests/baseline_eval.json`` fail now (per stage), printing the flipped queries.

Regenerate the baseline after an intended change (and commit it with that change); the gate
measures all-MiniLM-L6-v2, so the model is named (``auto`` would pick e5 for the guide, which
has a Vietnamese part):

    rag ingest docs/guide --db /tmp/guide.db --acl docs/acl_guide.json --embedder minilm
    rag eval --db /tmp/guide.db --golden docs/golden_guide.json --no-save --brief \\
        --json tests/baseline_eval.json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rag import evaluate, store
from rag.cli import format_report
from rag.config import load_settings
from rag.evaluate import EvalReport
from rag.golden import load_golden
from rag.ingest import ingest, load_acl

from .conftest import GUIDE, ROOT

GOLDEN = ROOT / "docs" / "golden_guide.json"
ACL = ROOT / "docs" / "acl_guide.json"
BASELINE = ROOT / "tests" / "baseline_eval.json"
K = 8
TOLERANCE = 2  # queries allowed to flip from pass to fail at R@8, per stage


@pytest.mark.slow
def test_demo_corpus_has_no_leaks_and_no_regressions(backend_db: Path | str, real_embedder: Any) -> None:
    """On both backends (SQLite file, PostgreSQL server: tests/conftest.py)."""
    for needed in (GUIDE, GOLDEN, BASELINE):
        if not needed.exists():
            pytest.skip(f"{needed.relative_to(ROOT)} is missing (see this module's docstring to generate it)")
    baseline = EvalReport.from_json(json.loads(BASELINE.read_text(encoding="utf-8")))
    settings = load_settings(db_path=backend_db)
    conn = store.open_db(settings.db_path)
    try:
        ingest(conn, [GUIDE], settings=settings, embedder=real_embedder, acl=load_acl(ACL if ACL.exists() else None))
        report = evaluate.run_eval(
            conn, load_golden(GOLDEN), embedder=real_embedder, settings=settings,
            stages=baseline.config.stages, ks=baseline.config.ks,
        )
    finally:
        conn.close()
    print(format_report(report, per_query=False))
    if baseline.config.golden.sha256 != report.config.golden.sha256:
        print("note: the golden set changed since the baseline; queries are matched by id")

    leaks = report.leaks.found
    assert not leaks, "forbidden evidence was retrieved:\n" + "\n".join(
        f"  {x.query} {x.stage} rank {x.rank}: {x.source} ({x.reason})" for x in leaks
    )
    lost = evaluate.regressions(baseline, report, k=K)
    for stage, queries in lost.items():
        for q in queries:
            print(f"flipped at R@{K} in {stage}: {q}")
    too_many = {stage: queries for stage, queries in lost.items() if len(queries) > TOLERANCE}
    assert not too_many, (
        f"more than {TOLERANCE} queries that passed at R@{K} in tests/baseline_eval.json now fail: "
        + "; ".join(f"{stage}: {', '.join(queries)}" for stage, queries in too_many.items())
    )
