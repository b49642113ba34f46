"""rag.config.write_settings: the Settings page's writer validates the whole file before writing it."""

from __future__ import annotations

from pathlib import Path

import pytest

from rag.config import env_overrides, load_settings, settings_file, write_settings
from rag.errors import RagError


def test_written_settings_are_read_back_and_others_are_kept(data_dir: Path) -> None:
    path = write_settings({"max_distance": 0.61, "rewrite": "model", "show_unsupported": True})
    assert path == settings_file() == data_dir / "rag.toml"
    write_settings({"embedder": "e5"})  # a second write keeps the first one's values
    settings = load_settings()
    assert (settings.max_distance, settings.rewrite, settings.show_unsupported, settings.embedder) == (
        0.61, "model", True, "e5")
    write_settings({"rewrite": None})  # None removes a setting: its default applies again
    assert load_settings().rewrite == "rules" and "rewrite" not in path.read_text(encoding="utf-8")


def test_registered_language_models_are_saved_by_name(data_dir: Path) -> None:
    write_settings({"llm_path": "gemma", "answer_examiner": "qwen-1.5b"})
    assert (load_settings().llm_path, load_settings().answer_examiner) == ("gemma", "qwen-1.5b")


def test_strings_with_quotes_and_backslashes_survive(data_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / 'my "best" \\ model.gguf'
    model.write_bytes(b"GGUF")
    write_settings({"llm_path": str(model), "collection": "Tài liệu"})
    assert load_settings().llm_path == str(model) and load_settings().collection == "Tài liệu"


@pytest.mark.parametrize(("changes", "message"), [
    ({"max_distance": 3.0}, "max_distance must lie in [0, 2]"),
    ({"rewrite": "magic"}, "rewrite must be"),
    ({"window_chars": -1}, "window_chars must be 0"),
    ({"chunk_tokens": -1}, "chunk_tokens must be 0"),
    ({"toneless_dense_share": -0.1}, "toneless_dense_share must lie in [0, 1]"),
    ({"window_weight": 1.5}, "window_weight must lie in [0, 1]"),
    ({"fusion": "borda"}, "fusion must be one of convex, rrf"),
    ({"convex_dense_share": -0.1}, "convex_dense_share must lie in [0, 1]"),
    ({"top_k": "many"}, "top_k must be a whole number"),
    ({"colour": "blue"}, "unknown setting 'colour'"),
    ({"llm_path": "/nowhere/model.gguf"}, "no GGUF model file"),
    ({"llm_path": "my-own-model"}, "llm_path: unknown language model 'my-own-model'"),  # failed every question after
    ({"answer_examiner": "qwen-9b"}, "answer_examiner: unknown language model 'qwen-9b'"),
])
def test_an_invalid_change_writes_nothing(data_dir: Path, changes: dict[str, object], message: str) -> None:
    write_settings({"max_distance": 0.6})
    before = settings_file().read_text(encoding="utf-8")
    with pytest.raises(RagError, match=message.replace("[", r"\[").replace("]", r"\]")):
        write_settings(changes)
    assert settings_file().read_text(encoding="utf-8") == before


def test_environment_overrides_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAG_DECISION")  # conftest's
    assert env_overrides() == []
    monkeypatch.setenv("RAG_MAX_DISTANCE", "0.5")
    assert env_overrides() == ["max_distance"]


def test_a_negative_chunk_tokens_is_refused_when_the_settings_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_CHUNK_TOKENS", "-1")
    with pytest.raises(RagError) as error:
        load_settings()
    assert str(error.value) == "chunk_tokens must be 0 (the embedder's default budget) or more (got -1)"
    monkeypatch.setenv("RAG_CHUNK_TOKENS", "0")
    assert load_settings().chunk_tokens == 0  # 0 = the embedder's default
