"""One streamlit.testing AppTest per page, run through app.py (the main page; the others come
from the pages/ folder) against a temp database built from docs/guide with the fake embedder;
model loaders are patched so no real model is ever loaded."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from streamlit.testing.v1 import AppTest

from rag import store
from rag.config import load_settings
from rag.ingest import ingest
from rag.text import fold

from .conftest import GUIDE, ROOT
from .fakes import FakeEmbedder

APP = str(ROOT / "app.py")
TIMEOUT = 60  # seconds per run: a cold import of the pages on a busy 2-core machine


@pytest.fixture(autouse=True)
def no_preload(monkeypatch: pytest.MonkeyPatch) -> None:
    """No background model loading: the pages' tests patch the loaders and must not load real models."""
    monkeypatch.setenv("RAG_PRELOAD_MODELS", "false")


@pytest.fixture
def fake_models() -> Iterator[FakeEmbedder]:
    """Every embedder the UI asks for is the fake one."""
    fake = FakeEmbedder()
    with mock.patch("rag.ui.embedder", lambda spec: fake):
        yield fake


@pytest.fixture
def guide_db(data_dir: Path, fake_models: FakeEmbedder, tmp_path: Path) -> Path:
    """docs/guide plus one empty (failing) file, ingested into the default database."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "empty.md").write_text("", encoding="utf-8")
    settings = load_settings()
    conn = store.open_db(settings.db_path)
    try:
        ingest(conn, [GUIDE], settings=settings, embedder=fake_models)
        ingest(conn, [broken], settings=settings, embedder=fake_models)
    finally:
        conn.close()
    return settings.db_path


def run_page(page: str, **params: str) -> AppTest:
    """Run one page as a browser would open it: app.py is the main script, and Streamlit finds
    the page in the ``pages/`` folder beside it (``app.py`` itself is the Ask page)."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    if page != "app.py":
        at.switch_page(page)
    for key, value in params.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at: AppTest) -> str:
    """Every markdown, caption, alert and title text of the last run, joined."""
    parts: list[Any] = [*at.title, *at.subheader, *at.markdown, *at.caption, *at.error, *at.info, *at.success]
    return "\n".join(str(p.value) for p in parts)


# ---------------------------------------------------------------------------------------------
# Frame


def test_app_routes_to_ask_and_draws_the_frame(guide_db: Path) -> None:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception
    assert at.title[0].value == "Ask"
    assert {m.label for m in at.sidebar.metric} == {"Documents", "Chunks", "Failed", "Stale"}


def test_frame_shows_health_and_groups_from_the_database(guide_db: Path) -> None:
    at = run_page("pages/documents.py")
    metrics = {m.label: m.value for m in at.sidebar.metric}
    assert metrics["Documents"] == "16"  # docs/guide (15 files, 3 in vi/) + empty.md
    assert metrics["Failed"] == "1"
    assert int(metrics["Chunks"]) > 20
    viewing_as = at.sidebar.multiselect(key="groups")
    assert viewing_as.value == ["all"]
    assert "admin" in viewing_as.options  # docs/guide/admin-operations.md is for admins only
    assert at.sidebar.selectbox(key="collection").value == "default"


def test_index_health_counts_the_selected_collection(guide_db: Path, fake_models: FakeEmbedder, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "vpn.md").write_text("# VPN\n\nThe VPN gateway is vpn-gw-7.\n", encoding="utf-8")
    settings = load_settings()
    conn = store.open_db(settings.db_path)
    try:
        ingest(conn, [other], settings=settings, embedder=fake_models, collection="vpn")
    finally:
        conn.close()
    at = run_page("pages/documents.py")
    assert {m.label: m.value for m in at.sidebar.metric}["Documents"] == "16"
    at.sidebar.selectbox(key="collection").select("vpn").run()
    metrics = {m.label: m.value for m in at.sidebar.metric}
    assert (metrics["Documents"], metrics["Chunks"], metrics["Failed"]) == ("1", "1", "0")
    assert "Index health of “vpn”" in [c.value for c in at.sidebar.caption]


def test_frame_on_an_empty_database_invites_to_add_documents(data_dir: Path, fake_models: FakeEmbedder) -> None:
    at = run_page("pages/documents.py")
    assert "No collection yet" in "\n".join(c.value for c in at.sidebar.caption)
    assert "No documents in this collection yet" in texts(at)


