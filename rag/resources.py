"""``Resources``: what one CLI command or one Streamlit process holds open, and closes.

Built from ``Settings``, it owns the connection factory, the models loaded so far (through
``rag.registry``, each loaded once and kept by id) and the in-memory Hamming codes of the fast
dense path (``rag.retrieval.HammingCache``). ``close()`` closes the models that can be closed
(``rag.llm.LanguageModel.close``) and empties the caches; ``with Resources(settings) as resources:``
does it on exit. The CLI builds one per command; the app caches one per ``Settings``
(``rag.ui.resources``).

Connections are not kept: ``connect()`` opens a new one each call, because a
``sqlite3.Connection`` is bound to the thread that made it and the app runs on many threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any

from rag import registry, store
from rag.config import Settings

if TYPE_CHECKING:
    from rag.embedding import Embedder
    from rag.rerank import Reranker
    from rag.retrieval import HammingCache
    from rag.translate import ModelTranslator


class Resources:
    """Connections, loaded models and the Hamming code cache for one set of ``Settings``.

    Thread-safe: the app shares one across session threads, so model loads run under a lock (a
    model is never built twice); a ``rag.llm.LanguageModel`` holds its own lock around each call.
    """

    def __init__(self, settings: Settings) -> None:
        from rag.retrieval import HammingCache  # here: `rag status` need not import the retrieval stack

        self.settings = settings
        self.hamming_cache: HammingCache = HammingCache()
        self._models: dict[tuple[str, str], Any] = {}  # (kind, model id or name asked for) -> model
        self._lock = threading.RLock()
        self._translator: ModelTranslator | None = None

    # --- connections

    def connect(self, *, create: bool = False) -> store.Connection:
        """A new migrated connection to ``settings.db_path``; the caller closes it.

        Only commands that write documents (ingest, demo) pass ``create``: a read-only command
        never creates a database or its folder (``store.open_db``).
        """
        return store.open_db(self.settings.db_path, create=create)

    @contextmanager
    def connection(self, *, create: bool = False) -> Iterator[store.Connection]:
        """``connect()``, closed on exit."""
        conn = self.connect(create=create)
        try:
            yield conn
        finally:
            conn.close()

    # --- models

    def _cached(self, kind: str, name: str, load: Callable[[], Any], model_id: Callable[[Any], str]) -> Any:
        with self._lock:
            found = self._models.get((kind, name))
            if found is None:
                found = load()
                self._models[(kind, name)] = found
                self._models.setdefault((kind, model_id(found)), found)  # asked by its id later: the same model
            return found

    def has_model(self, name: str, kind: str = "embedder") -> bool:
        """Whether a model was already loaded under ``name`` (an id or a name asked for before)."""
        with self._lock:
            return (kind, name) in self._models

    def embedder(self, name: str) -> Embedder:
        """The embedder named by an id, alias or directory, loaded once (``rag.registry``)."""
        embedder: Embedder = self._cached(
            registry.EMBEDDER, name, lambda: registry.load_embedder(name, threads=self.settings.threads),
            lambda model: model.model_id,
        )
        return embedder

    def collection_embedder(self, conn: store.Connection, collection: str | None = None) -> Embedder:
        """The embedding model a collection was built with (never another one)."""
        return self.embedder(store.require_collection(conn, collection or self.settings.collection).embedder)

    def language_model(self, name: str | None = None) -> Any:
        """The GGUF model (default ``settings.llm_path``; empty = bundled Gemma), loaded once."""
        wanted = self.settings.llm_path if name is None else name
        info = registry.resolve(registry.LANGUAGE_MODEL, wanted)
        settings = self.settings
        return self._cached(
            registry.LANGUAGE_MODEL, info.id,
            lambda: info.factory(n_ctx=settings.n_ctx, threads=settings.threads, seed=settings.seed),
            lambda model: info.id,
        )

    def reranker(self, settings: Settings | None = None) -> Reranker:
        """The reranker named by ``settings.rerank`` (default: these resources' settings); the "llm"
        reranker reads with ``language_model()``, so it is closed with the other models."""
        settings = settings or self.settings
        return registry.load_reranker(settings, llm_loader=lambda *_: self.language_model(settings.llm_path))

    def translator(self) -> ModelTranslator:
        """The question translator on ``language_model()`` (``rag.translate``), one per resources so
        its cache lasts as long as the models; the model loads at the first question it translates."""
        from rag.translate import ModelTranslator  # here: loads the prompt machinery of rag.generate

        with self._lock:
            if self._translator is None:
                self._translator = ModelTranslator(lambda: self.language_model(self.settings.llm_path))
            return self._translator

    # --- lifetime

    def close(self) -> None:
        """Close every loaded model that has ``close()`` and empty the caches; safe to call twice."""
        with self._lock:
            models = list({id(m): m for m in self._models.values()}.values())
            self._models.clear()
        self.hamming_cache.clear()
        for model in models:
            close = getattr(model, "close", None)
            if callable(close):
                close()

    def __enter__(self) -> Resources:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()
