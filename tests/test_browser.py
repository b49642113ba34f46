"""End to end in a real browser: `streamlit run app.py` on the demo corpus (indexed with the real
embedder `rag demo` chooses), driven by Playwright through Debian's Chromium.

One conversation in one session: a question the user guide answers -> an answer with a citation
-> click [n] -> the source view with the passage highlighted and scrolled into view -> a
follow-up (searched as a standalone question) -> Stop while an answer is written, then ask
again -> an off-topic question (the plain refusal) -> Vietnamese with and without tones -> a
second answerable question; every question gets a reply and nothing raises. Every page is
saved to docs/screenshots/ for the README.

Needs `/usr/bin/chromium` (Debian: `apt-get install chromium chromium-driver`; `.ci/run` installs
it). `playwright install` is not used: no browser is downloaded.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import ROOT, clean_env

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = Path(os.environ.get("RAG_TEST_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run",
]
SCREENSHOTS = ROOT / "docs" / "screenshots"
VIEWPORT = {"width": 1440, "height": 1000}
STARTUP_TIMEOUT_S = 180  # streamlit import + first script run on a busy 2-core machine
ANSWER_TIMEOUT_MS = 300_000  # first question: embedder and GGUF load, then prefill + decoding on 2 cores
PAGE_TIMEOUT_MS = 120_000

NAV_TITLES = ("Ask", "Source", "Documents", "Chunks", "Evaluation", "Settings")  # rag.ui.NAVIGATION, in order
QUESTION = "How do I start the app on another port?"  # the README's suggestion
FOLLOW_UP = "And which port does it use by default?"
OFF_TOPIC = "What is the best recipe for a chocolate soufflé?"
VIETNAMESE = "Làm sao để chạy ứng dụng trên cổng khác?"
TONELESS = "lam sao de chay ung dung tren cong khac"
SECOND = "What happens when nothing in my documents matches the question?"
REPLY = '[class*="st-key-rag-answer-"], [class*="st-key-rag-no-answer-"]'  # an answer or the plain refusal


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=5) as response:
            return response.status == 200 and response.read().strip() == b"ok"
    except OSError:
        return False


@contextlib.contextmanager
def serve(env: dict[str, str], log_path: Path) -> Iterator[str]:
    """`streamlit run app.py` on a free port with ``env``, logging to ``log_path``; yields its URL
    once healthy, stops it (by its own pid) after, and fails when the log holds a traceback."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.port", str(port),
             "--server.address", "127.0.0.1", "--server.headless", "true", "--server.fileWatcherType", "none",
             "--browser.gatherUsageStats", "false"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while not _healthy(url):
                if proc.poll() is not None:
                    pytest.fail(f"streamlit exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
                if time.monotonic() > deadline:
                    pytest.fail(f"streamlit not healthy after {STARTUP_TIMEOUT_S} s:\n{log_path.read_text()[-3000:]}")
                time.sleep(0.5)  # polling interval, not an assertion
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=20)
    log_text = log_path.read_text()
    assert "Traceback" not in log_text, log_text[-3000:]


