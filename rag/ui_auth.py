"""Team mode in the app (issue 20): the sign-in form, sign-out, who reads this run, what each
role's pages and actions are, the admin's "viewing as" preview, and the audit of questions.

Kept beside ``rag.ui`` rather than inside it: ``ui.frame()`` calls ``signed_in_user`` and
``sidebar_account`` and nothing else of team mode lives in the frame. Decisions stay in the
library: ``rag.auth`` says who is signed in and what a role may do, ``rag.access`` what a
reader may open. Desktop mode (``Settings.auth`` false) calls none of this.

Sessions. The secret token of a sign-in is kept in ``st.session_state`` (one browser tab) and
in a session cookie (``rag_session``, ``SameSite=Strict``, no expiry date: it ends with the
browser), so a reload or a citation link opened in a new tab stays signed in. Streamlit can
read cookies (``st.context.cookies``, those of the page's first request) but has no call that
sets one, and no kept library is installed for it, so two lines of script written through
``st.html`` set and clear it. The cookie is not HttpOnly (a script sets it): a script planted in
the page could read it, which is why documents' text is never rendered as HTML (``safe_markdown``,
``highlight_html``). The database keeps only the token's SHA-256, and ``rag.auth.session_user``
ends a session unused for ``session_idle_minutes`` whatever the browser keeps.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pandas as pd
import streamlit as st

from rag import auth, store
from rag.config import Settings
from rag.errors import AuthError, PermissionDeniedError, RagError
from rag.records import Answer, Retrieved

COOKIE = "rag_session"
TOKEN_KEY = "_rag_session_token"  # this tab's session token
COOKIE_KEY = "_rag_cookie"  # "set" or "clear": a change of the cookie the next drawn page makes
NOTICE_KEY = "_rag_sign_in_notice"  # a message for the sign-in form (signed out, session ended)
SIGNED_OUT_KEY = "_rag_signed_out"  # this tab signed out: the cookie of its first request is stale
PREVIEW_KEY = "rag-preview-groups"  # the admin's "viewing as" widget
SIGN_OUT_KEY = "rag-sign-out"
PER_USER_KEYS = ("_rag_chats", "_rag_pending", "_rag_replace", "_rag_asking", PREVIEW_KEY)
_TOKEN = re.compile(r"[A-Za-z0-9_-]{20,200}")  # secrets.token_urlsafe's alphabet

# What each page needs (its file, relative to app.py). A page refuses a run without it, and the
# frame hides the link. The Documents page shows its actions by finer checks (ingest, delete).
PAGE_ACTIONS: Mapping[str, auth.Action] = {
    "app.py": "ask",
    "pages/source.py": "open_source",
    "pages/documents.py": "upload",
    "pages/chunks.py": "view_chunks",
    "pages/evaluation.py": "run_eval",
    "pages/settings.py": "manage_settings",
    "pages/admin.py": "manage_users",
}


def policy(settings: Settings) -> auth.SignInPolicy:
    return auth.SignInPolicy.from_settings(settings)


# ---------------------------------------------------------------------------------------------
# Sign-in, sign-out


def signed_in_user(conn: store.Connection, settings: Settings) -> auth.User:
    """The user signed in to this browser session, or the sign-in form and the end of the run."""
    signed_out = st.session_state.get(SIGNED_OUT_KEY, False)
    token = st.session_state.get(TOKEN_KEY) or (None if signed_out else _cookie_token())
    user = auth.session_user(conn, token, auth.utcnow(), policy(settings).idle_timeout) if token else None
    if user is not None:
        st.session_state[TOKEN_KEY] = token
        return user
    if token:  # a session this browser held has ended: idle too long, signed out elsewhere, disabled
        st.session_state.pop(TOKEN_KEY, None)
        st.session_state[SIGNED_OUT_KEY] = True
        st.session_state[COOKIE_KEY] = "clear"
        st.session_state.setdefault(
            NOTICE_KEY,
            f"Your session has ended (unused for {settings.session_idle_minutes} minutes, or signed out "
            "elsewhere): sign in again.",
        )
    sign_in_form(conn, settings)
    st.stop()
    raise AssertionError("st.stop() returned")  # never reached; tells type checkers the run ends


def _cookie_token() -> str | None:
    try:
        value = st.context.cookies.get(COOKIE)
    except (AttributeError, RuntimeError):  # no browser request behind this run (a bare script)
        return None
    return value if isinstance(value, str) and _TOKEN.fullmatch(value) else None


def sign_in_form(conn: store.Connection, settings: Settings) -> None:
    """The sign-in page: name and password; a failure or a lock is said in plain words."""
    st.title("Sign in")
    st.caption("This desk is shared by a team: sign in with the name and password an administrator gave you.")
    write_cookie()
    notice = st.session_state.pop(NOTICE_KEY, None)
    if notice:
        st.info(notice)
    if not auth.has_admin(conn):
        st.error("Team mode needs an administrator and this database has none. On the computer that runs the "
                 "desk, create one with `rag users add NAME --role admin`, then reload this page.")
        return
    with st.form("rag-sign-in", clear_on_submit=True):
        name = st.text_input("Name", key="rag-sign-in-name", autocomplete="username")
        password = st.text_input("Password", type="password", key="rag-sign-in-password",
                                 autocomplete="current-password")
        submitted = st.form_submit_button("Sign in", type="primary")
    if not submitted:
        return
    if not name.strip() or not password:
        st.error("Type your name and your password.")
        return
    try:
        session = auth.authenticate(conn, name, password, auth.utcnow(), policy(settings))
    except AuthError as e:  # LockedOutError included: its message says until when
        st.error(_sentence(str(e)))
        return
    for key in PER_USER_KEYS:  # nothing of a previous user of this tab is kept
        st.session_state.pop(key, None)
    st.session_state[TOKEN_KEY] = session.token
    st.session_state[COOKIE_KEY] = "set"
    st.session_state.pop(SIGNED_OUT_KEY, None)
    st.rerun()


def _sentence(message: str) -> str:
    return message[:1].upper() + message[1:] + ("" if message.endswith(".") else ".")


def sign_out(conn: store.Connection) -> None:
    """End this tab's session (and the cookie), forget the user's state, rerun to the sign-in form."""
    auth.sign_out(conn, st.session_state.pop(TOKEN_KEY, None), auth.utcnow())
    for key in PER_USER_KEYS:
        st.session_state.pop(key, None)
    st.session_state[SIGNED_OUT_KEY] = True
    st.session_state[COOKIE_KEY] = "clear"
    st.session_state[NOTICE_KEY] = "You are signed out."
    st.rerun()


def cookie_script(token: str | None) -> str:
    """The script that sets the session cookie to ``token`` (None: deletes it).

    No "<" may appear in it (Streamlit's HTML sanitiser drops such elements; see ``ui.scroll_script``).
    """
    if token is None:
        return f"<script>document.cookie = '{COOKIE}=; Max-Age=0; path=/; SameSite=Strict';</script>"
    if not _TOKEN.fullmatch(token):
        raise ValueError("not a session token")
    return ("<script>document.cookie = '" + COOKIE + "=" + token + "; path=/; SameSite=Strict' + "
            "(location.protocol === 'https:' ? '; Secure' : '');</script>")


def write_cookie() -> None:
    """Make the cookie change queued by a sign-in or a sign-out (drawn once, in this run's page)."""
    change = st.session_state.pop(COOKIE_KEY, None)
    if change == "set" and st.session_state.get(TOKEN_KEY):
        st.html(cookie_script(st.session_state[TOKEN_KEY]), unsafe_allow_javascript=True)
    elif change == "clear":
        st.html(cookie_script(None), unsafe_allow_javascript=True)


# ---------------------------------------------------------------------------------------------
# The sidebar: who is signed in, the admin's preview, sign-out


def allowed_pages(user: auth.User | None, paths: Sequence[str]) -> list[str]:
    """The pages of ``paths`` the user's role may open (a page not in ``PAGE_ACTIONS`` is always shown)."""
    return [p for p in paths if p not in PAGE_ACTIONS or auth.may(user, PAGE_ACTIONS[p])]


def sidebar_account(conn: store.Connection, user: auth.User, known: Sequence[str]) -> tuple[list[str], bool]:
    """Draw who is signed in, the preview selector (admins only) and Sign out; return the reader's
    groups for this run and whether they are an admin's preview of other groups."""
    st.caption(f"Signed in as **{_plain(user.name)}** · {user.role}")
    st.caption("Your groups: " + ", ".join(store.normalize_groups([*user.groups, store.PUBLIC_GROUP])))
    preview: list[str] = []
    if auth.may(user, "view_as"):
        if PREVIEW_KEY in st.session_state:  # kept across pages; a group may have gone with its documents
            st.session_state[PREVIEW_KEY] = [g for g in st.session_state[PREVIEW_KEY] if g in known]
        preview = st.multiselect(
            "Viewing as (preview)", list(known), key=PREVIEW_KEY,
            help="Administrators only: see what readers of these groups see. Leave empty to read with your own "
            "groups. Questions asked in a preview are recorded as previews.",
        )
        if preview:
            st.warning("Preview: every page shows what readers of " + ", ".join(preview) + " see.",
                       icon=":material/visibility:")
    if st.button("Sign out", key=SIGN_OUT_KEY, icon=":material/logout:"):
        sign_out(conn)
    groups = auth.reader_groups(user, preview) if preview else auth.reader_groups(user)
    return store.normalize_groups([*groups, store.PUBLIC_GROUP]), bool(preview)  # "all" spelled out, as shown


def _plain(text: str) -> str:
    return re.sub(r"([\\`*_\[\]<>#|~$&])", r"\\\1", text)


def refuse_page(user: auth.User | None, action: str) -> None:
    """A page the user's role may not open: say so and end the run."""
    try:
        auth.require(user, action)
    except PermissionDeniedError as e:
        st.error(f"Not allowed: {e}.")
        st.stop()


# ---------------------------------------------------------------------------------------------
# The audit of questions, and each user's own history


def audited(
    events: Iterator[Any], conn: store.Connection, user: auth.User, *, question: str, groups: Sequence[str],
    collection: str, preview: bool,
) -> Iterator[Any]:
    """``rag.ask.ask_stream``'s events, passed through; the question is audited when its answer
    arrives, or, when the run stops first (the Stop button), with the sources shown until then."""
    shown: list[dict[str, Any]] = []
    answered = False
    error: RagError | None = None
    try:
        for event in events:
            if isinstance(event, Retrieved):
                shown = [{"source": h.source, "document_id": h.document_id, "chunk_id": h.chunk_id}
                         for h in event.hits]
            elif isinstance(event, Answer):
                auth.record_question(conn, user, event, groups=groups, collection=collection, preview=preview)
                answered = True
            yield event
    except RagError as e:  # shown by the page; recorded here with its message
        error = e
        raise
    finally:
        close = getattr(events, "close", None)
        if callable(close):
            close()
        if not answered:  # stopped (the Stop button ends the run inside the stream), or failed
            detail: dict[str, Any] = {"question": question, "collection": collection, "preview": preview,
                                      "groups": store.normalize_groups(groups), "shown": shown}
            if error is not None:
                detail["error"] = str(error)
            auth.record(conn, user, "ask_failed" if error is not None else "ask_stopped", detail)


def history_frame(rows: Sequence[auth.AuditRow]) -> pd.DataFrame:
    """A user's questions, newest first: when, the question, what came of it, what was cited."""
    return pd.DataFrame(
        {
            "when": [r.at[:16].replace("T", " ") for r in rows],
            "question": [str(r.detail.get("question", "")) for r in rows],
            "outcome": [_outcome(r.detail) for r in rows],
            "cited": ["; ".join(str(c.get("source", "")) for c in r.detail.get("cited", []) if isinstance(c, dict))
                      for r in rows],
        },
        columns=["when", "question", "outcome", "cited"],
    )


_OUTCOMES = {"answered": "answered", "extractive": "quoted", "no_answer": "not found"}


def _outcome(detail: Mapping[str, Any]) -> str:
    text = _OUTCOMES.get(str(detail.get("status")), str(detail.get("status", "")))
    return text + (" (preview)" if detail.get("preview") else "")


def render_history(conn: store.Connection, user: auth.User, limit: int = 50) -> None:
    """The signed-in user's own questions (from the audit log), folded in the sidebar."""
    rows = auth.question_history(conn, user, limit=limit)
    with st.sidebar.expander(f"Your questions ({len(rows)})", icon=":material/history:"):
        if rows:
            st.dataframe(history_frame(rows), hide_index=True, key="rag-history")
        else:
            st.caption("Your questions will be listed here.")
