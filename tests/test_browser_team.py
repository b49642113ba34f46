"""Team mode end to end in a real browser (issue 20): `streamlit run app.py` with `RAG_AUTH=1` (what
`rag serve --team` sets) on the demo corpus, driven by Playwright through Debian's Chromium.

A user in the `admin` group and a user with only `all` sign in, each in their own browser, and
ask the same question, whose evidence lies only in docs/guide/admin-operations.md (`groups:
[admin]`; golden item F02): the restricted passage is cited for the first only. The second opens
the first one's citation link and is refused with the message of a missing document; the first
opens it in a new tab and, signed in by the session cookie, sees the passage. Wrong passwords
lock the name with a plain message.

Kept quick: one server for the module, the corpus indexed with MiniLM (`--embedder minilm`, a few
seconds, instead of `rag demo`'s e5), and `RAG_MAX_TOKENS=24`, so the model writes a few words
and the desk quotes the best passage (an extractive answer): what is checked is which passages
are cited, not the model's wording.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import GUIDE, ROOT, clean_env
from .test_browser import (
    ANSWER_TIMEOUT_MS,
    PAGE_TIMEOUT_MS,
    REPLY,
    VIEWPORT,
    _ask,
    _wait_idle,
    launch_chromium,
    serve,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PASSWORD = "correct horse battery"
QUESTION = "How many backup copies are kept for the shared installation?"  # docs/golden_guide.json F02
RESTRICTED = "admin-operations.md"
LOCKOUT_FAILURES = 3
USERS = (("ada", "admin", ""), ("hana", "reader", "admin"), ("rui", "reader", ""))


def _team_env(data: Path) -> dict[str, str]:
    return {**clean_env(data), "RAG_AUTH": "1", "RAG_MAX_TOKENS": "24", "RAG_LOCKOUT_FAILURES": str(LOCKOUT_FAILURES)}


def _rag(data: Path, *args: str, stdin: str | None = None) -> None:
    done = subprocess.run([sys.executable, "-m", "rag", *args], env=clean_env(data), cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def team_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """docs/guide indexed with MiniLM, and three users made with `rag users add` (password on stdin)."""
    data = tmp_path_factory.mktemp("browser-team-data")
    _rag(data, "ingest", str(GUIDE), "--embedder", "minilm")
    for name, role, groups in USERS:
        _rag(data, "users", "add", name, "--role", role, *(["--groups", groups] if groups else []),
             stdin=PASSWORD + "\n")
    return data


@pytest.fixture(scope="module")
def app_url(team_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One team-mode server for the module; its log holds no traceback and no password."""
    log_path = tmp_path_factory.mktemp("browser-team-log") / "streamlit.log"
    with serve(_team_env(team_data), log_path) as url:
        yield url
    assert PASSWORD not in log_path.read_text()


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    with launch_chromium() as launched:
        yield launched


def _browser(chromium: object) -> object:
    """A fresh browser context: its own cookies, as another person's browser."""
    context = chromium.new_context(viewport=VIEWPORT)  # type: ignore[attr-defined]
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    return context


def _sign_in(page: object, name: str, password: str = PASSWORD) -> None:
    from playwright.sync_api import expect

    expect(page.get_by_role("heading", name="Sign in", exact=True)).to_be_visible()  # type: ignore[attr-defined]
    page.get_by_label("Name", exact=True).fill(name)  # type: ignore[attr-defined]
    page.get_by_label("Password", exact=True).fill(password)  # type: ignore[attr-defined]
    page.get_by_role("button", name="Sign in").click()  # type: ignore[attr-defined]
    _wait_idle(page)


def _ask_once(page: object) -> object:
    """Ask QUESTION on the Ask page and return the assistant's message once the run has ended."""
    from playwright.sync_api import expect

    _ask(page, QUESTION)
    expect(page.locator(REPLY)).to_have_count(1, timeout=ANSWER_TIMEOUT_MS)  # type: ignore[attr-defined]
    _wait_idle(page)
    assert not page.get_by_test_id("stException").count()  # type: ignore[attr-defined]
    return page.get_by_test_id("stChatMessage").nth(1)  # type: ignore[attr-defined]


def test_two_users_asking_the_same_question_see_what_their_groups_allow(app_url: str, chromium: object) -> None:
    from playwright.sync_api import expect

    # The user in the admin group: the restricted passage is cited.
    first = _browser(chromium)
    page = first.new_page()  # type: ignore[attr-defined]
    page.goto(f"{app_url}/")
    _sign_in(page, "hana")
    expect(page.get_by_role("heading", name="Ask", exact=True)).to_be_visible()
    answer = _ask_once(page)
    expect(answer.locator('[class*="st-key-rag-quote-"]').first).to_contain_text("seven daily copies")
    expect(answer.get_by_text(RESTRICTED).first).to_be_visible()
    link = answer.locator('a[href*="source?document="]').first.get_attribute("href")
    assert link and re.search(r"document=\d+", link)

    # A user with only "all": same question, no passage of the restricted document anywhere.
    second = _browser(chromium)
    other = second.new_page()  # type: ignore[attr-defined]
    other.goto(f"{app_url}/")
    _sign_in(other, "rui")
    reply = _ask_once(other)
    expect(reply).not_to_contain_text(RESTRICTED)
    expect(reply).not_to_contain_text("seven daily copies")
    assert RESTRICTED not in " ".join(other.get_by_test_id("stChatMessage").all_text_contents())  # folds too

    # The first user's citation link, opened by the second: refused like a missing document.
    document = re.search(r"document=(\d+)", link).group(1)  # type: ignore[union-attr]
    other.goto(f"{app_url}/{link.lstrip('/')}")
    expect(other.get_by_text(f"no document {document} is visible to all")).to_be_visible()
    expect(other.locator("mark#rag-passage")).to_have_count(0)
    expect(other.get_by_text("seven daily copies")).to_have_count(0)

    # The same link in a new tab of the first user's browser: signed in by the session cookie.
    tab = first.new_page()  # type: ignore[attr-defined]
    tab.goto(f"{app_url}/{link.lstrip('/')}")
    passage = tab.locator("mark#rag-passage")
    expect(passage).to_be_visible()
    expect(tab.get_by_role("heading", name="Sign in", exact=True)).to_have_count(0)
    first.close()  # type: ignore[attr-defined]
    second.close()  # type: ignore[attr-defined]


def test_wrong_passwords_lock_the_name_with_a_plain_message(app_url: str, chromium: object) -> None:
    from playwright.sync_api import expect

    context = _browser(chromium)
    page = context.new_page()  # type: ignore[attr-defined]
    page.goto(f"{app_url}/documents")
    _sign_in(page, "ada", "not the password")
    expect(page.get_by_text("Wrong name or password.", exact=True)).to_be_visible()
    for _ in range(LOCKOUT_FAILURES - 1):
        _sign_in(page, "ada", "not the password")
    locked = re.compile(r"too many failed sign-ins for this name: try again in 1 minute")
    expect(page.get_by_text(locked)).to_be_visible()
    _sign_in(page, "ada")  # the right password, while the name is locked
    expect(page.get_by_text(re.compile(r"^Too many failed sign-ins for this name"))).to_be_visible()
    expect(page.get_by_role("heading", name="Documents", exact=True)).to_have_count(0)
    context.close()  # type: ignore[attr-defined]
