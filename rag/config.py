"""One frozen ``Settings`` object, built once (defaults <- TOML file <- environment).

Nothing inside ``rag/`` reads globals or the environment after this: settings are passed down.
``write_settings`` changes the file (the Settings page), validating the result before it writes.
``RAG_DATA_DIR`` moves the data directory (default ``~/.local/share/rag-desk``), so tests and
demos can redirect everything with one variable; ``RAG_DB`` overrides the database file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rag.errors import RagError

DEFAULT_DATA_DIR = Path.home() / ".local" / "share" / "rag-desk"
CONFIG_FILE_NAME = "rag.toml"


POSTGRES_SCHEMES = ("postgresql://", "postgres://")
FUSIONS = ("convex", "rrf")  # settings.fusion: how the hybrid branches are fused (rag.retrieval)


def is_database_url(location: str | Path) -> bool:
    """Whether a database argument names a PostgreSQL server rather than an SQLite file."""
    return isinstance(location, str) and location.lower().startswith(POSTGRES_SCHEMES)


def database_location(raw: str) -> Path | str:
    """A ``--db`` / ``RAG_DB`` / ``db_path`` value: a PostgreSQL URL stays a str (``Path`` would fold
    its ``//``), anything else is an SQLite file path."""
    text = raw.strip()
    return text if is_database_url(text) else Path(text).expanduser()


def data_dir() -> Path:
    """The directory for the default database, assembled models and run files."""
    return Path(os.environ.get("RAG_DATA_DIR", str(DEFAULT_DATA_DIR))).expanduser()


@dataclass(frozen=True, slots=True)
class Settings:
    # --- storage ---
    # The SQLite file, or a PostgreSQL URL (postgresql://user@host:5432/desk; rag.pg) kept as a str
    db_path: Path | str = dataclasses.field(default_factory=lambda: data_dir() / "rag.db")
    collection: str = "default"  # collection used when none is named
    # --- ingest ---
    # Embedder of NEW collections (an existing one keeps its own): "auto" (the default since issue 16:
    # multilingual-e5-small when the files look Vietnamese, else all-MiniLM-L6-v2 int8; the choice and
    # its reason are printed) | "minilm" (int8 ONNX, 2.4x faster than "minilm-fp32" at the same golden
    # recall@20; rag bench) | "minilm-fp32" | "e5" | path to a sentence-transformers dir
    embedder: str = "auto"
    strategy: str = "E"  # chunking strategy A-F or R (see rag.chunking)
    # Folders the Documents page may ingest from ("Ingest a folder"), separated by os.pathsep (":" on
    # Linux); "" turns folder ingest off in the app. The page reads files on the server, so any
    # visitor could otherwise index (and then read) any file it can reach. The CLI is not limited.
    ingest_roots: str = "~"
    chunk_tokens: int = 0  # chunk budget in the embedder's tokens, header included; 0 = model default
    embed_batch: int = 32  # passages per embedding call
    # A document longer than this fails alone with the reason (0: no limit). Chunking and embedding
    # hold a document whole, ~23 bytes of memory per character (a 50 MB text file peaked at 1.15 GB
    # and would take ~27 minutes to embed, committed at the end), so a stray 1 GB log or dump would
    # exhaust the machine's memory and stop every later run at the same file. 20 million characters
    # is ten long books: ~20,000 passages.
    max_document_chars: int = 20_000_000
    # --- retrieval ---
    candidates: int = 50  # top N taken from each branch before fusion
    rrf_k: int = 60  # reciprocal rank fusion constant (Cormack et al. 2009)
    # How the two branches of "hybrid" are fused (rag.retrieval.fuse_convex, fuse_rrf): "convex" =
    # a weighted sum of each branch's scores, min-max normalised over the candidates, the dense
    # branch weighing convex_dense_share (Bruch, Gai & Ingber, ACM TOIS 2023); "rrf" = reciprocal
    # rank fusion. Chosen on the visible golden sets (handbook, guide, golden_vi: share 0.3-0.8 by
    # grid, 0.7 best pooled MRR@20), checked on the held-out ones (eval/); README "Quality".
    fusion: str = "convex"
    convex_dense_share: float = 0.7
    top_k: int = 20  # hits returned by search
    # "exact" vec0 float scan, "binary" vec0 bit prefilter + float rescoring, or "hamming": the 1-bit
    # codes scanned in memory (numpy popcount), the nearest hamming_oversample * k rescored in float
    # from the plain chunk_vectors table. sqlite-vec 0.1.9's KNN costs time linear in its k, so
    # "binary" is hardly faster than "exact"; "hamming" is the default since issue 8 (rag bench,
    # 2 cores, 100k chunks: exact 58 ms, binary 42 ms, hamming 2-4 ms p50; golden recall@20 equal).
    dense_mode: str = "hamming"
    binary_oversample: int = 2  # binary candidates per wanted hit; x8 measured slower than exact even at 20k
    # Hamming candidates per wanted hit, rescored in float. Top-20 overlap with exact at 100k chunks
    # (rag bench, synthetic scale-up): x8 0.923 (2.0 ms), x16 0.961 (2.9 ms), x32 0.982 (4.3 ms).
    hamming_oversample: int = 32
    weight_section: float = 3.0  # FTS5 bm25() weight of the title/section-path column
    weight_content: float = 1.0  # FTS5 bm25() weight of the content column
    fts_min_coverage: float = 0.5  # an FTS hit votes in fusion only if it holds this IDF share of the keywords
    # Hybrid: the sparse branch matches only the keywords a chunk must hold to reach fts_min_coverage
    # (rag.retrieval.necessary_keywords). rag bench at 100k chunks: hybrid p50 49.5 -> 16.1 ms, p95
    # 120 -> 28 ms; golden hybrid R@4/8/20 unchanged on the handbook, guide and Vietnamese sets.
    fts_necessary_only: bool = True
    # The dense branch's share of the fused score for questions in Vietnamese typed without tones
    # (rag.retrieval.dense_share; 0.5 = equal, 0 = keywords only). Chosen on golden_vi and the
    # guide (README "Quality"): flat from 0.1 to 0.3 there, 0.2 taken.
    toneless_dense_share: float = 0.2
    # The dense branch's share for a question in another language than the passages it lands on (the
    # dense branch's first 5): English asked over Vietnamese help, Vietnamese over an English manual,
    # where keywords match only the words both languages share (rag.retrieval.dense_share; 0.5 =
    # plain RRF). Chosen on golden_vi (17 English-asked queries): 0.5 -> 0.8 MRR@20 0.50 -> 0.62.
    cross_language_dense_share: float = 0.8
    # A question in Vietnamese typed without tones is re-toned before it is embedded, from the text of
    # the keyword branch's first tone_restore_depth hits (rag.retrieval.toned_query; 0 = embed it as
    # typed). Chosen on golden_vi: 10, 20 and 50 within one query of each other, 20 taken; toneless
    # queries dense R@4 0.68 -> 0.75. The keyword branch still searches the question as typed.
    tone_restore_depth: int = 20
    # An English question whose first 5 dense passages include a Vietnamese one (English asked over
    # Vietnamese help) is also searched translated into Vietnamese by the instruct answer model, and
    # the two rankings are fused (rag.translate, rag.retrieval.translation_target, fuse_wordings);
    # off = searched as typed only. A base model (Gemma) does not translate. README "Quality".
    translate_questions: bool = True
    # An English question's misspelt words ("pasword") are mended against the collection's own
    # vocabulary before both branches search it (rag.spelling: a word no chunk holds and no English
    # dictionary knows, one edit from a word that a visible chunk holds). README "Quality".
    spell_correct: bool = True
    # A question typed in Telex or VNI with the Vietnamese input method off ("mays in bij ketj",
    # "ma1y in bi5 ke5t") is searched decoded, "máy in bị kẹt", in both branches (rag.keyboard,
    # rag.spelling.decode_question: only words no chunk holds as typed, into words a visible chunk
    # holds; English questions are left alone). README "Vietnamese".
    decode_telex: bool = True
    # Window vectors (issue 16): a chunk longer than window_chars characters also gets one vector per
    # window of whole sentences (header + at most window_chars characters; 0: none, the pipeline as
    # before). The dense branch rescores its candidates: a chunk's cosine similarity s becomes
    # s + window_weight * max(0, best window similarity - s); the gate still reads the chunk's own
    # distance. Chosen on the visible golden sets (handbook, guide, golden_vi; README "Quality"),
    # checked on the held-out ones (eval/): 500 characters, weight 0.5.
    window_chars: int = 500
    window_weight: float = 0.5
    # Learned order (issue 16, rag.ranker): a logistic model over the fusion's own signals (scores,
    # branch ranks, keyword coverage of content and headings, length) re-orders the first
    # rank_model.depth (30) fused hits of "hybrid". "bundled" = rag/ranker_default.json, fitted on the
    # visible golden sets with `rag eval ranker`; a path = a model fitted on your own golden set;
    # "off" = the fused order. Checked leave-one-corpus-out and on the held-out sets (README "Quality").
    rank_model: str = "bundled"
    # "none" | "cross-encoder" | "llm". Off by default, by measurement (rag eval --stages hybrid,rerank,
    # handbook golden set, 56 answerable queries): the LLM reranker over the bundled Gemma-3-270M took
    # R@1/4/8 from 0.607/0.893/0.946 to 0.071/0.179/0.375 (R@4 +2/-42, sign test p = 1e-10) at ~12 s
    # per question. No cross-encoder is bundled; a user's is measured the same way before use.
    rerank: str = "none"
    rerank_model: str = ""  # local directory of a sentence-transformers CrossEncoder
    rerank_budget_ms: float = 4000.0  # past this the reranker gives up and the fused order stands
    rerank_depth: int = 20  # how many fused hits the reranker sees
    # --- gate ---
    max_distance: float = 0.675  # cosine distance above which a hit is "not close enough"
    max_sources: int = 4  # hits kept by the gate and shown to the model
    # --- generation ---
    llm_path: str = ""  # a registered name (qwen-0.5b, qwen-1.5b, gemma) or a GGUF file; empty = qwen-0.5b
    n_ctx: int = 4096  # model context window
    max_tokens: int = 200  # cap on generated tokens
    temperature: float = 0.0  # greedy decoding: same question, same answer
    seed: int = 1337  # fixed sampling seed
    repeat_penalty: float = 1.0  # llama.cpp repetition penalty; 1.0 = off (loops are cut by a guard instead)
    threads: int = 0  # llama.cpp threads; 0 = all cores
    # "auto" (the model's own: "instruct" rules for a GGUF with a chat template, a worked
    # "example" for a base model without one) | "instruct" | "example"
    prompt_style: str = "auto"
    # Each source is narrowed to the sentences around its best match, at most this many
    # characters (0 = whole chunks); prefill is most of an answer's time on a CPU.
    source_chars: int = 400
    # --- conversation (the Ask page) ---
    # How a follow-up ("And which port does it use?") becomes a standalone question to search:
    # "rules" (the previous question's content words appended, ~0.1 ms), "model" (the language
    # model rewrites it; 0.4-0.9 s with the bundled Gemma-3-270M, falling back to the rules) or "off".
    rewrite: str = "rules"
    # Load the collection's embedder and the language model in the background when the app starts,
    # so the first question does not wait for them (the app's tests turn it off).
    preload_models: bool = True
    # --- the answer-or-refuse decision (rag.decide): "auto" = the collection's fitted policy
    # (rag eval --calibrate), else the one bundled with the desk; "off" = the distance gate alone
    decision: str = "auto"
    # After an instruct model answers, ask it (one more short turn, prefix cached) whether its
    # answer gives what the question asks: its yes/no log-odds are a signal of the decision. Off:
    # measured with Qwen2.5-Coder-0.5B on the visible golden sets, the log-odds did not separate
    # right answers from wrong ones (ROC AUC 0.46 over 132 questions) and cost ~0.5 s.
    lm_verdict: bool = False
    # A second model reads the question and the answer as shown and gives its yes/no log-odds that
    # the answer gives what is asked (rag.examine): a signal of the decision. "off", or a language
    # model's registered name ("qwen-1.5b") or GGUF path. The decision then uses the policy fitted
    # with that signal (rag/decision_examiner.json) instead of the bundled one. Off by default:
    # with qwen-1.5b, held out, fewer answerable questions were refused (lost 0.565 -> 0.387) but more
    # must-refuse ones answered (bluffs 1 -> 4 of 18), at ~2.5 s and 1.8 GB more (README, "Answers").
    answer_examiner: str = "off"
    # When an instruct model's reply has no verified sentence (and does not decline), ask once
    # more, primed with the language's second lead (rag/prompts/instruct_retry_lead_<lang>.txt),
    # if a kept passage holds a word of the question: the prompt prefix is cached, so it costs the
    # second reply's decode (complete answer p50 3.6 -> 4.3 s in rag bench; README).
    answer_retry: bool = True
    # --- verification ---
    support_threshold: float = 0.5  # share of a sentence's content words in 2 adjacent sentences of a cited source
    show_unsupported: bool = False  # show dropped sentences struck through instead of hiding
    # --- team mode (rag.auth, docs/guide/permissions.md) ---
    auth: bool = False  # team mode: every page needs a sign-in (also `rag serve --team`, RAG_AUTH=1)
    session_idle_minutes: int = 60  # a session unused this long ends; each use restarts the count
    audit_retention_days: int = 365  # `rag audit prune` deletes audit rows older than this; 0 = keep all
    lockout_failures: int = 5  # failed sign-ins in a row for one name before it is locked (1 min, doubling)
    lockout_minutes: int = 15  # failures are forgotten after this long without one; also the longest lock

    def replace(self, **changes: Any) -> Settings:
        """A copy with some fields changed (fields are validated again)."""
        return validate(dataclasses.replace(self, **changes))


_FIELDS = {f.name: f for f in dataclasses.fields(Settings)}


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _coerce(name: str, raw: Any, origin: str) -> Any:
    """``raw`` as the field's type; ``origin`` (e.g. "RAG_TOP_K", "rag.toml") names it in errors."""
    kind = _FIELDS[name].type
    try:
        if kind == "Path":
            return Path(str(raw)).expanduser()
        if kind == "Path | str":
            return database_location(str(raw))
        if kind == "int":
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError(raw)
            return int(raw)
        if kind == "float":
            if isinstance(raw, bool):
                raise ValueError(raw)
            return float(raw)
        if kind == "bool":
            if isinstance(raw, bool):
                return raw
            if str(raw).strip().lower() in _TRUE | _FALSE:
                return str(raw).strip().lower() in _TRUE
            raise ValueError(raw)
    except (TypeError, ValueError):
        what = {"int": "a whole number", "float": "a number", "bool": "true or false"}.get(str(kind), str(kind))
        raise RagError(f"{name} must be {what} (got {raw!r} from {origin})") from None
    return str(raw)


def validate(settings: Settings) -> Settings:
    """Reject values that would make the pipeline misbehave, with a message saying which."""
    if settings.strategy not in {"A", "B", "C", "D", "E", "F", "R"}:
        raise RagError(f"strategy must be one of A, B, C, D, E, F, R (got {settings.strategy!r})")
    if settings.dense_mode not in {"exact", "binary", "hamming"}:
        raise RagError(f"dense_mode must be 'exact', 'binary' or 'hamming' (got {settings.dense_mode!r})")
    if settings.rerank not in {"none", "cross-encoder", "llm"}:
        raise RagError(f"rerank must be 'none', 'cross-encoder' or 'llm' (got {settings.rerank!r})")
    if settings.prompt_style not in {"auto", "instruct", "example"}:
        raise RagError(f"prompt_style must be 'auto', 'instruct' or 'example' (got {settings.prompt_style!r})")
    if settings.decision not in {"auto", "off"}:
        raise RagError(f"decision must be 'auto' or 'off' (got {settings.decision!r})")
    if not settings.answer_examiner.strip():
        raise RagError("answer_examiner must be 'off' or a language model's name or GGUF path (got '')")
    if settings.source_chars < 0:
        raise RagError(f"source_chars must be 0 (whole chunks) or more (got {settings.source_chars})")
    if settings.rewrite not in {"rules", "model", "off"}:
        raise RagError(f"rewrite must be 'rules', 'model' or 'off' (got {settings.rewrite!r})")
    if not 0.0 <= settings.fts_min_coverage <= 1.0:
        raise RagError(f"fts_min_coverage must lie in [0, 1] (got {settings.fts_min_coverage})")
    if not 0.0 <= settings.toneless_dense_share <= 1.0:
        raise RagError(f"toneless_dense_share must lie in [0, 1] (got {settings.toneless_dense_share})")
    if not 0.0 <= settings.cross_language_dense_share <= 1.0:
        raise RagError(f"cross_language_dense_share must lie in [0, 1] (got {settings.cross_language_dense_share})")
    if settings.tone_restore_depth < 0:
        raise RagError(f"tone_restore_depth must be 0 (off) or more (got {settings.tone_restore_depth})")
    if settings.chunk_tokens < 0:
        raise RagError(f"chunk_tokens must be 0 (the embedder's default budget) or more (got {settings.chunk_tokens})")
    if settings.window_chars < 0:
        raise RagError(f"window_chars must be 0 (no window vectors) or more (got {settings.window_chars})")
    if settings.fusion not in FUSIONS:
        raise RagError(f"fusion must be one of {', '.join(FUSIONS)} (got {settings.fusion!r})")
    if not 0.0 <= settings.convex_dense_share <= 1.0:
        raise RagError(f"convex_dense_share must lie in [0, 1] (got {settings.convex_dense_share})")
    if not settings.rank_model.strip():
        raise RagError("rank_model must be 'bundled', 'off' or the path of a file from `rag eval ranker` (got '')")
    if not 0.0 <= settings.window_weight <= 1.0:
        raise RagError(f"window_weight must lie in [0, 1] (got {settings.window_weight})")
    if not 0.0 <= settings.max_distance <= 2.0:
        raise RagError(f"max_distance must lie in [0, 2] (got {settings.max_distance})")
    for name in ("candidates", "top_k", "max_sources", "rrf_k", "n_ctx", "max_tokens", "embed_batch",
                 "hamming_oversample", "session_idle_minutes", "lockout_failures", "lockout_minutes"):
        if getattr(settings, name) < 1:
            raise RagError(f"{name} must be at least 1 (got {getattr(settings, name)})")
    if settings.max_document_chars < 0:
        raise RagError(f"max_document_chars must be 0 (no limit) or more (got {settings.max_document_chars})")
    if settings.audit_retention_days < 0:
        raise RagError("audit_retention_days must be 0 (keep everything) or more "
                       f"(got {settings.audit_retention_days})")
    return settings


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Build the settings: defaults <- ``rag.toml`` <- ``RAG_<FIELD>`` env vars <- overrides.

    ``config_file`` defaults to ``<data dir>/rag.toml``; a missing file is fine.
    Overrides whose value is ``None`` are ignored, so CLI flags can be passed straight in.
    """
    values: dict[str, Any] = {}
    folder = data_dir()
    if folder.exists() and not folder.is_dir():
        raise RagError(f"the data directory {folder} (RAG_DATA_DIR) is a file, not a folder: point RAG_DATA_DIR "
                       "at a folder")
    path = config_file or folder / CONFIG_FILE_NAME
    if path.is_file():
        try:
            loaded = tomllib.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:
            raise RagError(f"cannot read settings file {path}: it is not UTF-8 text ({e.reason} at byte "
                           f"{e.start}); save it as UTF-8") from e
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise RagError(f"cannot read settings file {path}: {e}") from e
        for key, raw in loaded.items():
            if key not in _FIELDS:
                raise RagError(f"unknown setting {key!r} in {path}; valid: {', '.join(sorted(_FIELDS))}")
            values[key] = _coerce(key, raw, str(path))
    for name in _FIELDS:
        env = os.environ.get(f"RAG_{name.upper()}")
        if env is not None:
            values[name] = _coerce(name, env, f"RAG_{name.upper()}")
    if "RAG_DB" in os.environ:
        values["db_path"] = database_location(os.environ["RAG_DB"])
    for key, raw in overrides.items():
        if raw is None:
            continue
        if key not in _FIELDS:
            raise RagError(f"unknown setting {key!r}")
        values[key] = _coerce(key, raw, "the command line")
    return validate(Settings(**values))


def settings_file() -> Path:
    """``<data dir>/rag.toml``, the file ``load_settings`` reads and ``write_settings`` writes."""
    return data_dir() / CONFIG_FILE_NAME


def env_overrides() -> list[str]:
    """The settings an environment variable sets: a value written to the file is then not the one in force."""
    return [name for name in _FIELDS if f"RAG_{name.upper()}" in os.environ]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value), ensure_ascii=False)  # a JSON string is a TOML basic string


def _check_language_models(values: dict[str, Any]) -> None:
    """The language models named by settings about to be saved exist: a registered name
    ("qwen-0.5b", "gemma") or a GGUF file. Saved unchecked, a typo failed every question after."""
    from rag import registry  # here: loading settings must not import the model registry

    named = {"llm_path": values.get("llm_path", ""), "answer_examiner": values.get("answer_examiner", "off")}
    for key, name in named.items():
        if not name or (key == "answer_examiner" and name == "off"):
            continue
        looks_like_path = "/" in name or "\\" in name or name.lower().endswith(".gguf")
        if looks_like_path and not Path(name).expanduser().is_file():
            raise RagError(f"{key}: no GGUF model file at {name}")
        try:
            registry.resolve(registry.LANGUAGE_MODEL, name)
        except RagError as e:
            raise RagError(f"{key}: {e}") from e


def write_settings(changes: dict[str, Any], path: Path | None = None) -> Path:
    """Merge ``changes`` into the settings file and write it, once the result is known to be valid.

    A value of ``None`` removes the setting (its default applies again). Nothing is written when
    a name is unknown or a value is refused (the ``RagError`` says which); the file is replaced
    atomically, so a reader never sees half of it. Comments in the file are not kept.

    Returns:
        The file written (default ``<data dir>/rag.toml``).

    Raises:
        RagError: an unknown setting, an invalid value, a language model path that is no file,
            or a file that cannot be read or written.
    """
    path = path or settings_file()
    current: dict[str, Any] = {}
    if path.is_file():
        try:
            current = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise RagError(f"cannot read settings file {path}: {e}") from e
    for key, value in changes.items():
        if key not in _FIELDS:
            raise RagError(f"unknown setting {key!r}; valid: {', '.join(sorted(_FIELDS))}")
        if value is None:
            current.pop(key, None)
        else:
            current[key] = value
    coerced = {key: _coerce(key, raw, str(path)) for key, raw in current.items() if key in _FIELDS}
    validate(Settings(**coerced))
    _check_language_models(coerced)
    lines = ["# rag-desk settings (written by the Settings page; see docs/guide/configuration.md)"]
    lines += [f"{key} = {_toml_value(coerced[key])}" for key in _FIELDS if key in coerced]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text("\n".join(lines) + "\n", encoding="utf-8")
        os.replace(temporary, path)
    except OSError as e:
        raise RagError(f"cannot write settings file {path}: {e}") from e
    return path
