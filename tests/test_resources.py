"""``Resources``: connections, the model cache, the owned Hamming codes, and ``close()``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rag import registry, retrieval, store
from rag.config import Settings
from rag.embedding import MINILM_INT8_ID
from rag.errors import StorageError
from rag.ingest import ingest
from rag.registry import EMBEDDER, LANGUAGE_MODEL, ModelInfo, Registry
from rag.resources import Resources
from rag.retrieval import search

from .fakes import FakeEmbedder


class ClosableModel:
    """Stands in for a ``rag.llm.LanguageModel``: counts its close() calls."""

    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """A process registry whose models are fakes; every model built is appended to the list."""
    made: list[Any] = []

    def embedder_factory(threads: int = 0, cache_dir: Path | None = None) -> FakeEmbedder:
        made.append(FakeEmbedder(model_id=MINILM_INT8_ID))
        return made[-1]

    def lm_factory(n_ctx: int = 4096, threads: int = 0, seed: int = 1337) -> ClosableModel:
        made.append(ClosableModel())
        return made[-1]

    fake = [ModelInfo(MINILM_INT8_ID, EMBEDDER, embedder_factory, aliases=("minilm",)),
            ModelInfo(registry.QWEN_05B_ID, LANGUAGE_MODEL, lm_factory, aliases=("qwen-0.5b",)),
            *(info for info in registry.BUNDLED if info.kind == registry.RERANKER)]
    monkeypatch.setattr(registry, "REGISTRY", Registry(fake))
    return made


def write(root: Path, name: str, text: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text, encoding="utf-8")
    return root


def test_connect_opens_a_migrated_database_and_connection_closes_it(settings: Settings) -> None:
    resources = Resources(settings)
    with pytest.raises(StorageError):  # a read-only command never creates the database
        resources.connect()
    conn = resources.connect(create=True)
    assert conn.execute("SELECT count(*) FROM collections").fetchone()[0] == 0
    conn.close()
    with resources.connection() as conn:
        assert store.list_collections(conn) == []
    with pytest.raises(store.sqlite.ProgrammingError):  # pysqlite3 or sqlite3, whichever store chose
        conn.execute("SELECT 1")


def test_models_load_once_by_name_and_by_id(built: list[Any], settings: Settings) -> None:
    resources = Resources(settings)
    first = resources.embedder("minilm")
    assert resources.embedder("minilm") is first and resources.embedder(MINILM_INT8_ID) is first
    assert resources.has_model(MINILM_INT8_ID) and not resources.has_model("e5")
    assert built == [first]
    assert resources.language_model() is resources.language_model("qwen-0.5b") is built[1]  # llm_path "" = default


def test_close_closes_the_models_and_empties_the_caches(built: list[Any], settings: Settings) -> None:
    with Resources(settings) as resources:
        llm = resources.language_model()
        resources.embedder("minilm")
        resources.close()  # twice (here and on exit) is fine
        assert llm.closed == 1 and not resources.has_model(MINILM_INT8_ID)
        again = resources.language_model()
        assert again is not llm  # a closed model is never handed out again
    assert llm.closed == 1 and again.closed == 1


def test_the_llm_reranker_reads_with_the_resources_model(built: list[Any], settings: Settings) -> None:
    from rag.rerank import LlmReranker

    class TokenizingModel(ClosableModel):
        def tokenize(self, text: str, *, add_bos: bool = False, special: bool = False) -> list[int]:
            return [len(text)]

    def lm_factory(n_ctx: int = 4096, threads: int = 0, seed: int = 1337) -> TokenizingModel:
        built.append(TokenizingModel())
        return built[-1]

    registry.REGISTRY.register(ModelInfo("fake/tokenizing", LANGUAGE_MODEL, lm_factory))
    resources = Resources(settings.replace(llm_path="fake/tokenizing"))
    reranker = resources.reranker(resources.settings.replace(rerank="llm"))
    assert isinstance(reranker, LlmReranker) and reranker.llm is resources.language_model()
    resources.close()
    assert reranker.llm.closed == 1


def test_the_hamming_codes_are_owned_and_follow_vector_changes(
    conn: store.Connection, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeEmbedder()
    fast = settings.replace(dense_mode="hamming")
    ingest(conn, [write(tmp_path / "a", "a.md", "alpha beta\n")], settings=settings, embedder=fake)
    reads: list[int] = []
    real = retrieval.read_hamming_codes
    monkeypatch.setattr(retrieval, "read_hamming_codes", lambda *a: reads.append(1) or real(*a))
    resources = Resources(settings)
    shared = len(retrieval.SHARED_HAMMING_CACHE)

    def dense(query: str) -> list[str]:
        hits = search(conn, query, embedder=fake, settings=fast, stage="dense", hamming_cache=resources.hamming_cache)
        return [h.source for h in hits]

    assert dense("gamma delta") == ["a.md"] and dense("alpha") == ["a.md"]
    assert len(reads) == 1 and len(resources.hamming_cache) == 1  # read once, kept by the resources
    assert len(retrieval.SHARED_HAMMING_CACHE) == shared  # the process default was not touched

    ingest(conn, [write(tmp_path / "a", "b.md", "gamma delta\n")], settings=settings, embedder=fake)
    assert dense("gamma delta")[0] == "b.md" and len(reads) == 2  # the vector version changed: read again
    without = [h.source for h in search(conn, "gamma delta", embedder=fake, settings=fast, stage="dense")]
    assert without == dense("gamma delta")  # the same hits as through the process default
    resources.close()
    assert len(resources.hamming_cache) == 0


def test_the_app_caches_one_resources_per_settings(built: list[Any], settings: Settings) -> None:
    from rag import ui
    from rag.config import load_settings

    ui.resources.clear()
    try:
        owned = ui.resources(settings)
        assert ui.resources(settings.replace()) is owned  # equal settings: the same object
        assert ui.resources(settings.replace(collection="other")) is not owned
        model = ui.embedder("minilm")  # through the Resources of the settings frame() reads
        assert ui.embedder(MINILM_INT8_ID) is model and built == [model]
        assert ui.resources(load_settings()).has_model(MINILM_INT8_ID)
    finally:
        ui.resources.clear()