def test_frame_reports_a_bad_setting_instead_of_a_traceback(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAG_STRATEGY", "Z")
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception
    assert "strategy must be one of" in at.error[0].value


def test_sidebar_navigation_keeps_the_page_order_titles_and_url_paths(guide_db: Path) -> None:
    at = run_page("pages/chunks.py")
    links = [(link.proto.label, link.proto.page) for link in at.sidebar.get("page_link")]
    assert links == [("Ask", ""), ("Source", "source"), ("Documents", "documents"), ("Chunks", "chunks"),
                     ("Evaluation", "evaluation"), ("Settings", "settings")]
    from rag import ui

    assert ui.source_url(1, 0, 5, ["all"]).startswith(f"{links[1][1]}?")  # citation links open the Source page


def test_the_readers_groups_survive_a_page_change(guide_db: Path) -> None:
    at = run_page("pages/source.py")
    at.sidebar.multiselect(key="groups").select("admin").run()
    assert not at.exception
    at.switch_page("pages/documents.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Documents"
    assert at.sidebar.multiselect(key="groups").value == ["all", "admin"]
    at.switch_page("pages/source.py").run()
    picker = next(s for s in at.main.selectbox if s.label == "Document")
    assert any("admin-operations.md" in n for n in picker.options)  # viewing as admin now


@pytest.mark.parametrize("page", ["app.py", "pages/source.py", "pages/documents.py", "pages/chunks.py",
                                  "pages/evaluation.py", "pages/settings.py"])
def test_every_page_opens_one_database_connection_per_run(guide_db: Path, page: str) -> None:
    opened: list[Path] = []
    real_open = store.open_db

    def counting_open(path: Any) -> Any:
        opened.append(Path(path))
        return real_open(path)

    with mock.patch("rag.store.open_db", counting_open):
        run_page(page)
    assert opened == [guide_db]


def test_no_private_streamlit_switch_and_no_st_navigation() -> None:
    """pages/ is used through Streamlit's pages-directory mechanism alone (STYLE.md rules 14-15)."""
    sources = [ROOT / "app.py", ROOT / "rag" / "ui.py", *sorted((ROOT / "pages").glob("*.py"))]
    for path in sources:
        text = path.read_text(encoding="utf-8")
        for banned in ("st.navigation(", "PagesManager", "uses_pages_directory", "streamlit.runtime"):
            assert banned not in text, f"{path.name} uses {banned}"
    assert 'showSidebarNavigation = false' in (ROOT / ".streamlit" / "config.toml").read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# Documents


def test_documents_page_lists_statuses_with_the_failure_reason(guide_db: Path) -> None:
    at = run_page("pages/documents.py")
    table = at.dataframe[0].value
    assert len(table) == 16
    failed = table[table["status"] == "failed"]
    assert list(failed["document"]) == ["empty.md"]
    assert failed["reason"].iloc[0]  # the reason is shown
    assert set(table[table["status"] == "ok"]["chunks"]) and min(table[table["status"] == "ok"]["chunks"]) > 0
    assert at.button[2].label == "Retry failed (1)"  # after the two "add" buttons


def test_documents_page_ingests_a_folder_and_reports_it(
    guide_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAG_INGEST_ROOTS", str(tmp_path))
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "vpn.md").write_text("# VPN\n\nThe VPN gateway is vpn.example.org.\n", encoding="utf-8")
    at = run_page("pages/documents.py")
    at.text_input[1].input(str(extra)).run()
    at.button[1].click().run()
    assert not at.exception
    assert "1 indexed" in texts(at)
    assert "vpn.md" in list(at.dataframe[0].value["document"])


def test_documents_page_indexes_uploads_and_refuses_unsupported_types(guide_db: Path, data_dir: Path) -> None:
    at = run_page("pages/documents.py")
    at.file_uploader[0].set_value([
        ("vpn.md", b"# VPN\n\nThe VPN gateway is vpn-gw-7 and it needs the token app.\n", "text/markdown"),
        ("report.doc", b"\xd0\xcf\x11\xe0", "application/msword"),
    ]).run()
    at.button[0].click().run()
    assert not at.exception, [e.value for e in at.exception]
    shown = texts(at)
    assert "1 indexed" in shown
    assert "Not indexed: report.doc: unsupported file type '.doc'" in shown
    assert (data_dir / "uploads" / "vpn.md").is_file() and not (data_dir / "uploads" / "report.doc").exists()
    assert "vpn.md" in list(at.dataframe[0].value["document"])
    assert not at.file_uploader[0].value  # emptied: the next click must not index the same files again
    assert at.button[0].disabled


def test_documents_page_warns_when_an_upload_replaces_a_document_of_the_same_name(guide_db: Path) -> None:
    # Uploads are stored under their bare names: models.md replaced the guide's page with a "1 indexed".
    at = run_page("pages/documents.py")
    at.file_uploader[0].set_value([("models.md", b"# Totally different\n\nAnother text.\n", "text/markdown")]).run()
    at.button[0].click().run()
    assert not at.exception, [e.value for e in at.exception]
    [warning] = [w.value for w in at.warning]
    assert warning.startswith("'models.md' is now read from ") and "no longer searched" in warning


def test_documents_page_retries_failed_documents_and_reports_why_they_still_fail(guide_db: Path) -> None:
    at = run_page("pages/documents.py")
    at.button[2].click().run()  # "Retry failed (1)": empty.md is still empty
    assert not at.exception, [e.value for e in at.exception]
    assert "**empty.md** failed:" in texts(at)
    assert at.button[2].label == "Retry failed (1)"


def test_documents_page_reports_a_missing_folder(
    guide_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAG_INGEST_ROOTS", str(tmp_path))
    at = run_page("pages/documents.py")
    at.text_input[1].input(str(tmp_path / "nowhere")).run()
    at.button[1].click().run()
    assert not at.exception
    assert "no such file or folder" in texts(at)


def test_documents_page_reads_folders_only_inside_the_allowed_roots(
    guide_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    secret = tmp_path / "etc"
    secret.mkdir()
    (secret / "passwd.txt").write_text("root:x:0:0\n", encoding="utf-8")
    (allowed / "escape").symlink_to(secret)
    monkeypatch.setenv("RAG_INGEST_ROOTS", str(allowed))
    for attempt in (secret, allowed / "escape", allowed / ".." / "etc"):
        at = run_page("pages/documents.py")
        at.text_input[1].input(str(attempt)).run()
        at.button[1].click().run()
        assert not at.exception
        assert "is outside the folders the app may read" in texts(at), attempt
    assert "passwd.txt" not in list(at.dataframe[0].value["document"])
    monkeypatch.setenv("RAG_INGEST_ROOTS", "")
    at = run_page("pages/documents.py")
    assert at.text_input[1].disabled and "none (ingest_roots in rag.toml is empty)" in texts(at)


def test_documents_page_deletes_a_document(guide_db: Path) -> None:
    at = run_page("pages/documents.py")
    at.multiselect[0].select("empty.md")  # inside a form: sent with the submit click
    at.button(key="FormSubmitter:delete-Delete selected").click().run()
    assert not at.exception
    assert "Deleted 1 document(s): empty.md" in texts(at)
    assert "empty.md" not in list(at.dataframe[0].value["document"])


# ---------------------------------------------------------------------------------------------
# Chunks


def test_chunks_page_shows_content_and_text_side_by_side(guide_db: Path) -> None:
    at = run_page("pages/chunks.py")
    table = at.dataframe[0].value
    assert len(table) > 0
    assert (table["to"] > table["from"]).all()
    content, text = at.code[0].value, at.code[1].value
    assert content and content in text  # text = contextual header + content
    assert "tokens" in "\n".join(c.value for c in at.caption)


def test_chunks_page_filters_by_words(guide_db: Path) -> None:
    at = run_page("pages/chunks.py")
    before = len(at.dataframe[0].value)
    at.text_input[0].input("zzzz-no-such-word").run()
    assert not at.exception
    assert len(at.dataframe[0].value) == 0 < before
    assert "No chunk matches the filter." in texts(at)


def test_chunks_page_filter_reads_vietnamese_typed_without_tones(guide_db: Path) -> None:
    at = run_page("pages/chunks.py")
    vietnamese = next(i for i, label in enumerate(at.selectbox[0].options) if label.startswith("vi/bat-dau.md"))
    at.selectbox[0].select_index(vietnamese).run()
    content = "\n".join(c.value for c in at.code)
    word = next(w for w in content.split() if fold(w) != w.casefold() and fold(w).isalpha())  # a word with tones
    at.text_input[0].input(fold(word)).run()  # typed without them
    assert not at.exception and len(at.dataframe[0].value) > 0


@pytest.mark.parametrize(("needle", "found"), [
    ("nghi phep", True), ("NGHỈ PHÉP", True), ("lỗi", True), ("lời", False), ("duong", True), ("vpn-403", True),
])
def test_the_word_filter_is_blind_to_case_form_and_tones_typed_without(needle: str, found: bool) -> None:
    import unicodedata

    from rag.ui import filter_matches

    content = "Nghỉ phép năm 12 ngày; đường dây nóng; lỗi VPN-403"
    assert filter_matches(needle, content) is found
    assert filter_matches(unicodedata.normalize("NFD", needle), unicodedata.normalize("NFD", content)) is found


# ---------------------------------------------------------------------------------------------
# Source view


def _passage(db: Path, source: str) -> tuple[int, int, int, str]:
    conn = store.open_db(db)
    try:
        row = next(r for r in store.chunk_rows(conn) if r["source"] == source)
        return row["document_id"], row["char_from"], row["char_to"], row["content"]
    finally:
        conn.close()


def test_source_view_highlights_the_cited_range(guide_db: Path) -> None:
    doc, start, end, content = _passage(guide_db, "installation.md")
    at = run_page("pages/source.py", document=str(doc), **{"from": str(start), "to": str(end)})
    body = at.get("html")[0].proto.body
    assert '<mark id="rag-passage"' in body


    assert html.escape(content) in body.split('<mark id="rag-passage"', 1)[1]
    assert "scrollIntoView" in body


def test_source_view_shows_a_planted_markdown_title_as_text(
    guide_db: Path, fake_models: FakeEmbedder, tmp_path: Path
) -> None:
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "trap.md").write_text("---\ntitle: '[click me](http://evil.example/x)'\n---\n\nBody text.\n",
                                     encoding="utf-8")
    settings = load_settings()
    conn = store.open_db(settings.db_path)
    try:
        ingest(conn, [planted], settings=settings, embedder=fake_models)
        doc = conn.execute("SELECT id FROM documents WHERE source = 'trap.md'").fetchone()["id"]
    finally:
        conn.close()
    at = run_page("pages/source.py", document=str(doc))
    heading = at.subheader[0].value
    assert heading.startswith("\\[click me\\](")  # brackets escaped: Markdown draws no link


def test_source_view_refuses_an_admin_document_to_a_public_reader(guide_db: Path) -> None:
    doc, start, end, _ = _passage(guide_db, "admin-operations.md")
    at = run_page("pages/source.py", document=str(doc), **{"from": str(start), "to": str(end)})
    assert "is visible to all" in at.error[0].value
    assert not at.get("html")
    at = run_page("pages/source.py", document=str(doc), groups="admin", **{"from": str(start), "to": str(end)})
    assert not at.error
    assert '<mark id="rag-passage"' in at.get("html")[0].proto.body


def test_source_view_explains_a_bad_range(guide_db: Path) -> None:
    doc, _, _, _ = _passage(guide_db, "installation.md")
    at = run_page("pages/source.py", document=str(doc), **{"from": "50", "to": "999999"})
    assert "outside this document" in at.error[0].value
    assert "<mark" not in at.get("html")[0].proto.body
    at = run_page("pages/source.py", document="abc")
    assert "must be a number" in at.error[0].value


def test_source_view_refuses_an_id_beyond_sqlite_integers_with_a_message(guide_db: Path) -> None:
    # Regression: ?document=99999999999999999999 raised OverflowError (a traceback on the page).
    at = run_page("pages/source.py", document="99999999999999999999", **{"from": "0", "to": "5"})
    assert at.error[0].value == "no document 99999999999999999999 is visible to all"
    assert not at.get("html")


def test_chunks_page_runs_the_cut_audit_for_the_chosen_strategy(guide_db: Path) -> None:
    at = run_page("pages/chunks.py")
    metrics = {m.label: m.value for m in at.main.metric}
    assert int(metrics["Cuts"]) >= 0 and int(metrics["Chunks"]) >= 1
    assert metrics["Cuts mid-sentence"].startswith("0 ")  # strategy E cuts on boundaries
    strategy = next(s for s in at.selectbox if s.label == "Strategy")
    strategy.select("A").run()
    assert not at.exception
    blind = {m.label: m.value for m in at.main.metric}
    assert int(blind["Cuts mid-sentence"].split()[0]) > 0  # 512-character windows cut sentences
    assert "…" in at.dataframe[1].value["cut in context"].iloc[0]


# ---------------------------------------------------------------------------------------------
# Render helpers


def test_highlight_html_escapes_and_marks_exactly_the_range() -> None:
    from rag import ui

    text = "<b>before</b> the <script>x</script> passage & after"
    start = text.index("<script>")
    end = start + len("<script>x</script>")
    out = ui.highlight_html(text, start, end)
    assert "<script>" not in out and "<b>" not in out
    marked = out.split(f'<mark id="{ui.PASSAGE_ID}"', 1)[1].split(">", 1)[1].split("</mark>", 1)[0]
    assert marked == "&lt;script&gt;x&lt;/script&gt;"
    assert out.count("<mark") == 1
    assert "&amp; after" in out


def test_chunk_map_shades_chunks_gaps_and_overlaps() -> None:
    from rag import ui

    text = "# Title\n\nfirst chunk. shared. second"
    a, b = text.index("first"), text.index("shared")
    out = ui.chunk_map_html(text, [(0, a, b + len("shared.")), (1, b, len(text))], selected=1)
    assert f'<span style="{ui.GAP_STYLE}"># Title\n\n</span>' in out
    assert f"background:{ui.OVERLAP_COLOR};" in out and ">shared.</span>" in out
    assert f'<sup id="{ui.PASSAGE_ID}"' in out and ">#1</sup>" in out and ">#0</sup>" in out


def test_a_quote_renders_as_markdown_with_no_live_link_image_or_html() -> None:
    from rag import ui

    quote = (
        "---\ntitle: x\n---\n## Choosing another port\n\nStart the app with `make run PORT=8502` and open\n"
        "http://localhost:8502 instead. See [the guide](http://evil.example/x) or ![pixel](http://evil.example/p.png),"
        " <img src=x onerror=alert(1)>, mail root@evil.example, www.evil.example, $x^2$ & &amp; and \\`[a](b)`.\n\n"
        "```bash\nmake run PORT=8502  # [not](a link)\n```\n- a *kept* list item"
    )
    out = ui.safe_markdown(quote)
    assert "title: x" not in out  # no front matter
    assert out.startswith("**Choosing another port**")  # a heading inside a card reads as a bold line
    assert "`make run PORT=8502`" in out and "`http://localhost:8502` instead" in out  # the URL kept, as code
    assert "\\[the guide\\](`http://evil.example/x`)" in out and "!\\[pixel\\](" in out
    assert "\\<img src=x onerror=alert(1)\\>" in out and "`root@evil.example`" in out
    assert "`www.evil.example`" in out and "\\$x^2\\$ \\& \\&amp;" in out
    assert "```bash\nmake run PORT=8502  # [not](a link)\n```" in out  # fenced code stays code
    assert "- a *kept* list item" in out
    # Outside code, nothing is left that Markdown could read as a link or a tag.
    outside = re.sub(r"(`+).*?\1", "", out, flags=re.DOTALL)
    assert not re.search(r"(?<!\\)\[", outside) and not re.search(r"(?<!\\)<", outside)


def test_rows_of_a_table_cut_below_its_header_keep_their_lines() -> None:
    from rag import ui

    rows = "| `threads` | `0` | CPU threads. |\n| `seed` | `1337` | Fixed seed. |"
    assert ui.safe_markdown(rows) == "| `threads` | `0` | CPU threads. |\\\n| `seed` | `1337` | Fixed seed. |"
    table = "| a | b |\n| --- | --- |\n| 1 | 2 |"
    assert ui.safe_markdown(table) == table  # a whole table stays a table
    assert ui.section_below("Guide", "Guide > Install > Port") == "Install > Port"
    assert ui.section_below("Guide", "Guide") == "" and ui.section_below("Guide", "Other") == "Other"


def test_a_code_span_cannot_be_opened_by_an_escaped_backtick() -> None:
    from rag import ui

    # CommonMark reads "\`" as a literal backtick: the link after it would be live if the
    # span were copied through as written. Every code span is written anew instead.
    out = ui.safe_markdown("\\`[x](http://evil.example)` tail")
    assert out == "\\\\`[x](http://evil.example)` tail"  # an escaped backslash, then a code span
    outside = re.sub(r"(`+).*?\1", "", out, flags=re.DOTALL)
    assert "](" not in outside


def test_the_extractive_quote_keeps_its_address() -> None:
    # Regression: "...start the app with make run PORT=8502 and open instead." lost its URL.
    from rag.records import Hit
    from rag.verify import extractive_sentences

    content = ("The port is a Makefile variable. To run a second copy next to the first one, start the app with "
               "`make run PORT=8502` and open\nhttp://localhost:8502 instead.")
    hit = Hit(1, 1, "installation.md", "Installing", "Installing > Port", content, 0, len(content), None, 0.2)
    sentence = extractive_sentences("How do I start the app on another port?", hit, 1, None)[0]
    assert "http://localhost:8502 instead." in sentence.text


def test_timings_have_plain_labels_and_leave_out_stages_that_did_not_run() -> None:
    from rag import ui
    from rag.records import Answer

    timings = {"retrieve": 12.0, "rerank": 0.0, "gate": 0.1, "total": 13.0}
    refused = Answer("no_answer", "q", "", timings_ms=timings, trace={"stage": "hybrid"})
    assert ui.timings_text(refused) == "searching 12 ms · relevance check 0 ms · **total 13 ms**"
    written = Answer("answered", "q", "", llm_called=True, language="vi", trace={"stage": "rerank"}, timings_ms={
        **timings, "first_token": 300.0, "first_text": 1500.0, "generate": 2400.0, "verify": 4.0, "total": 2500.0})
    assert ui.timings_text(written) == (
        "tìm kiếm 12 ms · xếp hạng lại 0 ms · kiểm tra độ liên quan 0 ms · từ đầu tiên 300 ms · "
        "câu đầu tiên hiển thị 1.5 s · viết 2.4 s · kiểm chứng 4 ms · **tổng 2.5 s**")


def test_the_gate_chart_keeps_its_labels_and_legend_inside() -> None:
    from rag import ui
    from rag.evaluate import Destroyed, EvalReport, GateSweep, GoldenRef, Leaks, QueryCounts, RunConfig
    from rag.metrics import GatePoint

    curve = (GatePoint(0.5, 0, 0, 3), GatePoint(0.9, 1, 1, 0))
    sweep = GateSweep("dense", 4, "grid", 2, 2, GatePoint(0.55, 1, 1, 1, "current"), GatePoint(0.88, 0, 0, 3), curve)
    config = RunConfig("t", "c", "e", "E", ("dense",), (1, 4), 4, True, GoldenRef("g", "", 4), None, {})
    spec = ui.gate_chart(EvalReport(config, QueryCounts(4, 4, 2, 1, 1), {}, Destroyed((), 0, ()), Leaks(0, {}, ()),
                                    sweep, ())).to_dict()
    texts = [layer for layer in spec["layer"][2]["layer"]]
    assert [t["mark"]["align"] for t in texts] == ["left", "right"]  # the right-hand label is written leftwards
    legend = spec["layer"][0]["encoding"]["color"]["legend"]
    assert legend["direction"] == "vertical" and legend["labelLimit"] == 0
    assert spec["padding"]["right"] > 0


def test_source_url_carries_the_range_and_the_readers_groups() -> None:
    from rag import ui

    assert ui.source_url(7, 10, 42, ["admin", "all"]) == "source?document=7&from=10&to=42&groups=admin%2Call"


# ---------------------------------------------------------------------------------------------
# Evaluation


def test_evaluation_page_runs_the_bundled_golden_set_and_charts_it(guide_db: Path) -> None:
    at = run_page("pages/evaluation.py")
    assert "No evaluation of “default” yet" in texts(at)
    at.button(key="FormSubmitter:run-Run on “default”").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert "Run #1: 112 queries" in texts(at)
    metrics = {m.label: m.value for m in at.main.metric}
    assert metrics["Queries"] == "112"
    assert metrics["Leaks"] == "0"  # the permission filter runs inside both retrieval branches
    charts = at.get("vega_lite_chart")
    assert len(charts) == 2  # recall@k with error bars, gate sweep with the thresholds marked
    kinds, per_query, corpora = at.dataframe[0].value, at.dataframe[1].value, at.dataframe[2].value
    # The guide set: 40 questions + 40 paraphrases answerable, in English and a few in Vietnamese.
    assert list(kinds["kind"][:2]) == ["question", "paraphrase"] and list(kinds["queries"][:2]) == [40, 40]
    assert {"English", "Vietnamese, toned"} <= set(kinds["kind"]) and "hybrid R@4" in kinds.columns
    assert len(per_query) == 112 and {"rank dense", "rank fts", "rank hybrid", "gate"} <= set(per_query.columns)
    assert list(corpora["golden"]) == ["golden_guide"] and list(corpora["collection"]) == ["default"]
    # A second run on the same golden set is compared against the first one.
    at.button(key="FormSubmitter:run-Run on “default”").click().run()
    assert "Run #2" in texts(at)
    assert len(at.dataframe[2].value) == 1  # per corpus: the newest run only
    assert len(at.dataframe[-1].value) == 2  # run history


def test_evaluation_page_names_golden_quotes_no_document_holds(guide_db: Path, tmp_path: Path) -> None:
    golden = json.loads((ROOT / "docs" / "golden_guide.json").read_text(encoding="utf-8"))
    item = next(i for i in golden if i["kind"] == "answerable")
    item["evidence"] = [{"source": item["evidence"][0]["source"], "quote": "a quote this guide never wrote"}]
    path = tmp_path / "golden_typo.json"
    path.write_text(json.dumps(golden), encoding="utf-8")
    at = run_page("pages/evaluation.py")
    at.radio[0].set_value("A file on this machine").run()
    at.text_input[0].input(str(path)).run()
    at.button(key="FormSubmitter:run-Run on “default”").click().run()
    assert not at.exception, [e.value for e in at.exception]
    warning = " ".join(w.value for w in at.warning)
    assert "1 evidence quote(s) of the golden set are in no indexed document" in warning
    assert f"Items {item['id']} (" in warning and "quote not in its document" in warning
    per_query = at.dataframe[1].value
    flagged = per_query[per_query["quote in no document"]]
    assert set(flagged["id"].str.split("/").str[0]) == {item["id"]}


def test_evaluation_page_reports_a_bad_golden_path(guide_db: Path, tmp_path: Path) -> None:
    at = run_page("pages/evaluation.py")
    at.radio[0].set_value("A file on this machine").run()
    at.text_input[0].input(str(tmp_path / "missing.json")).run()
    at.button(key="FormSubmitter:run-Run on “default”").click().run()
    assert not at.exception
    assert "cannot read the golden set" in texts(at)


def test_evaluation_charts_carry_intervals_and_thresholds() -> None:
    from rag import ui
    from rag.evaluate import (
        Destroyed,
        EvalReport,
        GateSweep,
        GoldenRef,
        HitRate,
        Leaks,
        QueryCounts,
        RunConfig,
        StageResult,
    )
    from rag.metrics import GatePoint

    stages = {"dense": StageResult(2, {1: HitRate(0.5, (0.2, 0.8), 1), 4: HitRate(1.0, (0.6, 1.0), 2)},
                                   {1: 0.5, 4: 0.75}, 1.0, 0)}
    curve = (GatePoint(0.5, 0, 0, 3), GatePoint(0.7, 1, 1, 0))
    sweep = GateSweep("dense", 4, "grid", 2, 2, GatePoint(0.675, 1, 1, 1, "current"), curve[0], curve)
    config = RunConfig("t", "c", "e", "E", ("dense",), (1, 4), 4, True, GoldenRef("g", "", 4), None, {})
    report = EvalReport(config, QueryCounts(4, 4, 2, 1, 1), stages, Destroyed((), 0, ()), Leaks(0, {}, ()), sweep, ())
    frame = ui.recall_frame(report.stages, [1, 4])
    assert frame.to_dict("records")[0] == {"stage": "dense", "k": 1, "recall": 0.5, "low": 0.2, "high": 0.8}
    spec = ui.gate_chart(report).to_dict()

    def leaves(node: dict[str, Any]) -> list[dict[str, Any]]:
        return [leaf for layer in node["layer"] for leaf in (leaves(layer) if "layer" in layer else [layer])]

    layers = leaves(spec)
    kinds = [layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"] for layer in layers]
    assert kinds == ["line", "rule", "text", "text"]
    labels = {d["label"] for layer in layers[2:] for d in spec["datasets"][layer["data"]["name"]]}
    assert labels == {"current 0.675", "recommended 0.500"}
    rule_data = spec["datasets"][layers[1]["data"]["name"]]
    assert sorted(d["threshold"] for d in rule_data) == [0.5, 0.675]
    gate = ui.gate_frame(report)
    assert list(gate[gate["threshold"] == 0.7]["count"]) == [2, 0]


# ---------------------------------------------------------------------------------------------
# Ask


class ForbiddenLLM:
    """Stands in for the GGUF model where the gate must refuse: any use fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the language model was used ({name}) although the gate should refuse")


@pytest.fixture
def forbidden_llm() -> Iterator[None]:
    with mock.patch("rag.ui.llm", lambda *args: ForbiddenLLM()):
        yield


class ScriptedStream:
    """An ask_stream stand-in: real hits from the test database, a scripted answer citing [1].

    ``asked`` records each call's question and keyword arguments.
    """

    def __init__(self, status: str, db: Path, fake: FakeEmbedder) -> None:
        self.status, self.db, self.fake = status, db, fake
        self.asked: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, question: str, **kwargs: Any) -> Iterator[Any]:
        from rag.config import load_settings
        from rag.records import Answer, Retrieved, Sentence
        from rag.retrieval import search
        from rag.verify import make_citation

        self.asked.append((question, kwargs))
        settings = load_settings()
        conn = store.open_db(self.db)
        try:
            hits = search(conn, "start the app on another port", embedder=self.fake, settings=settings, k=6)
        finally:
            conn.close()
        kept, dropped = hits[:2], hits[2:]
        yield Retrieved(kept, dropped, "en", {"retrieve": 12.0, "rerank": 0.0, "gate": 0.1})
        first = "Run make run PORT=8502 to use another port [1]."
        if self.status == "answered":
            yield "Run make run PORT=8502 "
            yield "to use another port [1]."
        yield Answer(
            status=self.status, question=question,
            text=first if self.status == "answered" else kept[0].content[:80] + " [1]",
            citations=[make_citation(1, kept[0])], sentences=[Sentence(first, [1], True, 0.9)], grounded=True,
            llm_called=self.status == "answered", message="The model's sentences were not supported." if
            self.status == "extractive" else "", hits=kept, dropped=dropped, language=kwargs.get("language") or "en",
            timings_ms={"retrieve": 12.0, "rerank": 0.0, "gate": 0.1, "first_token": 450.0, "first_text": 800.0,
                        "generate": 900.0, "verify": 3.0, "total": 920.0},
            trace={"threshold": 0.675, "best_distance": kept[0].distance, "stage": "hybrid",
                   "spelling": [["prot", "port"], ["anothr", "another"]]},
        )


def _scripted_stream(status: str, db: Path, fake: FakeEmbedder) -> ScriptedStream:
    return ScriptedStream(status, db, fake)


def details_texts(at: AppTest, turn: int = 0) -> str:
    """The captions inside the Details fold of the ``turn``-th answer on the page."""
    fold = [e for e in at.expander if e.label in ("Details", "Chi tiết")][turn]
    return "\n".join(str(c.value) for c in fold.caption)


def test_ask_page_streams_an_answer_with_citation_links_sources_and_details(
    guide_db: Path, fake_models: FakeEmbedder, forbidden_llm: None
) -> None:
    with mock.patch("rag.ask.ask_stream", _scripted_stream("answered", guide_db, fake_models)):
        at = run_page("app.py")
        at.chat_input[0].set_value("How do I start the app on another port?").run()
    assert not at.exception, [e.value for e in at.exception]
    answer = next(m.value for m in at.markdown if "PORT=8502" in m.value)
    assert "source?document=" in answer and "&from=" in answer and "&to=" in answer and "groups=all" in answer
    assert answer.count("](source?") == 1  # the one [1]
    shown = texts(at)
    assert "Sources" in shown and "Open the passage" in shown
    details = details_texts(at)
    # The numbers are folded under Details, once, with plain labels and only the stages that ran.
    assert "distance" not in shown.replace(details, "") and "dense rank" not in shown
    assert "rank 1 in meaning search" in details or "in meaning search" in details
    assert "searching 12 ms" in details and "first word written 450 ms" in details
    assert "first sentence shown 800 ms" in details and "total 920 ms" in details
    assert "rerank" not in details and "first_text" not in details  # reranking was off; no raw keys
    hits = at.dataframe[0].value
    assert list(hits["gate"][:2]) == ["kept", "kept"] and len(hits) == 6
    assert "All passages found (2 used, 4 not used)" in details
    assert "Searched with the spelling mended: prot → port, anothr → another" in details


def test_ask_page_holds_a_chat_of_several_answers_of_the_same_kind(
    guide_db: Path, fake_models: FakeEmbedder, forbidden_llm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Regression: every answer drew a container with the same key, so the second answer of a kind
    # in one chat raised StreamlitDuplicateElementKey and lost the chat box.
    with mock.patch("rag.ask.ask_stream", _scripted_stream("answered", guide_db, fake_models)):
        at = run_page("app.py")
        for question in ("How do I start the app on another port?", "Which port is used by default?"):
            at.chat_input[0].set_value(question).run()
            assert not at.exception, [e.value for e in at.exception]
    assert sum("PORT=8502" in m.value and "](source?" in m.value for m in at.markdown) == 2  # two answers
    monkeypatch.setenv("RAG_MAX_DISTANCE", "0.2")
    for question in ("Quelle est la meilleure recette de soufflé au chocolat", "Recette de crêpes au sarrasin"):
        at.chat_input[0].set_value(question).run()  # real ask_stream: refused by the strict gate
        assert not at.exception, [e.value for e in at.exception]
    assert sum(m.value == "I couldn't find this in your documents." for m in at.markdown) == 2
    assert len(at.chat_input) == 1  # the chat box is still there


def test_ask_page_labels_an_extractive_answer(guide_db: Path, fake_models: FakeEmbedder, forbidden_llm: None) -> None:
    with mock.patch("rag.ask.ask_stream", _scripted_stream("extractive", guide_db, fake_models)):
        at = run_page("app.py")
        at.chat_input[0].set_value("How do I start the app on another port?").run()
    assert not at.exception
    assert any("A quote from your documents" in c.value for c in at.caption)
    assert "quoted from the best source" in details_texts(at)


def test_ask_page_refuses_in_plain_words_with_the_closest_passages_folded(
    guide_db: Path, fake_models: FakeEmbedder, forbidden_llm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fake embedder's 64 hashed dimensions put unrelated texts at random distances around 1 ± 0.15,
    # so a strict threshold makes the refusal certain; the real model is exercised by test_browser.
    monkeypatch.setenv("RAG_MAX_DISTANCE", "0.2")
    at = run_page("app.py")
    at.chat_input[0].set_value("What is the best recipe for a chocolate soufflé?").run()  # real ask_stream
    assert not at.exception, [e.value for e in at.exception]
    assert "I couldn't find this in your documents." in [m.value for m in at.markdown]
    assert not at.warning  # no "No answer." box with numbers
    closest = next(e for e in at.expander if e.label == "Closest passages — not an answer")
    assert len(closest.markdown) > 3  # up to three passages, each titled and quoted
    details = details_texts(at)
    assert "below 0.200" in details and "not asked" in details
    outside = texts(at).replace(details, "")
    assert "0.200" not in outside and "cosine" not in outside and "threshold" not in outside


def test_ask_page_speaks_the_language_of_the_question(
    guide_db: Path, fake_models: FakeEmbedder, forbidden_llm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAG_MAX_DISTANCE", "0.2")
    at = run_page("app.py")
    at.chat_input[0].set_value("Công thức làm bánh soufflé sô-cô-la ngon nhất là gì?").run()
    assert not at.exception, [e.value for e in at.exception]
    assert "Tôi không tìm thấy điều này trong tài liệu của bạn." in [m.value for m in at.markdown]
    labels = [e.label for e in at.expander]
    assert "Những đoạn gần nhất — không phải câu trả lời" in labels and "Chi tiết" in labels
    assert "nhỏ hơn 0.200" in details_texts(at)
    assert at.title[0].value == "Hỏi"  # the page follows the last question's language
    assert at.button(key="rag-new-chat").label == "Cuộc trò chuyện mới"
    assert at.chat_input[0].placeholder == "Đặt câu hỏi về tài liệu của bạn"


def test_a_follow_up_is_searched_as_a_standalone_question_and_says_so(
    guide_db: Path, fake_models: FakeEmbedder, forbidden_llm: None
) -> None:
    stream = _scripted_stream("answered", guide_db, fake_models)
    with mock.patch("rag.ask.ask_stream", stream):
        at = run_page("app.py")
        at.chat_input[0].set_value("How do I start the app on another port?").run()
        at.chat_input[0].set_value("And which port does it use by default?").run()
    assert not at.exception, [e.value for e in at.exception]
    searched, options = stream.asked[1]
    assert searched == "Which port does it use by default? (start app another)" and options["language"] == "en"
    assert stream.asked[0][0] == "How do I start the app on another port?"  # the first one as typed
    captions = [c.value for c in at.caption]
    assert any("Searched for: Which port does it use by default? (start app another)" in c for c in captions)
    assert sum("Searched for" in c for c in captions) == 1


def test_the_chat_is_kept_across_reloads_and_a_new_chat_starts_empty(
    guide_db: Path, fake_models: FakeEmbedder, forbidden_llm: None
) -> None:
    with mock.patch("rag.ask.ask_stream", _scripted_stream("answered", guide_db, fake_models)):
        at = run_page("app.py")
        at.chat_input[0].set_value("How do I start the app on another port?").run()
        reloaded = run_page("app.py")  # a new session: the chat comes back from the database
        assert [m.value for m in reloaded.chat_message[0].markdown] == ["How do I start the app on another port?"]
        assert any("PORT=8502" in m.value for m in reloaded.markdown)
        reloaded.button(key="rag-new-chat").click().run()
        assert not reloaded.exception
        assert not reloaded.chat_message  # an empty chat, with the examples again
        assert reloaded.button(key="rag-example-0")
        reloaded.chat_input[0].set_value("Which port is used by default?").run()
    again = run_page("app.py")
    users = [msg.markdown[0].value for msg in again.chat_message if msg.name == "user"]
    assert users == ["Which port is used by default?"]  # the newest chat is the one reopened


def test_ask_again_replaces_the_last_answer(guide_db: Path, fake_models: FakeEmbedder, forbidden_llm: None) -> None:
    stream = _scripted_stream("answered", guide_db, fake_models)
    with mock.patch("rag.ask.ask_stream", stream):
        at = run_page("app.py")
        at.chat_input[0].set_value("How do I start the app on another port?").run()
        at.button(key="rag-again").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert [q for q, _ in stream.asked] == ["How do I start the app on another port?"] * 2
    users = [msg for msg in at.chat_message if msg.name == "user"]
    assert len(users) == 1  # replaced, not added


def test_every_answer_can_be_copied_as_plain_text(guide_db: Path, fake_models: FakeEmbedder,
                                                  forbidden_llm: None) -> None:
    with mock.patch("rag.ask.ask_stream", _scripted_stream("answered", guide_db, fake_models)):
        at = run_page("app.py")
        at.chat_input[0].set_value("How do I start the app on another port?").run()
    assert [c.value for c in at.main.code] == ["Run make run PORT=8502 to use another port [1]."]


def test_a_stopped_answer_is_reported_and_can_be_asked_again(
    guide_db: Path, fake_models: FakeEmbedder, forbidden_llm: None
) -> None:
    from rag import ui

    stream = _scripted_stream("answered", guide_db, fake_models)
    with mock.patch("rag.ask.ask_stream", stream):
        at = AppTest.from_file(APP, default_timeout=TIMEOUT)
        at.session_state[ui.ASKING_KEY] = "How do I start the app on another port?"  # the last run was stopped
        at.run()
        assert not at.exception
        assert "Stopped before the answer was finished." in [i.value for i in at.info]
        at.button(key="rag-again-stopped").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert [q for q, _ in stream.asked] == ["How do I start the app on another port?"]
    assert not at.info


def test_stream_answer_closes_the_stream_when_the_run_is_interrupted(monkeypatch: pytest.MonkeyPatch) -> None:
    # A Stop click interrupts the script run with an exception at the next Streamlit call; the
    # answer stream must be closed then, or the model would stay locked.
    from rag import ui
    from rag.records import Retrieved

    closed: list[bool] = []

    def events() -> Iterator[Any]:
        try:
            yield Retrieved()
            yield "One sentence [1]."
            yield "Another one [1]."
        finally:
            closed.append(True)

    def interrupted(text: str) -> str:
        raise RuntimeError("stopped by the reader")

    monkeypatch.setattr(ui, "safe_markdown", interrupted)
    with pytest.raises(RuntimeError, match="stopped by the reader"):
        ui.stream_answer(events(), ["all"], "en")
    assert closed == [True]


def test_the_landing_page_shows_what_is_indexed_and_asks_an_example(
    guide_db: Path, fake_models: FakeEmbedder, forbidden_llm: None
) -> None:
    stream = _scripted_stream("answered", guide_db, fake_models)
    with mock.patch("rag.ask.ask_stream", stream):
        at = run_page("app.py")
        shown = texts(at)
        assert "**16** documents in “default”" in shown and "fake/hash-bow-64" in shown
        examples = [at.button(key=f"rag-example-{n}").label for n in range(3)]
        assert examples[0] == "How do I start the app on another port?"
        at.button(key="rag-example-0").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert [q for q, _ in stream.asked] == [examples[0]]
    assert not any(b.key == "rag-example-0" for b in at.button)  # a chat now: no examples


def test_an_answer_given_to_more_groups_is_hidden_from_a_reader_with_fewer(
    guide_db: Path, fake_models: FakeEmbedder, forbidden_llm: None
) -> None:
    from rag import conversation
    from rag.records import Answer

    conn = store.open_db(guide_db)
    try:
        answer = Answer("answered", "q", "The admin page says secret things [1].", language="en")
        conversation.save_turn(conn, collection="default", chat_id="c1", question="What does the admin page say?",
                               searched="What does the admin page say?", answer=answer, groups=["all", "admin"])
    finally:
        conn.close()
    at = run_page("app.py")
    assert not any("secret things" in m.value for m in at.markdown)
    assert any("switch *viewing as*" in i.value for i in at.info)


def test_ask_page_reports_a_question_that_cannot_be_searched(
    guide_db: Path, fake_models: FakeEmbedder, forbidden_llm: None
) -> None:
    at = run_page("app.py")
    at.chat_input[0].set_value("???").run()
    assert not at.exception
    assert "nothing to search for" in at.error[0].value


def test_the_app_loads_the_models_in_the_background_once(
    guide_db: Path, fake_models: FakeEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded: list[tuple[Any, ...]] = []
    monkeypatch.setenv("RAG_PRELOAD_MODELS", "true")
    with mock.patch("rag.ui.llm", lambda *args: loaded.append(args)):
        at = run_page("app.py")
        at.run()  # a second run starts no second thread
        from rag import ui

        settings = load_settings()
        thread = ui.warm_models(str(settings.db_path), "default", settings.llm_path, settings)
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert loaded == [(settings.llm_path, settings.n_ctx, settings.threads, settings.seed)]
    assert fake_models.calls >= 1  # the collection's embedder was called once to warm it


def test_answer_markdown_links_each_marker_and_escapes_the_rest() -> None:
    from rag import ui
    from rag.records import Answer, Citation, Hit

    hit = Hit(5, 9, "a.md", "A", "A > B", "quoted", 10, 16, None, 0.2)
    citation = Citation(1, 5, "A", "a.md", "A > B", "#char=10,16", 10, 16, None, "quoted", 0.2)
    answer = Answer("answered", "q", "Use <b>$x</b> [see](here) [1] and [1, 3].", citations=[citation], hits=[hit])
    out = ui.answer_markdown(answer, ["all"])
    link = '[\\[1\\]](source?document=9&from=10&to=16&groups=all "A — A > B")'
    assert out == f"Use \\<b\\>\\$x\\</b\\> \\[see\\](here) {link} and {link}\\[3\\]."


def test_scroll_script_survives_streamlits_html_sanitiser() -> None:
    """DOMPurify drops an element whose text holds "<" + a letter or digit, so the script may not."""
    import re

    from rag import ui

    script = ui.scroll_script()
    body = script.removeprefix("<script>").removesuffix("</script>")
    assert script != body and "scrollIntoView" in body and ui.PASSAGE_ID in body
    assert not re.search(r"<[/\w!]", body)


def test_evaluation_page_charts_a_saved_strategy_table(guide_db: Path) -> None:
    import json

    def row(strategy: str, r1: float, r4: float) -> dict[str, Any]:
        return {
            "strategy": strategy, "recall@1": {"value": r1, "ci": [r1 / 2, (1 + r1) / 2], "hits": 1},
            "recall@4": {"value": r4, "ci": [r4 / 2, (1 + r4) / 2], "hits": 2}, "mrr": r1, "destroyed": 0,
            "chunks": 10, "embedded_tokens": 1000, "truncated": 0, "leaks": 0,
        }

    saved = {"stage": "dense", "ks": [1, 4], "golden": "golden_guide", "rows": [row("A", 0.3, 0.6), row("E", 0.5, 0.9)],
             "sign_tests": [{"a": "E", "b": "A", "k": 4, "wins": 5, "losses": 1, "p": 0.21875}], "ranks": {}}
    at = run_page("pages/evaluation.py")
    upload = ("strategies.json", json.dumps(saved).encode(), "application/json")
    at.file_uploader(key="strategy_upload").set_value(upload).run()
    assert not at.exception, [e.value for e in at.exception]
    assert len(at.get("vega_lite_chart")) == 1
    table = at.dataframe[0].value
    assert list(table["strategy"]) == ["A", "E"] and list(table["R@4"]) == [0.6, 0.9]
    assert "Paired sign tests" in texts(at)


def test_evaluation_page_refuses_a_json_that_is_not_a_strategy_table(guide_db: Path) -> None:
    at = run_page("pages/evaluation.py")
    at.file_uploader(key="strategy_upload").set_value(("x.json", b'{"rows": []}', "application/json")).run()
    assert not at.exception
    assert "is not the JSON of `rag eval strategies --json OUT`" in at.error[0].value


def test_source_view_without_a_link_offers_only_the_readers_documents(guide_db: Path) -> None:
    at = run_page("pages/source.py")
    picker = next(s for s in at.main.selectbox if s.label == "Document")
    names = picker.options  # as shown: "Title (source)"
    assert len(names) == 14 and not any("admin-operations.md" in n for n in names)
    assert any("(installation.md)" in n for n in names)
    assert "<mark" not in at.get("html")[0].proto.body


# ---------------------------------------------------------------------------------------------
# Settings


def test_settings_page_saves_a_validated_file(guide_db: Path, data_dir: Path) -> None:
    at = run_page("pages/settings.py")
    at.radio[0].set_value("e5")
    at.radio[1].set_value("gemma")
    examiner = "qwen-1.5b" if load_settings().answer_examiner == "off" else "off"  # not the default, whichever
    at.radio[2].set_value(examiner)
    at.radio[3].set_value("off")
    retry = not load_settings().answer_retry
    at.checkbox[0].set_value(retry)
    at.number_input[0].set_value(0.6)
    at.button(key="FormSubmitter:settings-Save settings").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert "Saved to" in texts(at)
    settings = load_settings()
    chosen = (settings.embedder, settings.llm_path, settings.answer_examiner, settings.answer_retry, settings.rewrite,
              settings.max_distance)
    assert chosen == ("e5", "gemma", examiner, retry, "off", 0.6)
    at.radio[1].set_value("a GGUF file")
    at.text_input[0].input("/nowhere/model.gguf")
    at.button(key="FormSubmitter:settings-Save settings").click().run()
    assert "no GGUF model file at /nowhere/model.gguf" in texts(at)
    assert load_settings().llm_path == "gemma"  # nothing written
    at.radio[1].set_value("a GGUF file")  # and no file: it saved the default model and said "Saved"
    at.text_input[0].input("")
    at.button(key="FormSubmitter:settings-Save settings").click().run()
    assert "name the GGUF file to use" in texts(at) and load_settings().llm_path == "gemma"


def test_settings_page_lists_the_model_files_and_deletes_what_nothing_loads(guide_db: Path) -> None:
    from .fakes import old_install_models

    at = run_page("pages/settings.py")
    assert "holds 0 MB" in texts(at) and not any(b.label.startswith("Delete the files") for b in at.button)
    source, copy = old_install_models()
    at.run()
    table = at.dataframe[0].value
    assert dict(zip(table["file"], table["deleted by the button"], strict=True)) == {source.name: True,
                                                                                     copy.name: False}
    next(b for b in at.button if b.label == "Delete the files nothing loads (2 MB)").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert "Deleted 1 file(s), 2 MB." in texts(at)
    assert not source.exists() and copy.exists()
    assert not any(b.label.startswith("Delete the files") for b in at.button)


def test_settings_page_applies_the_last_runs_recommended_threshold(guide_db: Path) -> None:
    at = run_page("pages/settings.py")
    assert "No evaluation run of this collection yet" in texts(at)
    at.switch_page("pages/evaluation.py").run()
    at.button(key="FormSubmitter:run-Run on “default”").click().run()
    assert not at.exception
    at.switch_page("pages/settings.py").run()
    apply = next(b for b in at.button if b.label.startswith("Apply the recommended value"))
    recommended = float(apply.label.split()[4])
    apply.click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert f"now refuses beyond {recommended:.3f}" in texts(at)
    assert f"**{recommended:.3f}** (the collection's own" in texts(at)
