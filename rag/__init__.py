"""rag-desk: ask your documents, offline, from one SQLite file.

The public surface is re-exported here and loaded lazily (PEP 562), so ``import rag.store`` in
the CLI does not pay for the retrieval and generation stacks it does not use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    # pipeline entry points
    "ask": "rag.ask",
    "ask_stream": "rag.ask",
    "ingest": "rag.ingest",
    "reindex": "rag.ingest",
    "search": "rag.retrieval",
    "run_eval": "rag.evaluate",
    # building blocks
    "apply_gate": "rag.gate",
    "chunk_document": "rag.chunking",
    "extract": "rag.extract",
    "fuse_rrf": "rag.retrieval",
    "generate_answer": "rag.generate",
    "load_embedder": "rag.embedding",
    "load_language_model": "rag.llm",
    "load_reranker": "rag.rerank",
    "load_settings": "rag.config",
    "ModelInfo": "rag.registry",
    "Resources": "rag.resources",
    "open_db": "rag.store",
    "Reranker": "rag.rerank",
    "Embedder": "rag.embedding",
    "LanguageModel": "rag.llm",
    "STAGES": "rag.retrieval",
    # data model and errors
    "Answer": "rag.records",
    "Chunk": "rag.records",
    "Citation": "rag.records",
    "Hit": "rag.records",
    "Settings": "rag.config",
    "RagError": "rag.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rag' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
