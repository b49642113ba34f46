"""Ask a question: retrieve -> (rerank) -> gate -> generate -> verify, timed stage by stage.

``ask()`` returns an ``Answer``; ``ask_stream()`` yields a ``Retrieved`` event once the gate has
run (the sources, before the model writes), the answer's verified sentences as text while the
model writes, then the final ``Answer``. Both share one code path, so what streams is
exactly the shown text of the final answer (with the default settings). Unverified model text is
never yielded: a sentence is released only once it is complete, cited and supported.

The retrieval call, the reranker, the embedder and the language model are injectable seams, so
tests run the whole path with fakes. Generation and verification are ``rag.generate.answer_stream``,
the one generate -> verify loop; reranking is ``rag.rerank.rerank_hits``, the one rerank stage.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rag import decide, gate, retrieval, store
from rag.config import Settings, load_settings
from rag.embedding import Embedder
from rag.examine import examine_answer
from rag.generate import answer_stream, start_generation
from rag.llm import LanguageModel
from rag.records import Answer, Hit, Retrieved
from rag.rerank import Reranker, rerank_hits
from rag.resources import Resources
from rag.retrieval import check_query, question_spelling, search
from rag.text import detect_language, keywords
from rag.translate import ModelTranslator
from rag.verify import declined, extractive

SearchFn = Callable[..., list[Hit]]  # rag.retrieval.search's signature
# timings_ms keys, in pipeline order; first_token and first_text count from the question's arrival.
TIMING_ORDER = (
    "retrieve", "rerank", "gate", "first_token", "first_text", "generate", "verdict", "verify", "examine", "total",
)


def ask(
    question: str,
    *,
    db: str | Path | None = None,
    conn: store.Connection | None = None,
    settings: Settings | None = None,
    groups: Sequence[str] = ("all",),
    collection: str | None = None,
    embedder: Embedder | None = None,
    llm: LanguageModel | None = None,
    search_fn: SearchFn | None = None,
    reranker: Reranker | None = None,
    generate: bool = True,
    language: str | None = None,
    resources: Resources | None = None,
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
        llm: a ``rag.llm.LanguageModel`` (default: ``resources.language_model()``, or a model
            loaded for this call and closed after it); it is only loaded when the gate lets
            something through (or an LLM reranker needs it). It serialises its own calls, so one
            model may serve many threads.
        search_fn: the retrieval function (default ``rag.retrieval.search``).
        reranker: a ``rag.rerank.Reranker``, used whenever given (even when ``settings.rerank`` is
            "none"); when None, the one ``settings.rerank`` names, if any.
        generate: False skips the model and answers with the extractive quote.
        language: "en" or "vi", the language to answer in (default: detected from ``question``;
            a chat passes the language of what the reader typed when it searches a rewritten
            question).
        resources: the ``rag.resources.Resources`` that own the models and the Hamming code
            cache (a CLI command's, the app's); None = what this call loads, it closes.

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
        llm=llm, search_fn=search_fn, reranker=reranker, generate=generate, language=language,
        resources=resources,
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
    llm: LanguageModel | None = None,
    search_fn: SearchFn | None = None,
    reranker: Reranker | None = None,
    generate: bool = True,
    language: str | None = None,
    resources: Resources | None = None,
) -> Iterator[str | Retrieved | Answer]:
    """Like ``ask()``, but yield the gated sources, then text as verified sentences become
    available, then the ``Answer``.

    The first item is a ``Retrieved`` (the gate's kept and dropped hits), before the model is
    called: a page can show the sources at once. Every ``str`` item is a piece of the answer
    text (a supported sentence with its leading separator); joined, they equal ``Answer.text``
    of an ``answered`` answer when ``show_unsupported`` is off. An ``extractive`` or
    ``no_answer`` answer streams no text. The last item is always the ``Answer``, which is
    authoritative. Exhaust or close the iterator:
    the model is busy (its lock held) while it generates.
    """
    started = time.perf_counter()
    settings = settings or (resources.settings if resources is not None else load_settings(db_path=db))
    own_resources = resources is None  # models loaded for this call only are closed with it
    owned = Resources(settings) if resources is None else resources
    own_conn = conn is None
    if conn is None:
        conn = store.open_db(db or settings.db_path)
    try:
        yield from _ask_stream(
            question, conn=conn, settings=settings, groups=groups, collection=collection or settings.collection,
            embedder=embedder, llm=llm, search_fn=search_fn, reranker=reranker, generate=generate, started=started,
            language=language, resources=owned,
        )
    finally:
        if own_conn:
            conn.close()
        if own_resources:
            owned.close()


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
    llm: LanguageModel | None,
    search_fn: SearchFn | None,
    reranker: Reranker | None,
    generate: bool,
    started: float,
    language: str | None,
    resources: Resources,
) -> Iterator[str | Retrieved | Answer]:
    timings: dict[str, float] = {}
    coll = store.get_collection(conn, collection)
    if embedder is None:
        embedder = resources.collection_embedder(conn, collection)
    def language_model(*_: Any) -> LanguageModel:
        return llm if llm is not None else resources.language_model(settings.llm_path)

    translator: ModelTranslator | None = None
    if search_fn is None:  # without generation no model is loaded, so the question is searched as typed
        if generate and settings.translate_questions:
            translator = resources.translator() if llm is None else ModelTranslator(language_model)
        search_fn = functools.partial(search, hamming_cache=resources.hamming_cache, translator=translator)

    # --- retrieve (and rerank)
    reranking = reranker is not None or settings.rerank != "none"
    wanted = max(settings.top_k, settings.rerank_depth) if reranking else settings.top_k
    clock = time.perf_counter()
    hits = search_fn(
        conn, question, embedder=embedder, settings=settings, groups=tuple(groups), collection=collection,
        stage="hybrid", k=wanted,
    )
    timings["retrieve"] = _ms(clock)
    clock = time.perf_counter()
    if reranking:  # an LLM reranker built here shares the caller's model, when given
        hits = rerank_hits(check_query(question), hits, settings=settings, reranker=reranker,
                           llm_loader=language_model)
    timings["rerank"] = _ms(clock)

    # --- gate
    clock = time.perf_counter()
    threshold = gate.gate_threshold(settings, coll)
    kept, dropped = gate.apply_gate(hits, threshold, settings.max_sources)
    timings["gate"] = _ms(clock)
    spelled = question_spelling(conn, question, settings=settings, groups=tuple(groups), collection=collection)
    # Typed in Telex or VNI with the input method off, the decoded question is what was asked: the
    # answer is in its language, and the decision, the quote and the model read it, not the keystrokes
    # ("mays in bij ketj" reads as English with no word a passage holds). The answer keeps the typed one.
    understood = spelled.text if spelled.keyboard else question
    language = language or detect_language(understood)
    trace: dict[str, Any] = {
        "threshold": threshold,
        "max_sources": settings.max_sources,
        "best_distance": gate.best_distance(hits),
        "stage": "rerank" if reranking else "hybrid",
        "language": language,
    }
    if spelled.changes:
        trace["spelling"] = [list(change) for change in spelled.changes]  # searched mended (rag.spelling)
    translated = translator.translated(spelled.text) if translator is not None else None
    if translated is not None:
        trace["translation"] = translated  # also searched as (rag.translate)
    # --- decide, before the model: would answering from these passages be right?
    policy = collection_policy(conn, collection, settings, generate=generate)
    signals: decide.Signals | None = None
    if kept and policy is not None:
        signals = decision_signals(conn, understood, kept, threshold)
        p_before = policy.before.probability(decide.retrieval_only(signals))
        trace["decision"] = {"source": policy.source, "before": round(p_before, 4),
                             "before_threshold": policy.before.threshold}
        if p_before < policy.before.threshold:
            reason = f"decision {p_before:.2f} < {policy.before.threshold:.2f}"
            dropped = [dataclasses.replace(h, gated_out_reason=reason) for h in kept] + dropped
            kept = []
            message = decide.not_found_message(language)
            timings["total"] = _ms(started)
            yield Retrieved(hits=[], dropped=dropped, language=language, timings_ms=dict(timings))
            yield Answer(status="no_answer", question=question, text=message, language=language, message=message,
                         dropped=dropped, timings_ms=timings, trace=trace)
            return
    base = Answer(status="no_answer", question=question, text="", language=language, hits=kept, dropped=dropped)
    yield Retrieved(hits=kept, dropped=dropped, language=language, timings_ms=dict(timings))

    if not kept:
        message = gate.no_answer_message(language, gate.best_distance(hits), threshold)
        timings["total"] = _ms(started)
        yield dataclasses.replace(base, text=message, message=message, timings_ms=timings, trace=trace)
        return

    if not generate:
        clock = time.perf_counter()
        quote = extractive(understood, kept, embedder=embedder, language=language, why="off")
        timings["verify"] = _ms(clock)
        timings["total"] = _ms(started)
        yield _after_decision(dataclasses.replace(
            base, status=quote.status, text=quote.text, sentences=quote.sentences, citations=quote.citations,
            grounded=quote.grounded, message=quote.message, timings_ms=timings, trace=trace,
        ), policy, signals)
        return

    # --- generate, releasing verified sentences as they complete
    # Examined whenever an examiner is set, the decision off too: `rag eval answers --calibrate`
    # measures with the decision off, and its rows must carry the signal the policy will read.
    examiner = _examiner(settings, resources)
    model = language_model()
    generation = start_generation(model, understood, kept, settings=settings, language=language)
    if settings.answer_retry:  # the guard reuses the decision's signals, else reads the keywords' IDF once
        generation.no_retry = no_second_attempt(conn, understood, kept, signals)
    for item in answer_stream(model, generation, settings=settings, embedder=embedder, started=started):
        if not isinstance(item, Answer):
            yield item
            continue
        timings.update(item.timings_ms)
        item = _examined(dataclasses.replace(item, dropped=dropped, trace={**trace, **item.trace}), examiner, timings)
        timings["total"] = _ms(started)
        yield _after_decision(dataclasses.replace(
            item, question=question, timings_ms={key: timings[key] for key in TIMING_ORDER if key in timings},
        ), policy, signals)


Examiner = Callable[[str, str], float | None]  # (question, shown answer) -> yes/no log-odds


def _examiner(settings: Settings, resources: Resources) -> Examiner | None:
    """``rag.examine`` on the model ``settings.answer_examiner`` names (loaded at first use), or None."""
    if settings.answer_examiner == "off":
        return None

    def examine(question: str, text: str) -> float | None:
        return examine_answer(resources.language_model(settings.answer_examiner), question, text)

    return examine


def _examined(answer: Answer, examiner: Examiner | None, timings: dict[str, float]) -> Answer:
    """The answer with the examiner's log-odds in its trace (``lm_logodds``, a decision signal),
    when there is an examiner and something the model took part in is shown."""
    if examiner is None or answer.status == "no_answer" or not answer.llm_called:
        return answer
    clock = time.perf_counter()
    logodds = examiner(answer.question, answer.text)
    timings["examine"] = _ms(clock)
    if logodds is None:
        return answer
    # the signal slot of the writer's own verdict (lm_verdict): with both on, the examiner's is the one read
    return dataclasses.replace(answer, trace={**answer.trace, "lm_logodds": round(logodds, 4)})


def collection_policy(
    conn: store.Connection, collection: str, settings: Settings, *, generate: bool = True
) -> decide.Policy | None:
    """The collection's fitted decision (``rag eval answers --calibrate``), else the bundled one:
    fitted with the answer examiner's signal when ``settings.answer_examiner`` is on, and on
    answers made without the language model when ``generate`` is False (``decide.policy_kind``);
    None when ``settings.decision`` is "off" (the distance gate alone decides, as before)."""
    if settings.decision == "off":
        return None
    kind = decide.policy_kind(generate, settings.answer_examiner != "off")
    stored = store.get_meta(conn, decide.meta_key(collection, kind))
    if stored:
        try:
            return decide.Policy.from_json(stored)
        except (ValueError, KeyError):  # fitted by an older version with other features: use the bundled one
            pass
    return decide.bundled_policy(kind)


def decision_signals(conn: store.Connection, question: str, kept: Sequence[Hit], threshold: float) -> decide.Signals:
    """The retrieval signals of ``rag.decide`` for the gate's kept hits (best first)."""
    idf = retrieval.query_idf(conn, keywords(question))
    rare = decide.rare_half(idf)
    return decide.retrieval_signals(
        [h.distance for h in kept],
        [retrieval.keyword_coverage(h.content, idf) for h in kept],
        [retrieval.keyword_coverage(h.content, rare) for h in kept],
        kept[0].dense_rank, kept[0].sparse_rank, threshold,
    )


def no_second_attempt(
    conn: store.Connection, question: str, kept: Sequence[Hit], signals: decide.Signals | None = None
) -> str:
    """Why a first reply with no verified sentence over ``kept`` must not be tried again
    (``Generation.no_retry``), "" when it may: none of the kept passages holds a word of the
    question. On the visible golden sets the only second reply that verified over such passages
    answered a question the documents do not (README, "A second attempt")."""
    coverage = (signals or decision_signals(conn, question, kept, 1.0)).coverage  # the threshold only scales the gap
    return "" if coverage > 0 else "no kept passage holds a word of the question"


def written_sentences(answer: Answer) -> tuple[int, int]:
    """(sentences the model wrote, of them verified), from the verification trace; (0, 0) without a model."""
    if not answer.llm_called:
        return 0, 0
    return int(answer.trace.get("sentences_written", 0)), int(answer.trace.get("sentences_supported", 0))


def answer_signals(answer: Answer, retrieval_part: decide.Signals) -> decide.Signals:
    """``retrieval_part`` completed with what the language model did (its refusal, the verified share)."""
    written, supported = written_sentences(answer)
    refused = float(answer.llm_called and declined(str(answer.trace.get("raw", ""))))
    logodds = decide.clip_logodds(answer.trace.get("lm_logodds")) if answer.llm_called else 0.0
    return dataclasses.replace(retrieval_part, lm_refused=refused, lm_logodds=logodds,
                               verified=supported / written if written else 0.0)


def _after_decision(answer: Answer, policy: decide.Policy | None, signals: decide.Signals | None) -> Answer:
    """The ``after`` model's verdict on what would be shown (verified model sentences, or a quote):
    shown when it is confident the answer is right, else *not found* (the passages stay, folded,
    as the closest). The ``before`` model has already refused most questions the documents do not
    answer, so a streamed answer is rarely taken back here."""
    if policy is None or signals is None or answer.status == "no_answer":
        return answer
    full = answer_signals(answer, signals)
    p_after = policy.after.probability(full)
    trace = {**answer.trace, "decision": {**answer.trace.get("decision", {}), "after": round(p_after, 4),
                                          "after_threshold": policy.after.threshold}}
    if p_after >= policy.after.threshold:
        return dataclasses.replace(answer, trace=trace)
    reason = f"decision {p_after:.2f} < {policy.after.threshold:.2f}"
    message = decide.not_found_message(answer.language)
    return dataclasses.replace(
        answer, status="no_answer", text=message, message=message, citations=[], sentences=[], grounded=False,
        hits=[], dropped=[dataclasses.replace(h, gated_out_reason=reason) for h in answer.hits] + answer.dropped,
        trace=trace,
    )


__all__ = [
    "answer_signals", "ask", "ask_stream", "collection_policy", "decision_signals", "no_second_attempt",
    "written_sentences",
]
