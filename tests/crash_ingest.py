"""Subprocess body for the kill -9 test: ingest a folder slowly so the kill lands mid-run."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

import numpy as np

from rag import store
from rag.config import load_settings
from rag.ingest import ingest

from .fakes import FakeEmbedder


class SlowEmbedder(FakeEmbedder):
    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        time.sleep(0.02 * len(texts))
        return super().embed_passages(texts)


def report(done: int, _total: int, _chunks: int, _source: str) -> None:
    """``done N`` once N documents are committed (the call before the first file, done 0, says nothing)."""
    if done:
        print(f"done {done}", flush=True)


def main(db: str, folder: str) -> None:
    conn = store.open_db(db)
    print("started", flush=True)
    ingest(conn, [folder], settings=load_settings(db_path=db, embed_batch=2), embedder=SlowEmbedder(),
           on_progress=report)
    print("finished", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
