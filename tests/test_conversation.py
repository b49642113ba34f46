"""rag.conversation: follow-ups made standalone (rules, and the model through a fake), chats stored
in the database (migration 0006_chat) and read back whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from rag import conversation, store
from rag.conversation import (
    REWRITE_MAX_TOKENS,
    answer_from_json,
    answer_to_json,
    chat_turns,
    is_follow_up,
    latest_chat_id,
    rewrite_by_rules,
    rewrite_with_model,
    save_turn,
    standalone_question,
    visible_to,
)
from rag.records import Answer, Citation, Hit, Sentence

from .conftest import SQLITE_ONLY
from .fakes import FakeLLM


@pytest.fixture
def db_path(backend_db: Path | str) -> Path | str:
    """Every test here runs on SQLite and on PostgreSQL (tests/conftest.py)."""
    return backend_db

PORT_Q = "How do I start the app on another port?"
DEFAULT_Q = "And which port does it use by default?"


# --- follow-ups


@pytest.mark.parametrize("question", [
    DEFAULT_Q, "What about Vietnamese?", "and in PDFs", "Is that the default?", "Why?", "How do they work?",
    "Còn cổng mặc định là gì?", "Nó dùng cổng nào?", "vay con cong mac dinh", "Thế còn tệp PDF?",
])
def test_follow_ups_are_recognised(question: str) -> None:
    assert is_follow_up(question)


@pytest.mark.parametrize("question", [
    PORT_Q, "What is the best recipe for a chocolate soufflé?", "Which port does the app use by default?",
    "Android phones: can I install the desk?", "Làm sao để chạy ứng dụng trên cổng khác?",
    "lam sao de chay ung dung tren cong khac", "Sort the documents by date",
    "Where does the desk keep its database?",  # "its" points inside the question
])
def test_standalone_questions_are_left_alone(question: str) -> None:
    assert not is_follow_up(question)


def test_the_rules_drop_the_opener_and_append_the_previous_questions_content_words() -> None:
    assert rewrite_by_rules(DEFAULT_Q, PORT_Q) == "Which port does it use by default? (start app another)"
    assert rewrite_by_rules("Còn cổng mặc định là gì?", "Làm sao để chạy ứng dụng trên cổng khác?") == (
        "Cổng mặc định là gì? (làm chạy ứng dụng trên khác)")
    assert rewrite_by_rules("Why?", "Why?") == "Why?"  # nothing to add


def test_standalone_question_rewrites_only_follow_ups_of_a_chat() -> None:
    first = standalone_question(PORT_Q, [])
    assert (first.searched, first.method) == (PORT_Q, "none")
    assert standalone_question(DEFAULT_Q, []).method == "none"  # nothing to lean on
    follow = standalone_question(DEFAULT_Q, [PORT_Q])
    assert follow.method == "rules" and follow.searched.startswith("Which port does it use by default?")
    assert follow.question == DEFAULT_Q and follow.ms >= 0
    assert standalone_question(DEFAULT_Q, [PORT_Q], method="off").searched == DEFAULT_Q
    with pytest.raises(ValueError, match="rewrite must be one of"):
        standalone_question(DEFAULT_Q, [PORT_Q], method="magic")


def test_the_model_rewrites_a_follow_up_greedily_in_one_short_line() -> None:
    llm = FakeLLM("Which port does the app use by default?\nQ: more")
    rewrite = standalone_question(DEFAULT_Q, [PORT_Q], method="model", llm=llm)
    assert (rewrite.searched, rewrite.method) == ("Which port does the app use by default?", "model")
    call = llm.calls[0]
    assert call["max_tokens"] == REWRITE_MAX_TOKENS and call["temperature"] == 0.0 and "\n" in call["stop"]
    prompt = llm.prompts[-1]
    assert PORT_Q in prompt and DEFAULT_Q in prompt and "can I carry them over" in prompt  # the worked example


@pytest.mark.parametrize(("reply", "why"), [
    ("", "wrote nothing"),
    (PORT_Q, "repeated the previous question"),
    ("Bananas grow on trees?", "shares no word"),
    ("Can I change it?", "still leans on the conversation"),
])
def test_a_bad_model_rewrite_falls_back_to_the_rules(reply: str, why: str) -> None:
    line, note = rewrite_with_model(FakeLLM(reply), DEFAULT_Q, [PORT_Q])
    assert line is None and why in note
    rewrite = standalone_question(DEFAULT_Q, [PORT_Q], method="model", llm=FakeLLM(reply))
    assert rewrite.method == "rules" and why in rewrite.note


# --- answers as JSON and chats in the database


def _answer() -> Answer:
    hit = Hit(5, 9, "a.md", "A", "A > B", "quoted “text”", 10, 16, None, 0.2, 1, None, None, 0.016)
    citation = Citation(1, 5, "A", "a.md", "A > B", "#char=10,16", 10, 16, None, "quoted “text”", 0.2)
    return Answer("answered", "q", "It is quoted [1].", citations=[citation],
                  sentences=[Sentence("It is quoted [1].", [1], True, 0.9)], grounded=True, llm_called=True,
                  language="vi", hits=[hit], dropped=[hit], timings_ms={"total": 3.5}, trace={"threshold": 0.675})


def test_an_answer_survives_its_json() -> None:
    answer = _answer()
    assert answer_from_json(answer_to_json(answer)) == answer


@SQLITE_ONLY  # SQLite's migration; PostgreSQL's schema: db/migrations_pg/0003_eval_runs_chat.sql
def test_migration_0006_creates_the_chat_table_with_exact_columns(conn: store.Connection) -> None:
    assert "0006_chat" in store.applied_migrations(conn)
    columns = [r["name"] for r in conn.execute("PRAGMA table_info(chat_turns)")]
    assert columns == ["id", "collection", "chat_id", "user_id", "question", "searched", "answer", "groups",
                       "created_at"]
    nullable = {r["name"]: not r["notnull"] for r in conn.execute("PRAGMA table_info(chat_turns)")}
    assert nullable["user_id"] and not nullable["question"]


def test_chats_are_kept_per_collection_in_order_and_the_latest_is_found(conn: store.Connection) -> None:
    assert latest_chat_id(conn, "default") is None
    first, second = conversation.new_chat_id(), conversation.new_chat_id()
    assert first != second
    save_turn(conn, collection="default", chat_id=first, question=PORT_Q, searched=PORT_Q, answer=_answer(),
              groups=["all"])
    turn_id = save_turn(conn, collection="default", chat_id=first, question=DEFAULT_Q, searched="Which port?",
                        answer=_answer(), groups=["all", "admin"])
    save_turn(conn, collection="other", chat_id=second, question="x", searched="x", answer=_answer(), groups=["all"])
    turns = chat_turns(conn, "default", first)
    assert [t.question for t in turns] == [PORT_Q, DEFAULT_Q] and turns[1].searched == "Which port?"
    assert turns[1].answer == _answer() and turns[1].groups == ["all", "admin"] and turns[1].user_id is None
    assert latest_chat_id(conn, "default") == first and latest_chat_id(conn, "other") == second
    conversation.delete_turn(conn, turn_id)
    assert [t.question for t in chat_turns(conn, "default", first)] == [PORT_Q]


def test_chats_are_kept_per_user_and_desktop_chats_are_nobodys(conn: store.Connection) -> None:
    from argon2 import PasswordHasher

    from rag import auth

    with pytest.MonkeyPatch.context() as patch:  # argon2 at tiny costs: only the ids matter here
        patch.setattr(auth, "PASSWORD_HASHER", PasswordHasher(time_cost=1, memory_cost=8, parallelism=1))
        ana, bo = (auth.add_user(conn, name, "long enough password").id for name in ("ana", "bo"))
    chats = {who: conversation.new_chat_id() for who in ("ana", "bo", "desk")}
    for who, user_id in (("ana", ana), ("bo", bo), ("desk", None)):
        save_turn(conn, collection="default", chat_id=chats[who], question=f"{who}?", searched=f"{who}?",
                  answer=_answer(), groups=["all"], user_id=user_id)
    assert latest_chat_id(conn, "default", ana) == chats["ana"] and latest_chat_id(conn, "default", bo) == chats["bo"]
    assert latest_chat_id(conn, "default") == chats["desk"]  # the desktop's chat, not the newest user's
    assert [t.question for t in chat_turns(conn, "default", chats["ana"], ana)] == ["ana?"]
    assert chat_turns(conn, "default", chats["ana"], bo) == [] and chat_turns(conn, "default", chats["ana"]) == []
    assert chat_turns(conn, "default", chats["desk"])[0].user_id is None


def test_a_chat_survives_reopening_the_database(db_path: Path) -> None:
    conn = store.open_db(db_path)
    chat = conversation.new_chat_id()
    save_turn(conn, collection="default", chat_id=chat, question=PORT_Q, searched=PORT_Q, answer=_answer(),
              groups=["all"])
    conn.close()
    conn = store.open_db(db_path)
    try:
        assert latest_chat_id(conn, "default") == chat
        assert chat_turns(conn, "default", chat)[0].answer.citations[0].quote == "quoted “text”"
    finally:
        conn.close()


def test_a_turn_asked_with_more_groups_is_not_shown_to_fewer(conn: store.Connection) -> None:
    chat = conversation.new_chat_id()
    save_turn(conn, collection="default", chat_id=chat, question="q", searched="q", answer=_answer(),
              groups=["all", "admin"])
    turn = chat_turns(conn, "default", chat)[0]
    assert visible_to(turn, ["all", "admin"]) and visible_to(turn, ["admin"])
    assert not visible_to(turn, ["all"])
