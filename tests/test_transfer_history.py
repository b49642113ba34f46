"""rag.transfer.copy_history (run by `rag migrate`): a collection's fitted decision, evaluation
history and chats travel with it, each chat turn with its reader; a second run copies nothing.
SQLite to SQLite and SQLite to PostgreSQL (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rag import auth, conversation, decide, history, store, transfer
from rag.cli import main
from rag.config import load_settings
from rag.golden import parse_golden
from rag.records import Answer

from .evalkit import GOLDEN, build_db, run
from .fakes import FakeEmbedder


@pytest.fixture
def source(tmp_path: Path) -> Any:
    """A desk with a collection, two evaluation runs, a fitted decision and three chat turns."""
    path = tmp_path / "src.db"
    conn = store.open_db(path)
    build_db(conn, FakeEmbedder())
    golden = parse_golden(GOLDEN, "golden_test", "f" * 64)
    settings = load_settings(db_path=path)
    for commit in ("abc123", "def456"):
        history.save_run(conn, run(conn, golden, settings, commit=commit))
    store.set_meta(conn, decide.META_KEY + "default", '{"fitted": "on this collection"}')
    store.set_meta(conn, decide.meta_key("default", "quotes"), '{"fitted": "on its quotes"}')
    alice = auth.add_user(conn, "alice", "alice-password", groups=["hr"])
    auth.add_user(conn, "bob", "bob-password")
    answer = Answer(status="answered", question="How much leave?", text="25 days [1].")
    for user_id, chat in ((None, "desk-chat"), (alice.id, "alice-chat"), (alice.id, "alice-chat")):
        conversation.save_turn(conn, collection="default", chat_id=chat, question="How much leave?",
                               searched="How much leave?", answer=answer, groups=["all"], user_id=user_id)
    yield conn
    conn.close()


def _runs(conn: Any) -> list[tuple[Any, ...]]:
    return [(r.git_commit, r.golden_hash, r.queries, r.metrics["dense"].hit_rate[4].value)
            for r in history.list_runs(conn, golden_name="golden_test")]


def test_history_travels_with_its_collection_and_readers(source: Any, backend_db: Path | str) -> None:
    dest = store.open_db(backend_db)
    try:
        transfer.copy_collections(source, dest)
        auth.copy_team(source, dest)
        copied = transfer.copy_history(source, dest, ["default"])
        assert (copied.decisions_copied, copied.runs_copied, copied.turns_copied) == (2, 2, 3) and copied.verified
        assert store.get_meta(dest, decide.META_KEY + "default") == '{"fitted": "on this collection"}'
        assert store.get_meta(dest, decide.meta_key("default", "quotes")) == '{"fitted": "on its quotes"}'
        assert _runs(dest) == _runs(source)
        newest = history.list_runs(dest, golden_name="golden_test")[0].id
        theirs = history.list_runs(source, golden_name="golden_test")[0].id
        assert history.load_report(dest, newest).to_json()["per_query"] == \
            history.load_report(source, theirs).to_json()["per_query"]  # every result, in order
        alice = auth.get_user(dest, "alice")
        assert alice is not None
        turns = conversation.chat_turns(dest, "default", "alice-chat", alice.id)
        assert [t.answer.text for t in turns] == ["25 days [1].", "25 days [1]."]
        assert len(conversation.chat_turns(dest, "default", "desk-chat")) == 1
        original = conversation.chat_turns(source, "default", "alice-chat", auth.get_user(source, "alice").id)
        assert [t.created_at for t in turns] == [t.created_at for t in original]  # when they were asked

        again = transfer.copy_history(source, dest, ["default"])
        assert (again.decisions_copied, again.runs_copied, again.turns_copied) == (0, 0, 0)
        assert (again.runs_skipped, again.turns_skipped) == (2, 3)
        assert len(history.list_runs(dest, golden_name="golden_test")) == 2
    finally:
        dest.close()


def test_a_decision_fitted_in_the_destination_is_kept_and_a_reader_it_lacks_is_reported(
    source: Any, tmp_path: Path
) -> None:
    dest = store.open_db(tmp_path / "dest.db")
    try:
        transfer.copy_collections(source, dest)
        store.set_meta(dest, decide.META_KEY + "default", '{"fitted": "there"}')
        copied = transfer.copy_history(source, dest, ["default"])  # no users copied: alice is unknown there
        # DEST's own decision for answers with the model stays; the one for quotes it lacked is copied
        assert copied.decisions_differing == ["default"] and copied.decisions_copied == 1
        assert store.get_meta(dest, decide.META_KEY + "default") == '{"fitted": "there"}'
        assert (copied.turns_copied, copied.turns_without_reader, copied.verified) == (1, 2, False)
        desk_turns = dest.execute("SELECT count(*) FROM chat_turns WHERE user_id IS NULL").fetchone()[0]
        assert desk_turns == 1  # the desk's own
    finally:
        dest.close()


def test_cli_migrate_reports_the_history(source: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source.close()
    src, dest = str(tmp_path / "src.db"), str(tmp_path / "dest.db")
    assert main(["migrate", src, dest]) == 0
    assert ("fitted decisions: 2 copied; evaluation runs: 2 copied, 0 already there; chat turns: 3 copied, "
            "0 already there") in capsys.readouterr().out
    assert main(["migrate", src, str(tmp_path / "plain.db"), "--no-users"]) == 0  # asked for: told, not failed
    assert "2 NOT copied (their readers are not users of the destination" in capsys.readouterr().out
    assert main(["migrate", src, str(tmp_path / "bare.db"), "--no-history"]) == 0
    assert "evaluation runs" not in capsys.readouterr().out


def test_a_copied_chat_opens_the_documents_it_cited(tmp_path: Path, backend_db: Path | str) -> None:
    """DEST numbers the documents its own way: a reloaded chat's "open the passage" link must
    open the document that was cited, and a link to a document SRC no longer holds opens none."""
    from rag import access
    from rag.errors import NotFoundError
    from rag.records import Hit

    from .evalkit import DOCS

    src = store.open_db(tmp_path / "src.db")
    dest = store.open_db(backend_db)
    try:
        build_db(src, FakeEmbedder(), {name: DOCS[name] for name in ("travel.md", "pay.md", "leave.md")})
        coll = store.require_collection(src, "default")
        gone = store.find_document(src, coll.id, "pay.md")
        hits = []
        for source in ("travel.md", "pay.md"):
            doc = store.find_document(src, coll.id, source)
            chunk = store.chunk_rows(src, int(doc["id"]))[0]
            hits.append(Hit(chunk_id=int(chunk["id"]), document_id=int(doc["id"]), source=source, title=source,
                            section="", content=chunk["content"], char_from=chunk["char_from"],
                            char_to=chunk["char_to"], page=None, distance=0.2))
        answer = Answer(status="answered", question="Per diem?", text="GSA [1].", hits=hits[:1], dropped=hits[1:])
        conversation.save_turn(src, collection="default", chat_id="c", question="Per diem?", searched="Per diem?",
                               answer=answer, groups=["hr"])
        store.delete_document(src, int(gone["id"]))  # cited once, deleted since
        src_ids = {r["source"]: int(r["id"]) for r in store.document_rows(src, "default")}
        transfer.copy_collections(src, dest)
        assert {r["source"]: int(r["id"]) for r in store.document_rows(dest, "default")} != src_ids

        copied = transfer.copy_history(src, dest, ["default"])
        assert copied.turns_copied == 1
        (turn,) = conversation.chat_turns(dest, "default", "c")
        assert access.readable_document(dest, turn.answer.hits[0].document_id, ["hr"])["source"] == "travel.md"
        with pytest.raises(NotFoundError):  # not whichever document DEST gave that number
            access.readable_document(dest, turn.answer.dropped[0].document_id, ["hr"])
        assert transfer.copy_history(src, dest, ["default"]).turns_skipped == 1  # a second run adds nothing

        # A turn an earlier version copied as it was (SRC's ids) is pointed at DEST's documents on the next run.
        raw = src.execute("SELECT answer FROM chat_turns WHERE chat_id = 'c'").fetchone()[0]
        dest.execute("UPDATE chat_turns SET answer = ? WHERE chat_id = 'c'", (raw,))
        (old,) = conversation.chat_turns(dest, "default", "c")
        assert old.answer.hits[0].document_id == src_ids["travel.md"] != turn.answer.hits[0].document_id
        assert transfer.copy_history(src, dest, ["default"]).turns_skipped == 1
        (repaired,) = conversation.chat_turns(dest, "default", "c")
        assert repaired.answer.hits[0].document_id == turn.answer.hits[0].document_id
        assert len(conversation.chat_turns(dest, "default", "c")) == 1
    finally:
        src.close()
        dest.close()


def test_a_second_migrate_carries_a_moved_or_retitled_document(source: Any, tmp_path: Path) -> None:
    dest = store.open_db(tmp_path / "dest.db")
    assert transfer.copy_collections(source, dest)[0].copied == 3
    coll = store.require_collection(source, "default")
    moved = store.find_document(source, coll.id, "leave.md")
    store.set_document_path(source, moved["id"], "/elsewhere/leave.md")  # the folder moved, same bytes
    source.execute("UPDATE documents SET title = 'Travel policy' WHERE source = 'travel.md'")
    again = transfer.copy_collections(source, dest)[0]
    assert (again.copied, again.skipped, again.verified) == (2, 1, True)
    target = store.require_collection(dest, "default")
    assert store.find_document(dest, target.id, "leave.md")["path"] == "/elsewhere/leave.md"
    assert store.find_document(dest, target.id, "travel.md")["title"] == "Travel policy"
    assert transfer.copy_collections(source, dest)[0].skipped == 3  # and then nothing more
    dest.close()
