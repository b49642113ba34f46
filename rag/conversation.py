"""A conversation on the Ask page: follow-up questions made standalone, and chats kept in the database.

A follow-up such as "And which port does it use by default?" means nothing to retrieval on its
own: its words point back at the previous question. ``standalone_question`` turns it into a
question that can be searched:

- ``rules`` (always available, ~0.1 ms): a question that opens like a follow-up ("and", "what
  about", Vietnamese "còn", "vậy" ...), a short one that refers back ("Can I change it?", "nó",
  "đó" ...) or one with no content word at all ("Why?") gets the previous question's content
  words appended, e.g.
  "Which port does it use by default? (start app another)". The reader sees what was searched.
- ``model``: the language model rewrites it (``rag/prompts/rewrite.txt``, greedy, at most
  ``REWRITE_MAX_TOKENS`` tokens); an empty, overlong or echoed rewrite falls back to the rules.

Chats are stored per collection in ``chat_turns`` (db/migrations/0006_chat.sql): the question
as typed, the question searched, the ``Answer`` as JSON and the reader's groups, so a reload
shows the same conversation. ``user_id`` is NULL in desktop mode (one person per database).
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rag import access, store
from rag.generate import prompt_parts, render
from rag.llm import LanguageModel, complete_line
from rag.records import Answer, Citation, Hit, Sentence
from rag.text import content_tokens, detect_language, fold

REWRITE_METHODS = ("rules", "model", "off")
REWRITE_MAX_TOKENS = 40  # a standalone question is one short line
MAX_ADDED_TERMS = 8  # content words of the previous question appended by the rules
HISTORY_TURNS = 3  # earlier questions shown to the model
MAX_FOLLOW_UP_WORDS = 2  # a question with a pronoun and at most this many content words is a follow-up

# Openers of a follow-up, lower case. Vietnamese typed without tones is matched in folded form,
# only when the question is Vietnamese ("con", "va" are English-looking otherwise).
_OPENERS_EN = ("and", "also", "what about", "how about", "what if", "then", "so", "but", "or")
_OPENERS_VI = ("thế còn", "vậy còn", "còn", "vậy", "thế", "và", "rồi")
_OPENERS_VI_TONELESS = ("the con", "vay con", "con", "vay", "va", "roi")
# Words that point back at something said before.
_ANAPHORS_EN = frozenset(["it", "its", "it's", "that", "this", "these", "those", "they", "them", "their", "there",
                          "he", "she", "him", "her"])
_ANAPHORS_VI = frozenset(["nó", "đó", "đấy", "này", "kia", "ấy", "chúng", "họ"])
_ANAPHORS_VI_TONELESS = frozenset(["no", "do", "day", "nay", "kia", "ay"])
_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)?")


@dataclass(frozen=True, slots=True)
class Rewrite:
    """What the reader typed, and what was searched for it."""

    question: str  # as typed
    searched: str  # the standalone question (== question when nothing was rewritten)
    method: str  # "none" (standalone already) | "rules" | "model"
    ms: float  # time spent rewriting
    language: str = "en"  # the language of what was typed: the answer's language
    note: str = ""  # why the model's rewrite was not used, when it was not


def _opener(question: str, language: str) -> str | None:
    """The follow-up opener ``question`` starts with, as written, or None."""
    lowered = question.strip().casefold()
    candidates: list[tuple[str, str]] = [(o, lowered) for o in _OPENERS_EN]
    if language == "vi":
        candidates += [(o, lowered) for o in _OPENERS_VI] + [(o, fold(lowered)) for o in _OPENERS_VI_TONELESS]
    for opener, text in candidates:
        if text == opener or (text.startswith(opener) and not text[len(opener)].isalnum()):
            return question.strip()[: len(opener)]
    return None


def is_follow_up(question: str, language: str | None = None) -> bool:
    """``question`` leans on an earlier one: it opens like a follow-up, refers back, or has no content word."""
    language = language or detect_language(question)
    if _opener(question, language) is not None:
        return True
    words = {w.casefold() for w in _WORD.findall(question)}
    anaphors = set(_ANAPHORS_EN)
    if language == "vi":
        anaphors |= _ANAPHORS_VI | _ANAPHORS_VI_TONELESS
    content = content_tokens(question)
    # A pronoun alone does not make a follow-up: in "Where does the desk keep its database?" it
    # points inside the question. Only a short question ("Can I change it?") leans on the last one.
    if words & anaphors and len(content) <= MAX_FOLLOW_UP_WORDS:
        return True
    return not content


def rewrite_by_rules(question: str, previous: str, language: str | None = None) -> str:
    """The follow-up without its opener, with the previous question's content words appended.

    "And which port does it use by default?" after "How do I start the app on another port?" ->
    "Which port does it use by default? (start app another)".
    """
    language = language or detect_language(question)
    body = question.strip()
    opener = _opener(body, language)
    if opener is not None:
        rest = body[len(opener):].lstrip(" ,;:-–—")
        body = rest[:1].upper() + rest[1:] if rest else body
    have = {fold(t) for t in content_tokens(body)}
    added = [t for t in content_tokens(previous) if fold(t) not in have][:MAX_ADDED_TERMS]
    return f"{body} ({' '.join(added)})" if added else body


def _prompt_parts() -> dict[str, str]:
    return prompt_parts("rewrite", ("instruction", "example_conversation", "example_question", "example_answer"))


def rewrite_messages(question: str, previous: Sequence[str]) -> list[dict[str, str]]:
    """The rewrite prompt: the instruction with a worked example, then the real conversation."""
    parts = _prompt_parts()
    conversation = "\n".join(f"Q: {q.strip()}" for q in previous[-HISTORY_TURNS:])
    return [
        {"role": "user", "content": render(parts["instruction"], conversation=parts["example_conversation"],
                                           question=parts["example_question"])},
        {"role": "assistant", "content": parts["example_answer"]},
        {"role": "user", "content": render(parts["instruction"], conversation=conversation,
                                           question=question.strip())},
    ]


def rewrite_with_model(llm: LanguageModel, question: str, previous: Sequence[str]) -> tuple[str | None, str]:
    """The model's standalone version of ``question`` and "" — or None and why it was refused.

    Greedy, at most ``REWRITE_MAX_TOKENS`` tokens, cut at the first line break. Refused: an
    empty line, one three times longer than question and history together, the previous
    question repeated, a line that is still a follow-up, or one sharing no content word with the
    conversation. Measured with the bundled Gemma-3-270M (base model): 0.4-0.9 s per rewrite on
    2 cores, and 3 of 5 test follow-ups refused, the other 2 garbled ("Can I ingest PDFs?
    mendatang"), which is why ``rules`` is the default.
    """
    text = complete_line(llm, rewrite_messages(question, previous), REWRITE_MAX_TOKENS)
    line = text.strip().strip("\"'“”").strip()
    if not line:
        return None, "the model wrote nothing"
    context = [question, *previous[-HISTORY_TURNS:]]
    if len(line) > 3 * sum(len(q) for q in context):
        return None, "the model's rewrite was too long"
    if previous and fold(line).rstrip("?. ") == fold(previous[-1]).rstrip("?. "):
        return None, "the model repeated the previous question"
    if is_follow_up(line):
        return None, "the model's rewrite still leans on the conversation"
    known = {fold(t) for q in context for t in content_tokens(q)}
    if not {fold(t) for t in content_tokens(line)} & known:
        return None, "the model's rewrite shares no word with the conversation"
    return line, ""


def standalone_question(
    question: str,
    previous: Sequence[str],
    *,
    method: str = "rules",
    llm: LanguageModel | None = None,
) -> Rewrite:
    """``question`` made standalone from the earlier questions of the chat (oldest first).

    Args:
        question: what the reader typed.
        previous: the questions searched before in this chat (their standalone form).
        method: "rules", "model" (needs ``llm``; falls back to the rules) or "off".
        llm: the language model for ``method="model"``.

    Raises:
        ValueError: an unknown method.
    """
    if method not in REWRITE_METHODS:
        raise ValueError(f"rewrite must be one of {', '.join(REWRITE_METHODS)} (got {method!r})")
    started = time.perf_counter()
    language = detect_language(question)
    if method == "off" or not previous or not is_follow_up(question, language):
        return Rewrite(question, question, "none", _ms(started), language)
    note = ""
    if method == "model" and llm is not None:
        rewritten, note = rewrite_with_model(llm, question, previous)
        if rewritten is not None:
            return Rewrite(question, rewritten, "model", _ms(started), language)
    return Rewrite(question, rewrite_by_rules(question, previous[-1], language), "rules", _ms(started), language,
                   note)


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 2)


# ---------------------------------------------------------------------------------------------
# Example questions for an empty chat

DEMO_TITLE = "Welcome to the Ask Your Documents desk"  # docs/guide/index.md: the demo corpus is indexed
DEMO_EXAMPLES = (
    "How do I start the app on another port?",
    "What happens when nothing in my documents matches the question?",
    "Bàn hỏi đáp có cần mạng không?",  # the demo guide has a Vietnamese part (docs/guide/vi)
)


def example_questions(conn: store.Connection, collection: str, groups: Sequence[str], k: int = 3) -> list[str]:
    """``k`` questions the reader could ask of ``collection``, from documents they may read.

    The demo corpus gets questions it answers; another collection one question per document
    about its first section ("What does “Leave policy” say about Carrying days over?").
    """
    documents = access.readable_documents(conn, collection, groups)
    if any(row["title"] == DEMO_TITLE for row in documents):
        return list(DEMO_EXAMPLES[:k])
    questions: list[str] = []
    seen: set[int] = set()
    for row in access.readable_chunks(conn, groups, collection=collection):
        section = (row["section"] or "").split(" > ")[-1].strip()
        if row["document_id"] in seen or not section or section == row["title"]:
            continue
        seen.add(row["document_id"])
        questions.append(f"What does “{row['title'] or row['source']}” say about {section}?")
        if len(questions) == k:
            break
    return questions


# ---------------------------------------------------------------------------------------------
# Answers as JSON


def answer_to_json(answer: Answer) -> str:
    """The whole ``Answer`` (hits, citations, sentences, timings, trace) as a JSON object."""
    return json.dumps(dataclasses.asdict(answer), ensure_ascii=False, default=str)


def _build(cls: Any, values: dict[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})  # a field added later is simply absent


def answer_from_json(text: str) -> Answer:
    """The ``Answer`` that ``answer_to_json`` wrote."""
    raw = json.loads(text)
    raw["citations"] = [_build(Citation, c) for c in raw.get("citations", [])]
    raw["sentences"] = [_build(Sentence, s) for s in raw.get("sentences", [])]
    raw["hits"] = [_build(Hit, h) for h in raw.get("hits", [])]
    raw["dropped"] = [_build(Hit, h) for h in raw.get("dropped", [])]
    answer: Answer = _build(Answer, raw)
    return answer


# ---------------------------------------------------------------------------------------------
# Chats in the database


@dataclass(frozen=True, slots=True)
class Turn:
    """One question of a chat and its answer."""

    id: int
    collection: str
    chat_id: str
    question: str  # as typed
    searched: str  # the standalone question that was searched
    answer: Answer
    groups: list[str]  # the reader's groups when it was asked (the answer's links carry them)
    created_at: str
    user_id: int | None = None


INSERT_TURN_SQL = """
INSERT INTO chat_turns (collection, chat_id, user_id, question, searched, answer, groups)
VALUES (:collection, :chat_id, :user_id, :question, :searched, :answer, :groups)
"""
CHAT_TURNS_SQL = """
SELECT * FROM chat_turns
WHERE collection = :collection AND chat_id = :chat_id AND {same_user}
ORDER BY id
"""
LATEST_CHAT_SQL = """
SELECT chat_id FROM chat_turns WHERE collection = :collection AND {same_user} ORDER BY id DESC LIMIT 1
"""
# The chat's user, or no user (desktop mode): SQLite's `IS` compares NULLs as equal; PostgreSQL's
# `IS` takes only NULL, TRUE or FALSE, and its IS NOT DISTINCT FROM no index serves. With the value
# inlined (rag.pg binds on the client) this form folds to `user_id = 5` or `user_id IS NULL`, both
# served by chat_turns_chat.
SAME_USER = {"sqlite": "user_id IS :user_id",
             "postgres": "(user_id = :user_id OR (:user_id IS NULL AND user_id IS NULL))"}


def _same_user(conn: store.Connection) -> str:
    return SAME_USER["postgres" if store.is_postgres(conn) else "sqlite"]
DELETE_TURN_SQL = "DELETE FROM chat_turns WHERE id = :id"


def new_chat_id() -> str:
    return uuid.uuid4().hex[:16]


def save_turn(
    conn: store.Connection,
    *,
    collection: str,
    chat_id: str,
    question: str,
    searched: str,
    answer: Answer,
    groups: Sequence[str],
    user_id: int | None = None,
) -> int:
    """Store one answered question; returns its id."""
    with store.transaction(conn):
        cursor = conn.execute(INSERT_TURN_SQL, {
            "collection": collection, "chat_id": chat_id, "user_id": user_id, "question": question,
            "searched": searched, "answer": answer_to_json(answer), "groups": json.dumps(list(groups)),
        })
    return int(cursor.lastrowid or 0)


def chat_turns(conn: store.Connection, collection: str, chat_id: str, user_id: int | None = None) -> list[Turn]:
    """The turns of one chat, oldest first."""
    rows = conn.execute(CHAT_TURNS_SQL.format(same_user=_same_user(conn)),
                        {"collection": collection, "chat_id": chat_id, "user_id": user_id})
    return [
        Turn(r["id"], r["collection"], r["chat_id"], r["question"], r["searched"], answer_from_json(r["answer"]),
             list(json.loads(r["groups"])), r["created_at"], r["user_id"])
        for r in rows.fetchall()
    ]


def latest_chat_id(conn: store.Connection, collection: str, user_id: int | None = None) -> str | None:
    """The chat of ``collection`` asked in last, or None when there is none."""
    row = conn.execute(LATEST_CHAT_SQL.format(same_user=_same_user(conn)),
                       {"collection": collection, "user_id": user_id}).fetchone()
    return None if row is None else str(row["chat_id"])


def delete_turn(conn: store.Connection, turn_id: int) -> None:
    with store.transaction(conn):
        conn.execute(DELETE_TURN_SQL, {"id": turn_id})


def visible_to(turn: Turn, groups: Sequence[str]) -> bool:
    """A turn asked by a reader holding more groups than ``groups`` may quote what they cannot read."""
    return set(turn.groups) <= {*groups, store.PUBLIC_GROUP}


__all__ = [
    "REWRITE_MAX_TOKENS",
    "REWRITE_METHODS",
    "Rewrite",
    "Turn",
    "answer_from_json",
    "answer_to_json",
    "chat_turns",
    "delete_turn",
    "example_questions",
    "is_follow_up",
    "latest_chat_id",
    "new_chat_id",
    "rewrite_by_rules",
    "rewrite_messages",
    "rewrite_with_model",
    "save_turn",
    "standalone_question",
    "visible_to",
]
