"""Team mode in the app (issue 20), page by page with Streamlit's AppTest: sign-in on every page,
wrong passwords and the lock, idle expiry, what each role sees and may do, the signed-in user's
groups on every view (a forbidden ?document= is refused like a missing one), the audit of
questions and each user's history, the admin page. Desktop mode is tests/test_pages.py, unchanged.

The tests marked ``BOTH`` run on SQLite and on PostgreSQL (sign-in and the lock, a reader's
restricted documents, the sidebar's counts, the audited question and its history, the admin page);
the others on SQLite only, as every page reads through the same library calls."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from streamlit.testing.v1 import AppTest

from rag import auth, store, ui, ui_auth
from rag.config import load_settings
from rag.errors import PermissionDeniedError, QueryError
from rag.ingest import index_health, ingest

from .conftest import BACKENDS, GUIDE
from .fakes import FakeEmbedder
from .test_pages import APP, TIMEOUT, ForbiddenLLM, ScriptedStream, texts

PASSWORD = "correct horse battery"
PAGES = ["app.py", "pages/source.py", "pages/documents.py", "pages/chunks.py", "pages/evaluation.py",
         "pages/settings.py", "pages/admin.py"]
USERS = {  # name: (role, groups); admin-operations.md is the guide's one document for the admin group
    "ada": ("admin", []),
    "hana": ("reader", ["admin"]),
    "rui": ("reader", []),
    "eddie": ("editor", []),
}


BOTH = pytest.mark.parametrize("backend", BACKENDS, indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """SQLite, unless a test is marked ``BOTH`` (tests/conftest.py's fixture runs every test on both)."""
    return str(getattr(request, "param", "sqlite"))


@pytest.fixture(autouse=True)
def team_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_PRELOAD_MODELS", "false")
    monkeypatch.setenv("RAG_AUTH", "true")


@pytest.fixture
def fake_models() -> Iterator[FakeEmbedder]:
    fake = FakeEmbedder()
    with mock.patch("rag.ui.embedder", lambda spec: fake), mock.patch("rag.ui.llm", lambda *args: ForbiddenLLM()):
        yield fake


@pytest.fixture
def team_db(data_dir: Path, fake_models: FakeEmbedder, backend: str, request: pytest.FixtureRequest,
            monkeypatch: pytest.MonkeyPatch) -> Path | str:
    """docs/guide ingested with the fake embedder, and the users of ``USERS``; the app's database
    (RAG_DB) is a PostgreSQL one for the tests marked ``BOTH``."""
    if backend == "postgres":
        monkeypatch.setenv("RAG_DB", request.getfixturevalue("pg_url"))
    settings = load_settings()
    conn = store.open_db(settings.db_path)
    try:
        ingest(conn, [GUIDE], settings=settings, embedder=fake_models)
        for name, (role, groups) in USERS.items():
            auth.add_user(conn, name, PASSWORD, role=role, groups=groups)
    finally:
        conn.close()
    return settings.db_path


def open_page(page: str, **params: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    if page != "app.py":
        at.switch_page(page)
    for key, value in params.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def sign_in(at: AppTest, name: str, password: str = PASSWORD) -> AppTest:
    at.text_input(key="rag-sign-in-name").input(name)
    at.text_input(key="rag-sign-in-password").input(password)
    next(b for b in at.button if b.label == "Sign in").click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def signed_in(page: str, name: str, **params: str) -> AppTest:
    return sign_in(open_page(page, **params), name)


def is_sign_in_form(at: AppTest) -> bool:
    return bool(at.title) and at.title[0].value == "Sign in"


def nav_titles(at: AppTest) -> list[str]:
    return [link.proto.label for link in at.sidebar.get("page_link")]


def rows(db: Path | str, action: str | None = None) -> list[auth.AuditRow]:
    conn = store.open_db(db)
    try:
        return auth.audit_rows(conn, action=action)
    finally:
        conn.close()


def document_id(db: Path | str, source: str) -> int:
    conn = store.open_db(db)
    try:
        return int(next(r for r in store.chunk_rows(conn) if r["source"] == source)["document_id"])
    finally:
        conn.close()


def marked_html(at: AppTest) -> list[str]:
    return [h.proto.body for h in at.get("html") if '<mark id="rag-passage"' in h.proto.body]


# ---------------------------------------------------------------------------------------------
# Sign-in


@pytest.mark.parametrize("page", PAGES)
def test_every_page_asks_for_a_sign_in_first(team_db: Path | str, page: str) -> None:
    at = open_page(page, document=str(document_id(team_db, "admin-operations.md")))
    assert is_sign_in_form(at)
    assert not at.sidebar.get("page_link") and not at.sidebar.metric  # no navigation, no index health
    assert not at.chat_input and not at.dataframe and not at.get("file_uploader") and not marked_html(at)
    assert [t.label for t in at.text_input] == ["Name", "Password"]


@BOTH
def test_sign_in_opens_the_page_and_sign_out_ends_the_session(team_db: Path | str) -> None:
    at = signed_in("app.py", "rui")
    assert at.title[0].value == "Ask" and at.chat_input
    assert any("Signed in as **rui** · reader" in c.value for c in at.sidebar.caption)
    assert not any(m.label.startswith("Viewing as") for m in at.sidebar.multiselect)  # readers cannot switch
    token = at.session_state[ui_auth.TOKEN_KEY]
    assert [r.action for r in rows(team_db)][-1] == "sign_in"
    scripts = [h.proto.body for h in at.get("html") if "document.cookie" in h.proto.body]
    assert len(scripts) == 1 and f"rag_session={token};" in scripts[0]  # a new tab finds the session
    at.run()
    assert not [h for h in at.get("html") if "document.cookie" in h.proto.body]  # set once, not every run

    at.button(key=ui_auth.SIGN_OUT_KEY).click().run()
    assert is_sign_in_form(at) and "You are signed out." in texts(at)
    assert any("rag_session=; Max-Age=0" in h.proto.body for h in at.get("html"))
    conn = store.open_db(team_db)
    try:  # the session is gone from the database, not only from the tab
        assert auth.session_user(conn, token, auth.utcnow(), timedelta(hours=1)) is None
    finally:
        conn.close()
    assert [r.action for r in rows(team_db)][-1] == "sign_out"


def test_a_session_cookie_signs_in_a_new_tab_and_a_bad_one_does_not(team_db: Path | str) -> None:
    conn = store.open_db(team_db)
    try:
        session = auth.authenticate(conn, "hana", PASSWORD, auth.utcnow())
    finally:
        conn.close()
    with mock.patch("rag.ui_auth._cookie_token", lambda: session.token):
        at = open_page("app.py")
    assert at.title[0].value == "Ask"
    with mock.patch("rag.ui_auth._cookie_token", lambda: session.token[:-2] + "xx"):
        assert is_sign_in_form(open_page("app.py"))


def test_the_cookie_script_sets_and_clears_only_a_token() -> None:
    script = ui_auth.cookie_script("abcDEF123_-" * 4)
    assert "document.cookie = 'rag_session=abcDEF123_-" in script and "SameSite=Strict" in script
    assert "Max-Age=0" in ui_auth.cookie_script(None)
    assert not re.search(r"<[a-zA-Z0-9]", script.removeprefix("<script>").removesuffix("</script>"))
    with pytest.raises(ValueError):
        ui_auth.cookie_script("x'; alert(1); '")


@BOTH
def test_a_wrong_password_is_refused_and_repeated_ones_lock_the_name(
    team_db: Path | str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAG_LOCKOUT_FAILURES", "3")
    at = open_page("app.py")
    sign_in(at, "rui", "not my password")
    assert is_sign_in_form(at) and at.error[0].value == "Wrong name or password."
    sign_in(at, "nobody-here", "not my password")
    assert at.error[0].value == "Wrong name or password."  # an unknown name reads the same
    for _ in range(2):
        sign_in(at, "rui", "not my password")
    assert re.fullmatch(r"Wrong name or password; too many failed sign-ins for this name: try again in 1 minute "
                        r"\(after \d\d:\d\d UTC\)\.", at.error[0].value)
    sign_in(at, "rui")  # the right password, while locked
    assert is_sign_in_form(at) and at.error[0].value.startswith("Too many failed sign-ins for this name: try again")
    assert [r.action for r in rows(team_db)][-4:] == ["sign_in_failed"] * 3 + ["sign_in_locked"]
    assert all("not my password" not in str(r.detail) for r in rows(team_db))


def test_a_session_left_idle_ends_with_a_plain_message(team_db: Path | str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_SESSION_IDLE_MINUTES", "30")
    at = signed_in("app.py", "rui")
    assert at.title[0].value == "Ask"
    later = auth.utcnow() + timedelta(minutes=31)
    with mock.patch("rag.auth.utcnow", lambda: later):
        at.run()
    assert is_sign_in_form(at)
    assert "Your session has ended (unused for 30 minutes" in texts(at)


def test_team_mode_without_an_admin_says_how_to_create_one(data_dir: Path, fake_models: FakeEmbedder) -> None:
    at = open_page("pages/documents.py")
    assert is_sign_in_form(at) and "rag users add NAME --role admin" in at.error[0].value
    assert not at.text_input


# ---------------------------------------------------------------------------------------------
# Roles: links, pages, controls and the check in the action's path


def test_each_role_sees_the_links_of_its_pages(team_db: Path | str) -> None:
    assert nav_titles(signed_in("app.py", "rui")) == ["Ask", "Source", "Chunks"]
    assert nav_titles(signed_in("app.py", "eddie")) == ["Ask", "Source", "Documents", "Chunks"]
    assert nav_titles(signed_in("app.py", "ada")) == ["Ask", "Source", "Documents", "Chunks", "Evaluation",
                                                      "Settings", "Admin"]


@pytest.mark.parametrize(("page", "refusal"), [
    ("pages/documents.py", "may not upload documents"), ("pages/evaluation.py", "may not run evaluations"),
    ("pages/settings.py", "may not change settings"), ("pages/admin.py", "may not manage users"),
])
def test_a_reader_is_refused_the_upload_evaluation_settings_and_admin_pages(
    team_db: Path | str, page: str, refusal: str
) -> None:
    at = signed_in("app.py", "rui")
    at.switch_page(page).run()
    assert not at.exception
    assert at.error[0].value.startswith(f"Not allowed: rui (reader) {refusal}")
    assert not [b for b in at.button if b.key != ui_auth.SIGN_OUT_KEY]  # no control but Sign out
    assert not at.dataframe and not at.get("file_uploader") and not at.main.text_input


def test_the_library_refuses_a_reader_what_the_page_hides(team_db: Path | str) -> None:
    conn = store.open_db(team_db)
    try:
        reader = auth.require_user(conn, "rui")
        view = ui.View(load_settings(), conn, "default", ["default"], None, ["all"], ["admin", "all"],
                       mock.Mock(), reader)
        for action in ("upload", "ingest", "delete_document", "manage_users", "manage_settings", "run_eval",
                       "manage_collections"):
            assert not view.may(action)
            with pytest.raises(PermissionDeniedError, match="rui \\(reader\\) may not"):
                view.require(action)
        with pytest.raises(PermissionDeniedError):
            auth.add_user(conn, "mallory", PASSWORD, role="admin", actor=reader)
        with pytest.raises(PermissionDeniedError):
            auth.reader_groups(reader, ["admin"])  # no "viewing as" for a reader
        with pytest.raises(PermissionDeniedError):
            auth.prune_audit(conn, 1, actor=reader)
        assert view.may("ask") and view.scope == ["all"]
    finally:
        conn.close()


@BOTH
def test_an_editor_uploads_into_the_collection_but_cannot_delete_or_create_one(team_db: Path | str) -> None:
    at = signed_in("app.py", "eddie")
    at.switch_page("pages/documents.py").run()
    assert not at.exception and at.title[0].value == "Documents"
    assert at.get("file_uploader")
    into = next(t for t in at.text_input if t.label == "Into collection")
    assert into.disabled
    assert not any(e.label == "Delete documents" for e in at.expander)
    table = at.dataframe[0].value
    assert "admin-operations.md" not in set(table["document"])  # the list holds what eddie may read
    assert len(table) == 14


def test_an_editor_cannot_replace_a_document_they_may_not_read_by_uploading_its_name(team_db: Path | str) -> None:
    # The upload used to replace admin-operations.md (admin only) with eddie's text, made public.
    before = store.open_db(team_db)
    try:
        [row] = [r for r in store.document_rows(before) if r["source"] == "admin-operations.md"]
    finally:
        before.close()
    at = signed_in("app.py", "eddie")
    at.switch_page("pages/documents.py").run()
    at.file_uploader[0].set_value([
        ("admin-operations.md", b"# Ops\n\nEddie's own text, for everyone.\n", "text/markdown"),
        ("vpn.md", b"# VPN\n\nThe VPN gateway is vpn-gw-7 and it needs the token app.\n", "text/markdown"),
    ]).run()
    at.button[0].click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert "a document you may not read is stored under this name" in texts(at)
    after = store.open_db(team_db)
    try:
        [same] = [r for r in store.document_rows(after) if r["source"] == "admin-operations.md"]
        assert (same["content_hash"], same["groups"], same["chunk_count"]) == (
            row["content_hash"], row["groups"], row["chunk_count"])
        assert "vpn.md" in {r["source"] for r in store.document_rows(after)}  # the other file is indexed
    finally:
        after.close()
    assert "admin-operations.md" not in set(at.dataframe[0].value["document"])


@BOTH
def test_an_editors_retry_and_re_embed_touch_and_name_only_the_documents_they_may_read(
    team_db: Path | str, tmp_path: Path
) -> None:
    # "Retry failed (1)" counted eddie's one failed document, then retried (and named) every
    # failed document of the collection, an admin-only one too; "Re-embed stale" likewise.
    conn = store.open_db(team_db)
    try:
        coll = store.require_collection(conn, "default")
        for source, groups in (("eddies-notes.md", ["all"]), ("board-minutes.md", ["admin"])):
            store.record_failure(conn, coll, source, str(tmp_path / source), groups, "b", "c", "file gone")
        conn.execute("UPDATE documents SET pipeline_version = 'old' WHERE source IN (?, ?)",
                     ("index.md", "admin-operations.md"))
    finally:
        conn.close()
    at = signed_in("app.py", "eddie")
    at.switch_page("pages/documents.py").run()
    assert "board-minutes.md" not in set(at.dataframe[0].value["document"])
    next(b for b in at.button if b.label == "Retry failed (1)").click().run()
    assert not at.exception, [e.value for e in at.exception]
    shown = texts(at)
    assert "eddies-notes.md" in shown and "board-minutes.md" not in shown
    assert "1 files: 0 indexed" in shown  # the summary counts eddie's document only
    next(b for b in at.button if b.label == "Re-embed stale (1)").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert "1 files: 1 indexed" in texts(at)
    conn = store.open_db(team_db)
    try:
        assert store.find_document(conn, coll.id, "board-minutes.md")["error"] == "file gone"  # left as it was
        assert store.find_document(conn, coll.id, "admin-operations.md")["pipeline_version"] == "old"
        assert store.find_document(conn, coll.id, "index.md")["pipeline_version"] != "old"
    finally:
        conn.close()


def test_an_admin_deletes_a_document_and_the_log_says_who(team_db: Path | str) -> None:
    at = signed_in("app.py", "ada")
    at.switch_page("pages/documents.py").run()
    at.multiselect[0].select("index.md")
    next(b for b in at.button if b.label == "Delete selected").click().run()
    assert not at.exception
    assert "Deleted 1 document(s): index.md" in texts(at)
    row = rows(team_db, "delete_documents")[-1]
    assert row.user == "ada" and row.detail["sources"] == ["index.md"]


# ---------------------------------------------------------------------------------------------
# The signed-in user's groups on every view


@BOTH
def test_a_forbidden_source_url_is_refused_like_a_missing_one(team_db: Path | str) -> None:
    doc = document_id(team_db, "admin-operations.md")
    at = signed_in("pages/source.py", "rui", document=str(doc), groups="admin", **{"from": "0", "to": "40"})
    refused = at.error[0].value
    assert not marked_html(at) and "Backing up" not in texts(at)
    missing = signed_in("pages/source.py", "rui", document="999999", **{"from": "0", "to": "40"}).error[0].value
    assert refused.replace(str(doc), "N") == missing.replace("999999", "N")  # ?groups= is ignored in team mode

    at = signed_in("pages/source.py", "hana", document=str(doc), **{"from": "0", "to": "40"})
    assert not at.error and marked_html(at)


@BOTH
def test_the_chunks_and_source_pickers_hold_only_the_users_documents(team_db: Path | str) -> None:
    for name, sees in (("rui", False), ("hana", True)):
        at = signed_in("pages/chunks.py", name)
        picker = next(s for s in at.main.selectbox if s.label == "Document")
        assert any("admin-operations.md" in o for o in picker.options) is sees
        at.switch_page("pages/source.py").run()
        picker = next(s for s in at.main.selectbox if s.label == "Document")
        assert any("admin-operations.md" in o for o in picker.options) is sees


def health(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.sidebar.metric}


@BOTH
def test_the_sidebar_counts_only_what_the_reader_may_see(team_db: Path | str) -> None:
    conn = store.open_db(team_db)
    try:
        settings = load_settings()
        everything = index_health(conn, settings, "default")
        public = index_health(conn, settings, "default", ["all"])
        chunks = store.chunk_rows(conn, collection="default")
    finally:
        conn.close()
    admin_only = sum(r["source"] == "admin-operations.md" for r in chunks)
    assert (everything.documents, public.documents) == (15, 14)  # admin-operations.md is the admin group's
    assert (everything.chunks, public.chunks) == (len(chunks), len(chunks) - admin_only) and admin_only > 0

    rui = health(signed_in("app.py", "rui"))
    assert (rui["Documents"], rui["Chunks"]) == ("14", str(public.chunks))
    hana = signed_in("app.py", "hana")  # a reader of the admin group
    assert (health(hana)["Documents"], health(hana)["Chunks"]) == ("15", str(everything.chunks))
    assert any("**15** documents" in m.value for m in hana.markdown)  # the Ask page's line, likewise
    ada = signed_in("pages/chunks.py", "ada")  # an admin reads with their own groups, then a preview
    assert health(ada)["Documents"] == "14"
    ada.sidebar.multiselect(key=ui_auth.PREVIEW_KEY).select("admin").run()
    assert health(ada)["Documents"] == "15"


def test_an_admin_previews_other_groups_and_it_is_labelled(team_db: Path | str) -> None:
    at = signed_in("pages/source.py", "ada")
    picker = next(s for s in at.main.selectbox if s.label == "Document")
    assert not any("admin-operations.md" in o for o in picker.options)  # an admin is not in every group
    at.sidebar.multiselect(key=ui_auth.PREVIEW_KEY).select("admin").run()
    assert "Preview: every page shows what readers of admin see." in [w.value for w in at.sidebar.warning]
    picker = next(s for s in at.main.selectbox if s.label == "Document")
    assert any("admin-operations.md" in o for o in picker.options)
    at.switch_page("pages/chunks.py").run()  # the preview holds across pages
    assert at.sidebar.multiselect(key=ui_auth.PREVIEW_KEY).value == ["admin"]


# ---------------------------------------------------------------------------------------------
# Questions: asked with the user's groups, audited, kept per user, listed in their history


@BOTH
def test_a_question_is_asked_with_the_users_groups_audited_and_in_their_history(
    team_db: Path | str, fake_models: FakeEmbedder
) -> None:
    stream = ScriptedStream("answered", team_db, fake_models)
    with mock.patch("rag.ask.ask_stream", stream):
        at = signed_in("app.py", "hana")
        at.chat_input[0].set_value("How do I start the app on another port?").run()
    assert not at.exception, [e.value for e in at.exception]
    assert stream.asked[0][1]["groups"] == ["admin", "all"]
    row = rows(team_db, "ask")[-1]
    assert row.user == "hana" and row.detail["question"] == "How do I start the app on another port?"
    assert row.detail["status"] == "answered" and row.detail["cited"][0]["document_id"]
    history = next(e for e in at.sidebar.expander if e.label.startswith("Your questions"))
    assert history.label == "Your questions (1)"
    assert list(history.dataframe[0].value["question"]) == ["How do I start the app on another port?"]

    other = signed_in("app.py", "rui")  # another user: none of hana's chat, none of her history
    assert not any("PORT=8502" in m.value for m in other.markdown)
    assert not any("viewing as" in c.value for c in other.caption)  # a reader has no selector to switch
    assert any("that you (**all**) may read" in c.value for c in other.caption)
    assert next(e for e in other.sidebar.expander if e.label.startswith("Your questions")).label == \
        "Your questions (0)"


def test_a_stopped_question_is_audited_with_what_was_shown(team_db: Path | str, fake_models: FakeEmbedder) -> None:
    from rag.records import Retrieved

    def stopped(question: str, **kwargs: Any) -> Iterator[Any]:
        yield Retrieved([], [], "en", {})
        raise KeyboardInterrupt  # what the Stop button's rerun does to the script, in effect

    conn = store.open_db(team_db)
    try:
        user = auth.require_user(conn, "rui")
        events = ui_auth.audited(stopped("q"), conn, user, question="q", groups=["all"], collection="default",
                                 preview=False)
        with pytest.raises(KeyboardInterrupt):
            list(events)
        row = auth.audit_rows(conn, action="ask_stopped")[-1]
        assert row.user == "rui" and row.detail["question"] == "q" and row.detail["shown"] == []

        def failing(question: str, **kwargs: Any) -> Iterator[Any]:
            raise QueryError("nothing to search for")
            yield  # a generator, like ask_stream

        with pytest.raises(QueryError):
            list(ui_auth.audited(failing("???"), conn, user, question="???", groups=["all"], collection="default",
                                 preview=False))
        row = auth.audit_rows(conn, action="ask_failed")[-1]
        assert row.detail["question"] == "???" and row.detail["error"] == "nothing to search for"
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------------
# Admin page


@BOTH
def test_the_admin_page_adds_a_user_and_shows_the_log_as_csv(team_db: Path | str) -> None:
    at = signed_in("app.py", "ada")
    at.switch_page("pages/admin.py").run()
    assert not at.exception and at.title[0].value == "Admin"
    at.text_input(key="rag-add-name").input("binh")
    at.text_input(key="rag-add-password").input("another long one")
    at.text_input(key="rag-add-groups").input("hr, finance")
    next(b for b in at.button if b.label == "Add user").click().run()
    assert not at.exception
    assert "Added binh (reader)." in texts(at)
    users = at.dataframe[0].value
    assert list(users[users["name"] == "binh"]["groups"]) == ["finance, hr"]
    added = rows(team_db, "user_add")[-1]
    assert added.user == "ada" and added.detail["name"] == "binh"
    audit = at.dataframe[1].value
    assert "user_add" in set(audit["action"]) and "sign_in" in set(audit["action"])
    csv = next(d for d in at.get("download_button") if d.proto.label.startswith("Download these rows"))
    assert csv is not None
    assert not any("another long one" in str(r.detail) for r in rows(team_db))

    at.selectbox(key="rag-state-user").select("binh")
    next(b for b in at.button if b.label.startswith("Disable")).click().run()
    assert "binh is disabled." in texts(at)
    assert rows(team_db, "user_disable")[-1].user == "ada"


def test_the_admin_page_in_desktop_mode_says_team_mode_is_off(
    team_db: Path | str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAG_AUTH", "false")
    at = open_page("pages/admin.py")
    assert "team mode, which is off" in at.info[0].value
    assert "Admin" not in nav_titles(at) and "Sign in" not in texts(at)
