"""Process bodies for the PostgreSQL concurrency test (tests/test_pg.py): one writer replacing a
document again and again while readers search; run with ``python -m tests.pg_workers``."""

from __future__ import annotations

import json
import sys
import time

from rag import store
from rag.config import load_settings
from rag.ingest import ingest
from rag.retrieval import search

from .fakes import FakeEmbedder

PARTS = 5  # sections of every version of live.md; a search must see all of one version
QUERY = "marker signal beacon"


def live_text(version: int) -> str:
    """Version ``version`` of live.md: PARTS sections, each naming the version."""
    return "".join(f"## Part {j}\n\nmarker signal beacon version v{version} part {j}.\n\n" for j in range(PARTS))


def write(db: str, folder: str, versions: int) -> None:
    """Ingest ``versions`` versions of live.md (and one new document per version)."""
    from pathlib import Path

    root = Path(folder)
    conn = store.open_db(db)
    settings = load_settings(db_path=db)
    for version in range(1, versions + 1):
        (root / "live.md").write_text(live_text(version), encoding="utf-8")
        (root / f"new_{version}.md").write_text(f"# New {version}\n\nunrelated note {version}.\n", encoding="utf-8")
        report = ingest(conn, [root], settings=settings, embedder=FakeEmbedder())
        if report.failed:
            raise SystemExit(f"ingest failed: {report.failed}")
    conn.close()
    print(json.dumps({"versions": versions}), flush=True)


def read(db: str, seconds: float) -> None:
    """Search for ``seconds``; print how many searches saw live.md whole and any that did not."""
    conn = store.open_db(db, create=False)
    settings = load_settings(db_path=db)
    embedder = FakeEmbedder()
    searches, torn = 0, []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        hits = [h for h in search(conn, QUERY, embedder=embedder, settings=settings, stage="hybrid", k=50)
                if h.source == "live.md"]
        versions = {v.split()[0] for h in hits for v in h.content.split(" version ")[1:]}
        text = " ".join(h.content for h in hits)
        if len(versions) != 1 or not all(f"part {j}." in text for j in range(PARTS)):
            torn.append(sorted(h.content for h in hits))
        searches += 1
    conn.close()
    print(json.dumps({"searches": searches, "torn": torn[:3], "torn_count": len(torn)}), flush=True)


if __name__ == "__main__":
    role, db, *rest = sys.argv[1:]
    if role == "write":
        write(db, rest[0], int(rest[1]))
    else:
        read(db, float(rest[0]))
