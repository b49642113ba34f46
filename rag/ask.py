"""Ask a question: retrieve -> (rerank) -> gate -> generate -> verify, timed stage by stage.

``ask()`` returns an ``Answer``; ``ask_stream()`` yields the answer's verified sentences as text
while the model writes, then the final ``Answer``. Both share one code path, so what streams is
exactly the shown text of the final answer (with the default settings). Unverified model text is
never yielded: a sentence is released only once it is complete, cited and supported.

The retrieval call, the reranker, the embedder and the LLM are injectable seams, so tests run
the whole path with fakes.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from rag import gate, store
from rag.config import Settings, load_settings
from rag.embedding import Embedder, load_embedder
from rag.models import Answer, Hit
from rag.text import detect_language
from rag.verify import draft_answer, extractive, judge_sentences, shown_piece, verify_answer

SearchFn = Callable[..., list[Hit]]  # rag.retrieval.search's signature
# While streaming, a sentence is judged once the sentence after the next one has begun: markers
# that open a sentence may still move to the one before it (see verify.raw_sentences).
STREAM_LAG = 2
# timings_ms keys, in pipeline order; first_token and first_text count from the question's arrival.
TIMING_ORDER = ("retrieve", "rerank", "gate", "first_token", "first_text", "generate", "verify", "total")


def ask(
    question: str,
    *,
    db: str | Path | None = None,
    conn: store.Connection | None = None,
    settings: Settings | None = None,
    groups: Sequence[str] = ("all",),
    collection: str | None = None,
    embedder: Embedder | None = None,
    llm: Any = None,
    lock: AbstractContextManager[Any] | None = None,
    search_fn: SearchFn | None = None,
    reranker: Any = None,
    generate: bool = True,
) -> Answer:
    """Answer ``question`` from the documents a reader holding ``groups`` may see.

    Args:
        question: the question, in English or Vietnamese.
        db: database file (default ``settings.db_path``); ignored when ``conn`` is given.
        conn: an open connection (not closed here).
        settings: the settings (default: ``load_settings(db_path=db)``).
        groups: the reader's access groups.
        collection: the collection to search (default ``settings.collection``).
        embedder: the collection's embedding model (loaded from the collection's stamp when None).
        llm: a ``llama_cpp.Llama`` (default: built once per process from ``settings``); it is only
            loaded when the gate lets something through.
        lock: held around every model call when the ``llm`` is shared between threads.
        search_fn: the retrieval function (default ``rag.retrieval.search``).
        reranker: a ``rag.rerank.Reranker`` (built from settings when reranking and None).
        generate: False skips the model and answers with the extractive quote.

    Returns:
        An ``Answer``: ``no_answer`` (the gate refused, the model was not called), ``answered``
        (only cited, supported sentences) or ``extractive`` (a quote of the best source).

    Raises:
        QueryError: empty question. NotFoundError: unknown collection. ModelLoadError: a model
        cannot be loaded. IndexMismatchError: the embedder is not the collection's model.
    """
    final: Answer | None = None
    for item in ask_stream(
        question, db=db, conn=conn, settings=settings, groups=groups, collection=collection, embedder=embedder,
        llm=llm, lock=lock, search_fn=search_fn, reranker=reranker, generate=generate,
    ):
        if isinstance(item, Answer):
            final = item
    if final is None:  # pragma: no cover - ask_stream always ends with an Answer
        raise RuntimeError("ask_stream ended without an answer")
    return final


def ask_stream(
    question: str,
    *,
    db: str | Path | None = None,
    conn: store.Connection | None = None,
    settings: Settings | None = None,
    groups: Sequence[str] = ("all",),
    collection: str | None = None,
    embedder: Embedder | None = None,
    llm: Any = None,
    lock: AbstractContextManager[Any] | None = None,
    search_fn: SearchFn | None = None,
    reranker: Any = None,
    generate: bool = True,
) -> Iterator[str | Answer]:
    """Like ``ask()``, but yield text as verified sentences become available, then the ``Answer``.

    Every ``str`` item is a piece of the answer text (a supported sentence with its leading
    separator); joined, they equal ``Answer.text`` of an ``answered`` answer when
    ``show_unsupported`` is off. An ``extractive`` or ``no_answer`` answer streams no text. The
    last item is always the ``Answer``, which is authoritative. Exhaust or close the iterator:
    the model's lock is held while it generates.
    """
    started = time.perf_counter()
    settings = settings or load_settings(db_path=db)
    own_conn = conn is None
    if conn is None:
        conn = store.open_db(db or settings.db_path)
    try:
        yield from _ask_stream(
            question, conn=conn, settings=settings, groups=groups, collection=collection or settings.collection,
            embedder=embedder, llm=llm, lock=lock, search_fn=search_fn, reranker=reranker, generate=generate,
            started=started,
        )
    finally:
        if own_conn:
            conn.close()


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 1)


def _ask_stream(
    question: str,
    *,
    conn: store.Connection,
    settings: Settings,
    groups: Sequence[str],
    collection: str,
    embedder: Embedder | None,
    llm: Any,
    lock: AbstractContextManager[Any] | None,
    search_fn: SearchFn | None,
    reranker: Any,
    generate: bool,
    started: float,
) -> Iterator[str | Answer]:
    timings: dict[str, float] = {}
    language = detect_language(question)
    coll = store.get_collection(conn, collection)
    if embedder is None:
        from rag.ingest import spec_for_model_id

        model_id = store.require_collection(conn, collection).embedder
        embedder = load_embedder(spec_for_model_id(model_id), settings.threads)
    if search_fn is None:
        from rag.retrieval import search

        search_fn = search

    # --- retrieve (and rerank)
    reranking = settings.rerank != "none"
    wanted = max(settings.top_k, settings.rerank_depth) if reranking else settings.top_k
    clock = time.perf_counter()
    hits = search_fn(
        conn, question, embedder=embedder, settings=settings, groups=tuple(groups), collection=collection,
        stage="hybrid", k=wanted,
    )
    timings["retrieve"] = _ms(clock)
    clock = time.perf_counter()
    if reranking:
        from rag.generate import shared_llm
        from rag.rerank import load_reranker
        from rag.retrieval import check_query

        if reranker is None:  # an LLM reranker shares the caller's model and its lock, when given
            loader = shared_llm if llm is None else (lambda *_: llm)
            reranker = load_reranker(settings, llm_loader=loader, lock=lock)
        depth = settings.rerank_depth
        hits = (reranker.rank(check_query(question), hits[:depth]) + hits[depth:])[: settings.top_k]
    timings["rerank"] = _ms(clock)

    # --- gate
    clock = time.perf_counter()
    threshold = gate.gate_threshold(settings, coll)
    kept, dropped = gate.apply_gate(hits, threshold, settings.max_sources)
    timings["gate"] = _ms(clock)
    trace: dict[str, Any] = {
        "threshold": threshold,
        "max_sources": settings.max_sources,
        "best_distance": gate.best_distance(hits),
        "stage": "rerank" if reranking else "hybrid",
        "language": language,
    }
    base = Answer(status="no_answer", question=question, text="", language=language, hits=kept, dropped=dropped)

    if not kept:
        message = gate.no_answer_message(language, gate.best_distance(hits), threshold)
        timings["total"] = _ms(started)
        yield dataclasses.replace(base, text=message, message=message, timings_ms=timings, trace=trace)
        return

    if not generate:
        clock = time.perf_counter()
        quote = extractive(question, kept, embedder=embedder, language=language, why="off")
        timings["verify"] = _ms(clock)
        timings["total"] = _ms(started)
        yield dataclasses.replace(
            base, status=quote.status, text=quote.text, sentences=quote.sentences, citations=quote.citations,
            grounded=quote.grounded, message=quote.message, timings_ms=timings, trace=trace,
        )
        return

    # --- generate, releasing verified sentences as they complete
    from rag.generate import generation_trace, shared_llm, start_generation, stream_tokens

    if llm is None:
        llm = shared_llm(settings.llm_path, settings.n_ctx, settings.threads, settings.seed)
    generation_started = time.perf_counter()
    generation = start_generation(llm, question, kept, settings=settings, language=language)
    verify_ms = 0.0
    released = 0  # sentences already judged
    emitted = 0  # pieces already yielded
    tokens = stream_tokens(llm, generation.prompt, settings=settings, generation=generation, lock=lock)
    try:
        for _ in tokens:
            clock = time.perf_counter()
            drafts, _repeats = draft_answer(generation.text, len(kept))
            ready = max(0, len(drafts) - STREAM_LAG)
            pieces: list[str] = []
            if ready > released:
                judged = judge_sentences(drafts, kept, settings.support_threshold, question)
                for sentence in judged[released:ready]:
                    if sentence.supported:
                        pieces.append(shown_piece(sentence, emitted + len(pieces) == 0, strike=False))
                released = ready
            verify_ms += (time.perf_counter() - clock) * 1000
            for piece in pieces:
                emitted += 1
                timings.setdefault("first_text", _ms(started))  # the first verified sentence goes out
                yield piece
        # The stream is exhausted here; the rest is judged below with the whole text.
    finally:
        tokens.close()
    timings["generate"] = round(generation.generate_ms, 1)
    if generation.first_token_ms is not None:
        prefix_ms = (generation_started - started) * 1000
        timings["first_token"] = round(prefix_ms + generation.first_token_ms, 1)

    clock = time.perf_counter()
    verified = verify_answer(
        question, generation.text, kept, support_threshold=settings.support_threshold,
        show_unsupported=settings.show_unsupported, embedder=embedder, language=language,
    )
    if verified.status == "answered" and not settings.show_unsupported:
        # Release the sentences the stream had not judged yet (the last STREAM_LAG of them).
        pieces = [shown_piece(s, i == 0, strike=False) for i, s in enumerate(verified.sentences)]
        if len(pieces) > emitted:
            timings.setdefault("first_text", _ms(started))
        yield from pieces[emitted:]
    timings["verify"] = round(verify_ms + (time.perf_counter() - clock) * 1000, 1)
    timings["total"] = _ms(started)
    timings = {key: timings[key] for key in TIMING_ORDER if key in timings}
    trace.update(generation_trace(llm, generation, settings))
    trace.update(verified.trace)
    yield dataclasses.replace(
        base, status=verified.status, text=verified.text, sentences=verified.sentences,
        citations=verified.citations, grounded=verified.grounded, llm_called=True, message=verified.message,
        timings_ms=timings, trace=trace,
    )


__all__ = ["ask", "ask_stream"]
