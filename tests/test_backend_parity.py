"""Both backends on the visible golden sets of ../shared/eval (skipped cleanly without them): the
same recall at 4 and 20 (within 0.01) and no leak in any stage, with the real embedding models.
The demo corpus's gate (tests/test_eval_regression.py) runs on both backends too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rag import evaluate, store
from rag.config import load_settings
from rag.golden import load_golden
from rag.ingest import ingest, load_acl

from .conftest import ROOT, shared_eval_or_skip

STAGES = ["dense", "fts", "hybrid"]
KS = [1, 4, 8, 20]
TOLERANCE = 0.01

SETS = {  # name -> (corpus, golden set, access map, embedding model)
    "handbook": ("corpus_handbook", "golden_handbook.json", "acl_handbook.json", "minilm"),
    "vi": ("corpus_vi", ROOT / "docs" / "golden_vi.json", None, "e5"),
}


def _report(db: Path | str, corpus: Path, golden: Path, acl: Path | None, embedder: Any) -> Any:
    settings = load_settings(db_path=db)
    conn = store.open_db(db)
    try:
        ingest(conn, [corpus], settings=settings, embedder=embedder, acl=load_acl(acl))
        return evaluate.run_eval(conn, load_golden(golden), embedder=embedder, settings=settings, stages=STAGES,
                                 ks=KS)
    finally:
        conn.close()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SETS))
def test_both_backends_give_the_same_recall_and_no_leak(name: str, tmp_path: Path, pg_url: str) -> None:
    from rag.registry import load_embedder

    shared = shared_eval_or_skip()
    corpus_name, golden_name, acl_name, model = SETS[name]
    golden = Path(golden_name) if isinstance(golden_name, Path) else shared / golden_name
    if not golden.is_file():
        pytest.skip(f"{golden} is not present")
    acl = shared / acl_name if acl_name else None
    embedder = load_embedder(model)
    reports = {db_name: _report(db, shared / corpus_name, golden, acl, embedder)
               for db_name, db in (("sqlite", tmp_path / "parity.db"), ("postgres", pg_url))}
    for db_name, report in reports.items():
        assert not report.leaks.found, f"{db_name} leaked: {report.leaks.found}"
    for stage in STAGES:
        for k in (4, 20):
            a, b = (r.stages[stage].hit_rate[k].value for r in reports.values())
            print(f"{name} {stage} R@{k}: sqlite {a:.3f} postgres {b:.3f}")
            assert abs(a - b) <= TOLERANCE, (name, stage, k, a, b)
