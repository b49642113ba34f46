"""A process killed (-9) at any moment during ingest leaves every document at its old or new version."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rag import store
from rag.config import load_settings
from rag.ingest import ingest

from .conftest import ROOT
from .fakes import FakeEmbedder

DOCS = 8


def write_corpus(folder: Path, version: str) -> dict[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    texts = {}
    for d in range(DOCS):
        paragraphs = [f"Document {d} {version} paragraph {p}: " + " ".join(f"w{d}{p}{i}" for i in range(30))
                      for p in range(6 if version == "v1" else 9)]
        text = f"# Doc {d} {version}\n\n" + "\n\n".join(paragraphs) + "\n"
        (folder / f"doc{d}.md").write_text(text, encoding="utf-8")
        texts[f"doc{d}.md"] = text
    return texts


def check_consistent(db: Path, versions: list[dict[str, str]]) -> dict[str, int]:
    """Integrity holds and each document is wholly one known version; returns version index per doc."""
    conn = store.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.execute("INSERT INTO chunks_fts(chunks_fts) VALUES('integrity-check')")
    store.migrate(conn)
    seen: dict[str, int] = {}
    for row in store.document_rows(conn):
        matches = [i for i, v in enumerate(versions) if v.get(row["source"]) == row["canonical_text"]]
        assert matches, f"{row['source']} holds text of no known version"
        assert row["status"] == "ok"
        chunks = store.chunk_rows(conn, row["id"])
        assert len(chunks) == row["chunk_count"] > 0
        for c in chunks:
            assert row["canonical_text"][c["char_from"] : c["char_to"]] == c["content"]
        ids = [c["id"] for c in chunks]
        assert len(store.chunk_vectors(conn, 64, ids)) == len(ids)
        marks = ",".join("?" * len(ids))
        fts = conn.execute(f"SELECT count(*) FROM chunks_fts WHERE rowid IN ({marks})", ids).fetchone()[0]
        assert fts == len(ids)
        seen[row["source"]] = matches[0]
    orphans = conn.execute("SELECT count(*) FROM vec_chunks_64 WHERE chunk_id NOT IN (SELECT id FROM chunks)")
    assert orphans.fetchone()[0] == 0
    conn.close()
    return seen


@pytest.mark.slow
def test_kill_minus_nine_at_random_points_never_leaves_half_a_document(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    v1 = write_corpus(corpus, "v1")
    baseline = tmp_path / "baseline.db"
    conn = store.open_db(baseline)
    ingest(conn, [corpus], settings=load_settings(db_path=baseline), embedder=FakeEmbedder())
    conn.close()
    v2 = write_corpus(corpus, "v2")
    rng = random.Random(20261130)
    outcomes = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for run in range(12):
        db = tmp_path / f"run{run}.db"
        if run % 3 != 2:  # most runs update an existing index; every third builds from nothing
            for suffix in ("", "-wal", "-shm"):
                if Path(f"{baseline}{suffix}").exists():
                    shutil.copy(f"{baseline}{suffix}", f"{db}{suffix}")
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.crash_ingest", str(db), str(corpus)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "started"
        # Kill after the child reports `committed` documents, plus a random moment inside the next
        # one: the kill point is chosen by progress, not by wall time, so a busy machine (which
        # only slows the child down) cannot move it past the end of the run.
        committed = rng.randrange(0, DOCS - 1)
        for done in range(1, committed + 1):
            assert proc.stdout.readline().strip() == f"done {done}"
        time.sleep(rng.uniform(0.0, 0.05))  # a document takes >= 0.06 s (SlowEmbedder), so at most one more
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        seen = check_consistent(db, [v1, v2])
        assert sum(seen.values()) >= committed  # every reported document survived at its new version
        outcomes.append((run % 3 != 2, committed, sorted(seen.values())))
    # the kill points really did land in different places: update runs killed after some but not all
    # documents mixed old and new versions
    assert any(update and 0 in seen and 1 in seen for update, _, seen in outcomes), outcomes


@pytest.mark.slow
def test_readers_never_see_half_a_document_during_a_full_reingest(tmp_path: Path) -> None:
    """A real writer process re-ingests every document while this process searches without pause."""
    from rag.retrieval import search

    corpus = tmp_path / "corpus"
    v1 = write_corpus(corpus, "v1")
    db = tmp_path / "live.db"
    conn = store.open_db(db)
    settings = load_settings(db_path=db)
    ingest(conn, [corpus], settings=settings, embedder=FakeEmbedder())
    v2 = write_corpus(corpus, "v2")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    writer = subprocess.Popen([sys.executable, "-m", "tests.crash_ingest", str(db), str(corpus)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None and writer.stdout.readline().strip() == "started"
    searches = 0
    deadline = time.monotonic() + 60  # bounded: the writer needs ~2 s; a stuck one fails the test
    try:
        while writer.poll() is None and time.monotonic() < deadline:
            hits = search(conn, "Document paragraph", embedder=FakeEmbedder(), settings=settings, stage="hybrid",
                          k=20)
            searches += 1
            conn.execute("BEGIN")  # one snapshot for the whole check
            try:
                for document_id in {h.document_id for h in hits}:
                    row = conn.execute("SELECT * FROM documents WHERE id = ?", (document_id,)).fetchone()
                    if row is None:
                        continue  # replaced after the search: the next search sees the new one
                    assert row["canonical_text"] in (v1[row["source"]], v2[row["source"]])
                    chunks = store.chunk_rows(conn, row["id"])
                    assert len(chunks) == row["chunk_count"] > 0
                    assert all(row["canonical_text"][c["char_from"]:c["char_to"]] == c["content"] for c in chunks)
            finally:
                conn.execute("COMMIT")
    finally:
        writer.wait(timeout=60)
    assert writer.returncode == 0 and searches > 5
    final = check_consistent(db, [v1, v2])
    assert set(final.values()) == {1}  # every document reached its new version
    conn.close()
