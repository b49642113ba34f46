from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

from rag import store
from rag.config import Settings, load_settings

from .fakes import FakeEmbedder

ROOT = Path(__file__).resolve().parent.parent
SHARED_EVAL = ROOT.parent / "shared" / "eval"
GUIDE = ROOT / "docs" / "guide"


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own data directory (settings file, default database)."""
    path = tmp_path / "data"
    monkeypatch.setenv("RAG_DATA_DIR", str(path))
    for name in list(os.environ):
        if name.startswith("RAG_") and name != "RAG_DATA_DIR":
            monkeypatch.delenv(name)
    # The answer-or-refuse decision is off: the tests pin the pipeline's other stages on tiny
    # corpora the bundled policy was not fitted for; tests/test_answer_decision.py turns it on.
    monkeypatch.setenv("RAG_DECISION", "off")
    return path


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "test.db"


@pytest.fixture
def conn(db_path: Path) -> Iterator[store.Connection]:
    c = store.open_db(db_path)
    yield c
    c.close()


@pytest.fixture
def settings(db_path: Path) -> Settings:
    return load_settings(db_path=db_path)


@pytest.fixture
def fake_embedder() -> FakeEmbedder:
    return FakeEmbedder()


@pytest.fixture(scope="session")
def real_embedder():  # type: ignore[no-untyped-def]
    """The bundled all-MiniLM-L6-v2, loaded once per session."""
    from rag.embedding import load_embedder

    return load_embedder("minilm")


@pytest.fixture(scope="session")
def real_llm():  # type: ignore[no-untyped-def]
    """The bundled Gemma-3-270M (``rag.llm.LlamaCppModel``), loaded once per session."""
    from rag.llm import load_language_model

    return load_language_model("", n_ctx=4096, threads=0, seed=1337)


def shared_eval_or_skip() -> Path:
    """../shared/eval exists on the project's machines only; a user's clone skips these cases."""
    if not SHARED_EVAL.is_dir():
        pytest.skip("../shared/eval is not present in this checkout")
    return SHARED_EVAL