@contextlib.contextmanager
def launch_chromium() -> Iterator[object]:
    """Debian's Chromium through Playwright (no browser download), closed after."""
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} not found: install Debian's chromium (`apt-get install chromium chromium-driver`)")
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=PAGE_TIMEOUT_MS)
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="module")
def app_url(demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The app on the demo corpus, for the module."""
    with serve(clean_env(demo_data), tmp_path_factory.mktemp("browser-log") / "streamlit.log") as url:
        yield url


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    with launch_chromium() as launched:
        yield launched


def _shot(page: object, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / name))  # type: ignore[attr-defined]


def _wait_idle(page: object) -> None:
    """Wait until the app's script run has finished (Streamlit marks it on the app root)."""
    from playwright.sync_api import expect

    app = page.get_by_test_id("stApp")  # type: ignore[attr-defined]
    expect(app).to_have_attribute("data-test-script-state", "notRunning", timeout=ANSWER_TIMEOUT_MS)
    # Elements still arriving are drawn as skeletons; a screenshot must not catch them.
    expect(page.get_by_test_id("stSkeleton")).to_have_count(0)  # type: ignore[attr-defined]


def _scroll_to_top_of(locator: object) -> None:
    locator.evaluate("el => el.scrollIntoView({block: 'start'})")  # type: ignore[attr-defined]


def _ask(page: object, question: str) -> None:
    box = page.get_by_test_id("stChatInputTextArea")  # type: ignore[attr-defined]
    box.wait_for(timeout=PAGE_TIMEOUT_MS)
    box.fill(question)
    box.press("Enter")


def test_every_page_renders_from_a_deep_link_and_is_captured(app_url: str, chromium: object) -> None:
    from playwright.sync_api import expect

    context = chromium.new_context(viewport=VIEWPORT)  # type: ignore[attr-defined]
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    page = context.new_page()

    # A deep link as the server's first request: Streamlit serves it from the pages/ folder, and the
    # page draws the frame itself (the app's own navigation, not Streamlit's file-name menu).
    page.goto(f"{app_url}/documents")
    expect(page.get_by_role("heading", name="Documents", exact=True)).to_be_visible()
    expect(page.get_by_test_id("stSidebarNav")).to_have_count(0)  # hidden: .streamlit/config.toml
    nav = page.get_by_test_id("stSidebar").get_by_test_id("stPageLink")
    # The text of a link may begin with its icon's ligature name ("forum"), hence the anchored ends.
    expect(nav).to_have_text([re.compile(rf"{title}\s*$") for title in NAV_TITLES])
    expect(nav.get_by_role("link").first).to_have_attribute("href", re.compile(r"^(/?|.*/)$"))  # the main page
    expect(nav.get_by_role("link").nth(1)).to_have_attribute("href", re.compile(r"(^|/)source$"))
    expect(page.get_by_text(re.compile(r"\d+ documents · \d+ ok · 0 failed · 0 stale"))).to_be_visible()
    expect(page.get_by_test_id("stDataFrame")).to_be_visible()
    expect(page.get_by_role("textbox", name="Into collection")).to_have_value("default")
    _wait_idle(page)
    _shot(page, "documents.png")

    page.goto(f"{app_url}/chunks")
    expect(page.get_by_role("heading", name="Cut-position audit")).to_be_visible()
    expect(page.get_by_text("Cuts mid-sentence")).to_be_visible()
    expect(page.get_by_test_id("stDataFrame").first).to_be_visible()
    _wait_idle(page)
    _shot(page, "chunks.png")

    page.goto(f"{app_url}/evaluation")
    expect(page.get_by_role("heading", name="Evaluation", exact=True)).to_be_visible()
    page.get_by_role("button", name="Run on “default”").click()
    expect(page.get_by_text("Run #1:", exact=False)).to_be_visible(timeout=ANSWER_TIMEOUT_MS)
    expect(page.get_by_test_id("stVegaLiteChart")).to_have_count(3)  # recall, gate sweep, coverage-risk
    _wait_idle(page)
    _scroll_to_top_of(page.get_by_text("Recall@k per stage"))
    _shot(page, "evaluation.png")
    context.close()


def _replies(page: object) -> object:
    return page.locator(REPLY)  # type: ignore[attr-defined]


def _ask_and_wait(page: object, question: str) -> object:
    """Ask, wait for one more reply (an answer or the refusal) and the end of the run; return it."""
    from playwright.sync_api import expect

    before = _replies(page).count()  # type: ignore[attr-defined]
    _ask(page, question)
    expect(_replies(page)).to_have_count(before + 1, timeout=ANSWER_TIMEOUT_MS)
    _wait_idle(page)
    assert not page.get_by_test_id("stException").count()  # type: ignore[attr-defined]
    return _replies(page).nth(before)  # type: ignore[attr-defined]


def test_a_conversation_of_mixed_questions_in_one_session(app_url: str, chromium: object) -> None:
    from playwright.sync_api import expect

    context = chromium.new_context(viewport=VIEWPORT)  # type: ignore[attr-defined]
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    page = context.new_page()
    page.goto(f"{app_url}/")
    expect(page.get_by_role("heading", name="Ask", exact=True)).to_be_visible()
    expect(page.get_by_text(re.compile(r"documents in “default”"))).to_be_visible()  # what is indexed
    expect(page.get_by_role("button", name=re.compile(re.escape(QUESTION)))).to_be_visible()  # an example

    # 1. A question the guide answers: an answer with at least one [n] citation link, its sources.
    answer = _ask_and_wait(page, QUESTION)
    citation = answer.locator('a[href*="source?document="]').first  # type: ignore[attr-defined]
    expect(citation).to_be_visible()
    expect(page.get_by_text("Sources", exact=True).first).to_be_visible()
    number = citation.inner_text().strip("[] ")
    cards = page.get_by_test_id("stChatMessage").nth(1).locator('[class*="st-key-rag-quote-"]')
    wanted = re.compile(rf"\bst-key-rag-quote-\d+-{number}\b")
    quote = next(cards.nth(i).inner_text() for i in range(cards.count())
                 if wanted.search(cards.nth(i).get_attribute("class") or ""))
    assert quote.strip()
    _scroll_to_top_of(page.get_by_test_id("stChatMessage").first)
    _shot(page, "ask.png")

    # 2. Click it: the source view opens (a new tab) with exactly the cited passage marked, in view.
    with context.expect_page() as opened:
        citation.click()
    source = opened.value
    passage = source.locator("mark#rag-passage")
    expect(passage).to_be_visible()
    expect(passage).to_be_in_viewport()
    marked = set(passage.inner_text().split())
    shown = [w for w in quote.split() if w.isalpha() and len(w) > 3]
    assert shown and sum(w in marked for w in shown) >= 0.8 * len(shown)  # the quote is the marked passage
    _wait_idle(source)
    _shot(source, "source.png")
    source.close()

    # 3. A follow-up: searched as a standalone question, and the page says what was searched.
    _ask_and_wait(page, FOLLOW_UP)
    expect(page.get_by_text(re.compile(r"Searched for: Which port does it use by default\?"))).to_be_visible()

    # 4. Stop while the answer is written: the run ends, the model is free for the next question.
    before = _replies(page).count()
    _ask(page, SECOND)
    stop = page.get_by_role("button", name=re.compile("Stop"))
    expect(page.locator('[class*="st-key-rag-early-"]').first).to_be_visible(timeout=ANSWER_TIMEOUT_MS)  # sources first
    # The click event itself: below the fold, a click would scroll to the button and wait for it to
    # stop moving, and the streamed answer moves it until the answer is complete.
    stop.dispatch_event("click")
    expect(page.get_by_text("Stopped before the answer was finished.")).to_be_visible(timeout=ANSWER_TIMEOUT_MS)
    _wait_idle(page)
    assert _replies(page).count() == before

    # 5. Off topic: the plain refusal, the closest passages folded below it, the numbers in Details.
    refusal = _ask_and_wait(page, OFF_TOPIC)
    expect(refusal).to_have_text("I couldn't find this in your documents.")
    expect(page.get_by_text("Closest passages — not an answer").last).to_be_visible()
    _scroll_to_top_of(page.get_by_test_id("stChatMessage").nth(-2))
    _shot(page, "no-answer.png")

    # 6-7. Vietnamese, with and without tones: a reply in Vietnamese either way.
    for question in (VIETNAMESE, TONELESS):
        reply = _ask_and_wait(page, question)
        expect(reply).not_to_be_empty()
    expect(page.get_by_role("heading", name="Hỏi", exact=True)).to_be_visible()  # the page speaks Vietnamese now

    # 8. A second answerable question, after everything else: the model still answers.
    _ask_and_wait(page, SECOND)
    assert _replies(page).count() == 6  # every question got a reply, the stopped one excepted
    context.close()
