"""The one Streamlit module under ``rag/``: cached model loaders, the sidebar frame shared by
every page, and small render helpers (highlighted source text, citation links).

Pages stay thin (read widgets -> call one ``rag`` function -> render); what they need beyond
the pipeline modules lives here. Only models are cached (``st.cache_resource``, keyed by their
spec or path); a database connection is opened per call with ``connection()`` and closed after,
because a ``sqlite3.Connection`` is bound to the thread that made it and Streamlit reruns a
session on any thread of its pool.
"""

from __future__ import annotations

import html
import itertools
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import altair as alt
import pandas as pd
import streamlit as st

from rag import store
from rag.audit import CutAudit, audit_cuts, describe_cut
from rag.config import Settings, data_dir, load_settings
from rag.embedding import Embedder, load_embedder
from rag.errors import ExtractionError, NotFoundError, RagError
from rag.evaluate import Golden, parse_golden
from rag.extract import extractor_for
from rag.ingest import IndexHealth, IngestReport, choose_embedder, document_statuses, index_health, spec_for_model_id
from rag.llm import LanguageModel, load_language_model
from rag.models import Answer, Citation, DocumentInfo, Extracted, Hit
from rag.verify import MARKER as CITATION_MARKER

Chart = alt.LayerChart | alt.FacetChart  # what the chart builders return (.properties() may facet)
VIEW_KEY = "_rag_view"  # session_state slot holding this run's View (set by frame(), dropped by app.py)
NEXT_COLLECTION_KEY = "_rag_next_collection"  # a collection the sidebar must select on the next run
SOURCE_PAGE = "source"  # url_path of pages/source.py (see app.py)
EMBEDDER_CHOICES = ("minilm", "e5", "auto", "minilm-fp32")  # offered for NEW collections (issue 9)


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


@st.cache_resource(show_spinner="Loading the embedding model…", max_entries=2)
def embedder(spec: str) -> Embedder:
    """An embedding model by name ("minilm", "e5") or directory path, loaded once per process."""
    return load_embedder(spec)


def _close_llm(model: LanguageModel) -> None:
    model.close()


@st.cache_resource(show_spinner="Loading the language model…", max_entries=1, on_release=_close_llm)
def llm(path: str, n_ctx: int, threads: int, seed: int) -> LanguageModel:
    """The GGUF model (empty path = bundled Gemma-3-270M), built once per process.

    Shared by every session's thread: the model holds its own lock around every call.
    """
    return load_language_model(path, n_ctx=n_ctx, threads=threads, seed=seed)


def collection_embedder(settings: Settings, collection: str) -> Embedder:
    """The embedding model a collection was built with (never another one)."""
    with connection(settings) as conn:
        coll = store.require_collection(conn, collection)
    return embedder(spec_for_model_id(coll.embedder))


def ingest_embedder(
    settings: Settings, collection: str, choice: str, paths: Sequence[str | Path]
) -> tuple[Embedder, str | None]:
    """The model to ingest with and a note about the choice (``rag.ingest.choose_embedder``).

    An existing collection keeps its own model; a new one takes ``choice`` ("minilm", "e5", or
    "auto": chosen from the language of the files).
    """
    with connection(settings) as conn:
        picked = choose_embedder(conn, paths, requested=choice or None, settings=settings, collection=collection)
    return embedder(picked.spec), picked.note


# ---------------------------------------------------------------------------------------------
# The frame: sidebar with database, collection, "viewing as" groups and index health


@dataclass(frozen=True, slots=True)
class View:
    """What the sidebar selected for this run; every page reads it with ``current_view()``."""

    settings: Settings
    collection: str  # the selected collection (settings.collection when the database is empty)
    collections: list[str]
    groups: list[str]  # the reader's groups ("viewing as")
    known_groups: list[str]
    health: IndexHealth


def known_groups(infos: Sequence[DocumentInfo]) -> list[str]:
    """Every group some document names, plus the public group, sorted."""
    return sorted({g for d in infos for g in d.groups} | {store.PUBLIC_GROUP})


def groups_from_param(raw: str | None, known: Sequence[str]) -> list[str]:
    """``?groups=a,b`` (as carried by citation links) restricted to groups the database knows."""
    wanted = [g.strip() for g in (raw or "").split(",") if g.strip()]
    return [g for g in wanted if g in known] or [store.PUBLIC_GROUP]


def read_frame(settings: Settings) -> tuple[list[str], list[DocumentInfo], IndexHealth]:
    """Collections, documents and index health, read through one short-lived connection."""
    with connection(settings) as conn:
        names = [c.name for c in store.list_collections(conn)]
        infos = document_statuses(conn, settings)
        health = index_health(conn, settings)
    return names, infos, health


def frame() -> View:
    """Render the sidebar and return the selection; on a RagError show it and stop the run."""
    try:
        settings = load_settings()
        names, infos, health = read_frame(settings)
    except RagError as e:
        st.error(str(e))
        st.stop()
        raise  # st.stop() raises; this line only tells type checkers so
    collections = names or [settings.collection]
    groups = known_groups(infos)
    if "groups" not in st.session_state:
        st.session_state["groups"] = groups_from_param(st.query_params.get("groups"), groups)
    else:  # a group may have disappeared with its last document
        st.session_state["groups"] = [g for g in st.session_state["groups"] if g in groups]
    pending = st.session_state.pop(NEXT_COLLECTION_KEY, None)
    if pending in collections:
        st.session_state["collection"] = pending
    if st.session_state.get("collection") not in collections:
        wanted = st.query_params.get("collection") or settings.collection
        st.session_state["collection"] = wanted if wanted in collections else collections[0]

    with st.sidebar:
        st.caption("Database")
        st.code(str(settings.db_path), language=None, wrap_lines=True)
        collection = st.selectbox("Collection", collections, key="collection")
        reader = st.multiselect(
            "Viewing as",
            groups,
            key="groups",
            help="The groups of the person asking. Documents are visible to readers who share at least "
            "one group with them; everyone holds 'all'. Switch to show what a given reader can see.",
        )
        st.divider()
        st.caption("Index health")
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
    view = View(settings, collection, names, list(reader) or [store.PUBLIC_GROUP], groups, health)
    st.session_state[VIEW_KEY] = view
    return view


def select_collection_next_run(name: str) -> None:
    """Make the sidebar select ``name`` on the next run (a drawn widget cannot be changed)."""
    st.session_state[NEXT_COLLECTION_KEY] = name


def current_view() -> View:
    """The View the frame built for this run through app.py.

    A page file can also run WITHOUT app.py: Streamlit finds the top-level ``pages/`` folder our
    layout keeps, and until some session has run app.py's ``st.navigation`` it serves a deep link
    (say ``/source?...`` as the first request after a restart) in its legacy pages-folder mode,
    straight from the page file. Then the legacy mode is switched off and the run restarted, so
    app.py routes it (url paths equal the file names, so the same page and query come back).
    A page run on its own (AppTest) draws the frame itself.
    """
    view = st.session_state.get(VIEW_KEY)
    if isinstance(view, View):
        return view
    if _leave_legacy_pages_mode():
        st.rerun()
    view = frame()
    forget_view()  # no app.py run owns it: the next run must draw the frame again
    return view


def forget_view() -> None:
    """Called by app.py when a run ends, so a later run without app.py cannot see a stale View."""
    st.session_state.pop(VIEW_KEY, None)


def _leave_legacy_pages_mode() -> bool:
    """Turn off Streamlit's pages-folder mode if it is on; True when it was.

    ``PagesManager.uses_pages_directory`` is what ``st.navigation`` itself sets to False on its
    first call (streamlit/commands/navigation.py); it is internal, hence the defensive lookup.
    """
    try:
        from streamlit.runtime.pages_manager import PagesManager
    except ImportError:  # pragma: no cover - a Streamlit without it has no legacy mode to leave
        return False
    if getattr(PagesManager, "uses_pages_directory", None) is True and Path(_main_script()).name == "app.py":
        PagesManager.uses_pages_directory = False
        return True
    return False


def _main_script() -> str:
    from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

    ctx = get_script_run_ctx()
    return str(ctx.pages_manager.main_script_path) if ctx is not None else ""


def stop_on(error: RagError) -> None:
    """The one way pages report a known error: a message, never a traceback."""
    st.error(str(error))
    st.stop()


# ---------------------------------------------------------------------------------------------
# Documents page helpers


def save_uploads(files: Sequence[Any], folder: Path | None = None) -> tuple[list[Path], list[str]]:
    """Write uploaded files (objects with ``.name`` and ``.getvalue()``) under the data dir.

    Returns the saved paths and one message per file that was refused (unsupported type, bad
    name). Names are reduced to their last component, so an upload cannot escape the folder.
    """
    target = folder or data_dir() / "uploads"
    saved: list[Path] = []
    refused: list[str] = []
    for upload in files:
        name = Path(str(upload.name)).name
        if not name or name in {".", ".."}:
            refused.append(f"{upload.name!r}: not a usable file name")
            continue
        try:
            extractor_for(Path(name))
        except ExtractionError as e:
            refused.append(f"{name}: {e}")
            continue
        target.mkdir(parents=True, exist_ok=True)
        path = target / name
        path.write_bytes(upload.getvalue())
        saved.append(path)
    return saved, refused


def flash(kind: str, message: str) -> None:
    """Queue a message for the next run (actions rerun the app so the sidebar health updates)."""
    st.session_state.setdefault("_rag_flash", []).append((kind, message))


def show_flash() -> None:
    """Show and forget the messages queued by ``flash``."""
    for kind, message in st.session_state.pop("_rag_flash", []):
        {"success": st.success, "error": st.error, "warning": st.warning}.get(kind, st.info)(message)


def report_messages(report: IngestReport) -> None:
    """Queue an ingest report: the one-line summary and one error per failed file."""
    flash("error" if report.failed else "success", report.summary())
    for failed in report.failed:
        flash("error", f"**{failed.source}** failed: {failed.error}")


# ---------------------------------------------------------------------------------------------
# Source view


def readable_document(conn: store.Connection, document_id: int, groups: Sequence[str]) -> Any:
    """The document row if a reader with ``groups`` may see it; otherwise NotFoundError.

    The same wording for "missing" and "not yours", so a link cannot probe for documents.
    """
    try:
        row = store.get_document(conn, document_id)
    except NotFoundError:
        row = None
    if row is None or row["access_key"] not in store.visible_access_keys(conn, groups):
        raise NotFoundError(f"no document {document_id} is visible to {', '.join(groups)}")
    return row


def indexed_documents(conn: store.Connection, collection: str) -> list[Any]:
    """Documents of a collection that have chunks (status ok), in source order."""
    return [r for r in store.document_rows(conn, collection) if r["status"] == "ok"]


def readable_documents(conn: store.Connection, collection: str, groups: Sequence[str]) -> list[Any]:
    """Indexed (status ok) documents of a collection that a reader with ``groups`` may see."""
    keys = set(store.visible_access_keys(conn, groups))
    return [r for r in store.document_rows(conn, collection) if r["status"] == "ok" and r["access_key"] in keys]


def parse_document_id(raw: Any) -> int:
    try:
        return int(str(raw))
    except ValueError as e:
        raise RagError(f"the document parameter must be a number (got {raw!r})") from e


def json_list(raw: str | None) -> list[str]:
    """A JSON list column (documents.groups) as a Python list."""
    import json

    value = json.loads(raw or "[]")
    return [str(v) for v in value] if isinstance(value, list) else []


def parse_range(params: Any, length: int) -> tuple[int, int] | None:
    """``from``/``to`` query parameters as a valid range inside a text of ``length``, or None."""
    raw_from, raw_to = params.get("from"), params.get("to")
    if raw_from is None and raw_to is None:
        return None
    try:
        start, end = int(str(raw_from)), int(str(raw_to))
    except ValueError as e:
        raise RagError(f"the passage range must be two whole numbers (got from={raw_from!r}, to={raw_to!r})") from e
    if not 0 <= start < end <= length:
        raise RagError(f"the passage range {start}–{end} lies outside this document (0–{length})")
    return start, end


def source_url(document_id: int, char_from: int, char_to: int, groups: Sequence[str]) -> str:
    """The source-view link for a passage (relative: it works under any base URL path)."""
    query = urlencode({"document": document_id, "from": char_from, "to": char_to, "groups": ",".join(groups)})
    return f"{SOURCE_PAGE}?{query}"


SOURCE_BOX = (
    "white-space: pre-wrap; overflow-wrap: anywhere; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; "
    "font-size: 0.85rem; line-height: 1.5; max-height: 70vh; overflow-y: auto; padding: 0.75rem 1rem; "
    "border: 1px solid rgba(49, 51, 63, 0.2); border-radius: 0.5rem; background: #fafafa;"
)
PASSAGE_ID = "rag-passage"


def highlight_html(text: str, char_from: int, char_to: int, anchor: str = PASSAGE_ID) -> str:
    """The whole text, HTML-escaped, with ``text[char_from:char_to]`` in a ``<mark id=anchor>``."""
    return (
        f'<div class="rag-source" style="{SOURCE_BOX}">{html.escape(text[:char_from])}'
        f'<mark id="{html.escape(anchor)}" style="background: #ffe066; padding: 0.1rem 0;">'
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


CHUNK_COLORS = ("#d0ebff", "#d3f9d8")  # alternating chunks
OVERLAP_COLOR = "#ffd8a8"  # text covered by two or more chunks
GAP_STYLE = "color: #868e96;"  # text in no chunk (headings, front matter, blank lines)


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
# Cut-position audit (rag.audit)


def stored_extracted(row: Any) -> Extracted:
    """A stored document row back as the ``Extracted`` the chunker reads (no file access).

    Markdown front matter is found again so the body starts where ingest started it. PDF page
    spans are not stored, so a PDF is audited as one page.
    """
    from rag.extract import split_front_matter

    text = row["canonical_text"] or ""
    metadata: dict[str, Any] = {}
    body_start = 0
    if row["extractor"] == "markdown":
        metadata, body_start = split_front_matter(text)
    return Extracted(text, row["title"], row["extractor"] or "text", row["extractor_version"] or "", body_start,
                     (), metadata)


def audit_document(row: Any, strategy: str, model: Embedder, settings: Settings) -> CutAudit:
    """The cut-position audit of a stored document under ``strategy``, in the model's tokens."""
    from rag.ingest import chunk_budget

    try:
        return audit_cuts(
            stored_extracted(row), strategy, budget=chunk_budget(settings, model),
            count_tokens=model.count_tokens, max_tokens=model.max_tokens,
        )
    except ValueError as e:
        raise RagError(str(e)) from e


def audit_table(text: str, audit: CutAudit) -> list[dict[str, Any]]:
    """One row per cut that falls outside every sentence and block boundary, with its context."""
    return [{"offset": offset, "cut in context": describe_cut(text, offset)} for offset in audit.outside_at]


# ---------------------------------------------------------------------------------------------
# Evaluation charts and tables (rag.evaluate reports)


def recall_frame(stages: Mapping[str, Any], ks: Sequence[int]) -> pd.DataFrame:
    """One row per stage and k: recall@k with its Wilson 95 % interval."""
    rows = []
    for stage, block in stages.items():
        for k in ks:
            cell = block[f"recall@{k}"]
            rows.append({"stage": stage, "k": int(k), "recall": cell["value"], "low": cell["ci"][0],
                         "high": cell["ci"][1]})
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


def recall_chart(report: Mapping[str, Any]) -> Chart:
    """recall@k per stage, points with Wilson 95 % error bars."""
    data = recall_frame(report["stages"], report["config"]["ks"])
    return _interval_chart(data, "k", "k (hits looked at)", "stage", "stage")


GATE_SERIES = ("bluffs (must-refuse queries let through)", "lost answers (answerable queries refused)")


def gate_frame(report: Mapping[str, Any]) -> pd.DataFrame:
    """The gate sweep in long form: threshold, what (bluffs | lost answers), count."""
    rows = []
    for point in report["gate"]["curve"]:
        rows.append({"threshold": point["threshold"], "what": GATE_SERIES[0], "count": point["bluffs"]})
        rows.append({"threshold": point["threshold"], "what": GATE_SERIES[1], "count": point["lost"]})
    return pd.DataFrame(rows, columns=["threshold", "what", "count"])


def gate_chart(report: Mapping[str, Any]) -> Chart:
    """Bluffs and lost answers against the threshold, with the current and recommended thresholds marked."""
    gate = report["gate"]
    lines = alt.Chart(gate_frame(report)).mark_line(point=True).encode(
        x=alt.X("threshold:Q", title="gate threshold (cosine distance)", scale=alt.Scale(zero=False)),
        y=alt.Y("count:Q", title="queries"),
        color=alt.Color("what:N", title=None, legend=alt.Legend(orient="bottom", labelLimit=320),
                        scale=alt.Scale(domain=list(GATE_SERIES), range=["#e03131", "#1c7ed6"])),
        tooltip=["threshold:Q", "what:N", "count:Q"],
    )
    marks = pd.DataFrame([
        {"threshold": gate["current"]["threshold"], "label": f"current {gate['current']['threshold']:.3f}", "dy": -6},
        {"threshold": gate["recommended"]["threshold"], "label": f"recommended {gate['recommended']['threshold']:.3f}",
         "dy": 8},
    ])
    rules = alt.Chart(marks).mark_rule(strokeDash=[6, 4], color="#495057").encode(x="threshold:Q", tooltip=["label:N"])
    # Two label rows (one layer each: a text mark's offset is not an encoding), so close thresholds stay legible.
    labels = alt.layer(*[
        alt.Chart(marks.iloc[[i]]).mark_text(align="left", dx=4, dy=int(marks["dy"].iloc[i]), color="#495057")
        .encode(x="threshold:Q", y=alt.value(6), text="label:N")
        for i in range(len(marks))
    ])
    return alt.layer(lines, rules, labels).properties(height=300)


def strategy_frame(result: Mapping[str, Any]) -> pd.DataFrame:
    rows = []
    for row in result["rows"]:
        for k in result["ks"]:
            cell = row[f"recall@{k}"]
            rows.append({"strategy": row["strategy"], "k": f"R@{k}", "recall": cell["value"], "low": cell["ci"][0],
                         "high": cell["ci"][1]})
    return pd.DataFrame(rows, columns=["strategy", "k", "recall", "low", "high"])


def strategy_chart(result: Mapping[str, Any]) -> Chart:
    """recall@k per chunking strategy with Wilson 95 % error bars."""
    return _interval_chart(strategy_frame(result), "strategy", "chunking strategy", "k", "cut-off")


def strategy_table(result: Mapping[str, Any]) -> pd.DataFrame:
    rows = []
    for row in result["rows"]:
        rows.append({
            "strategy": row["strategy"],
            **{f"R@{k}": row[f"recall@{k}"]["value"] for k in result["ks"]},
            "MRR": row["mrr"], "destroyed": row["destroyed"], "chunks": row["chunks"],
            "embedded tokens": row["embedded_tokens"], "truncated": row["truncated"], "leaks": row["leaks"],
        })
    return pd.DataFrame(rows)


def per_query_frame(report: Mapping[str, Any], flipped: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per query: kind, text, first relevant rank per stage, gate outcome, flips since the last run."""
    stages = list(report["stages"])
    changes: dict[str, list[str]] = {}
    for f in flipped:
        changes.setdefault(f["query"], []).append(
            f"{f['stage']} {f['change']} ({_rank_text(f['before'])} → {_rank_text(f['after'])})"
        )
    rows = []
    for q in report["per_query"]:
        rows.append({
            "id": q["id"], "kind": q["kind"], "query": q["query"], "groups": ", ".join(q["groups"]),
            **{f"rank {s}": q["ranks"].get(s) for s in stages},
            "gate": q["gate"] or "", "destroyed": q["destroyed"], "leaks": ", ".join(q["leaks"]),
            "flip since previous run": "; ".join(changes.get(q["id"], [])),
        })
    return pd.DataFrame(rows)


def _rank_text(rank: int | None) -> str:
    return "–" if rank is None else str(rank)


def history_frame(runs: Sequence[Mapping[str, Any]], k: int = 8) -> pd.DataFrame:
    """Recent runs, newest first: configuration and recall@k per stage."""
    rows = []
    for run in runs:
        metrics = run["metrics"]
        rows.append({
            "run": run["id"], "when": run["created_at"], "golden": run["golden_name"], "model": run["embedder"],
            "strategy": run["strategy"],
            **{f"R@{k} {s}": (metrics[s].get(f"recall@{k}") or {}).get("value") for s in run["stages"]},
            "leaks": run["leaks"], "destroyed": run["destroyed"], "threshold": run["threshold"],
            "recommended": run["recommended_threshold"], "commit": (run["git_commit"] or "")[:10],
        })
    return pd.DataFrame(rows)


REPO_DOCS = Path(__file__).resolve().parent.parent / "docs"
BUNDLED_GOLDEN = REPO_DOCS / "golden_guide.json"  # the demo corpus's golden set
BUNDLED_CORPUS = REPO_DOCS / "guide"
BUNDLED_ACL = REPO_DOCS / "acl_guide.json"


def golden_from_upload(upload: Any) -> Golden:
    """A golden set from an uploaded JSON file (same checks as ``evaluate.load_golden``)."""
    import hashlib
    import json

    data = upload.getvalue()
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RagError(f"cannot read the golden set {upload.name}: {e}") from e
    return parse_golden(raw, Path(str(upload.name)).stem, hashlib.sha256(data).hexdigest())


def strategies_from_upload(upload: Any) -> dict[str, Any]:
    """A strategy table saved by ``rag eval strategies --json OUT``."""
    import json

    try:
        result = json.loads(upload.getvalue().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RagError(f"cannot read the strategy table {upload.name}: {e}") from e
    if not isinstance(result, dict) or not {"rows", "ks", "stage"} <= result.keys():
        raise RagError(f"{upload.name} is not the JSON of `rag eval strategies --json OUT`")
    return result


# ---------------------------------------------------------------------------------------------
# Ask page: streaming, the answer with citation links, sources, timings and hits

_MD_SPECIAL = re.compile(r"([\\\[\]<>$])")  # characters that could make links, HTML or LaTeX


def escape_markdown(text: str) -> str:
    """Neutralise what could turn answer text into links, HTML or LaTeX (emphasis and lists stay)."""
    return _MD_SPECIAL.sub(r"\\\1", text)


def answer_markdown(answer: Answer, groups: Sequence[str]) -> str:
    """The answer text as Markdown: every ``[n]`` (or ``[1, 2]``) becomes links to the source view."""
    by_n = {c.n: c for c in answer.citations}
    out: list[str] = []
    position = 0
    for match in CITATION_MARKER.finditer(answer.text):
        out.append(escape_markdown(answer.text[position : match.start()]))
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
    out.append(escape_markdown(answer.text[position:]))
    return "".join(out)


def escape_title(citation: Citation) -> str:
    return f"{citation.title} — {citation.section}".replace('"', "'").replace("\n", " ")


def cited_document(answer: Answer, citation: Citation) -> int:
    """The document id of a citation (citations name the chunk; hits know its document)."""
    for hit in [*answer.hits, *answer.dropped]:
        if hit.chunk_id == citation.chunk_id:
            return hit.document_id
    raise NotFoundError(f"citation [{citation.n}] points at no retrieved passage")


def stream_answer(events: Iterator[str | Answer]) -> Answer:
    """Write the streamed text pieces with ``st.write_stream`` and return the final ``Answer``."""
    final: list[Answer] = []

    def pieces() -> Iterator[str]:
        for event in events:
            if isinstance(event, Answer):
                final.append(event)
            else:
                yield event

    st.write_stream(pieces())
    if not final:
        raise RagError("the answer stream ended without an answer")
    return final[-1]


STAGE_LABELS = {"retrieve": "retrieve", "rerank": "rerank", "gate": "gate", "first_token": "first token",
                "generate": "generate", "verify": "verify", "total": "total"}


def timings_text(timings: Mapping[str, float]) -> str:
    parts = [f"{STAGE_LABELS.get(k, k)} {v:,.0f} ms" for k, v in timings.items() if k != "total"]
    total = timings.get("total")
    return " · ".join(parts) + (f" · **total {total:,.0f} ms**" if total is not None else "")


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
        "dense rank": hit.dense_rank, "sparse rank": hit.sparse_rank, "rrf": round(hit.rrf_score, 5),
        "rerank": hit.rerank_score, "gate": gate_text, "from": hit.char_from, "to": hit.char_to,
        "content": hit.content,
    }


def _hit_for(answer: Answer, chunk_id: int) -> Hit | None:
    return next((h for h in [*answer.hits, *answer.dropped] if h.chunk_id == chunk_id), None)


def _rank_pair(hit: Hit | None) -> str:
    if hit is None:
        return ""
    return f"dense rank {_rank_text(hit.dense_rank)} · sparse rank {_rank_text(hit.sparse_rank)}"


def render_sources(answer: Answer, groups: Sequence[str]) -> None:
    """The cited passages: document, section, distance, ranks, the quote and a link to the source view."""
    st.markdown("**Sources**")
    for cited in answer.citations:
        hit = _hit_for(answer, cited.chunk_id)
        with st.container(border=True):
            st.markdown(f"**\\[{cited.n}\\] {escape_markdown(cited.title or cited.source)}** — "
                        f"{escape_markdown(cited.section)}")
            page = f" · page {cited.page}" if cited.page is not None else ""
            st.caption(f"{cited.source}{page} · characters {cited.char_from}–{cited.char_to} · "
                       f"distance {cited.distance:.3f} · {_rank_pair(hit)}")
            st.html(quote_html(cited.quote, f"rag-quote-{cited.n}"))
            if hit is not None:
                url = source_url(hit.document_id, cited.char_from, cited.char_to, groups)
                st.markdown(f"[:material/open_in_new: Open the passage]({url})")


def render_no_answer(answer: Answer, turn: int = 0) -> None:
    """Why there is no answer (best distance vs threshold) and the nearest passages, not close enough.

    ``turn`` numbers the answer in its chat: element keys must be unique on a page, and a chat
    holds many answers of the same kind (CSS class ``st-key-rag-no-answer-<turn>``).
    """
    threshold = answer.trace.get("threshold")
    best = answer.trace.get("best_distance")
    with st.container(key=f"rag-no-answer-{turn}"):
        st.warning(f"**No answer.** {answer.message}", icon=":material/block:")
        if best is not None and threshold is not None:
            st.caption(f"The gate keeps a passage only when its cosine distance to the question is below "
                       f"{threshold:.3f}; the closest one here is at {best:.3f}. Nothing was sent to the language "
                       "model, so nothing could be made up.")
    too_far = [h for h in answer.dropped if h.gated_out_reason and h.gated_out_reason.startswith("distance")]
    nearest = sorted(too_far, key=lambda h: h.distance)[:3]
    if nearest:
        st.markdown("**Nearest passages — not close enough**")
        for hit in nearest:
            with st.container(border=True):
                st.markdown(f"**{escape_markdown(hit.title or hit.source)}** — {escape_markdown(hit.section)}")
                st.caption(f"{hit.source} · distance {hit.distance:.3f} (threshold {threshold:.3f}) · "
                           f"not close enough · {_rank_pair(hit)}")
                st.html(quote_html(_shorten(hit.content, 300)))


QUOTE_STYLE = (
    "white-space: pre-wrap; overflow-wrap: anywhere; margin: 0; padding: 0.25rem 0 0.25rem 0.9rem; "
    "border-left: 3px solid #ced4da; color: #343a40; font-size: 0.9rem; line-height: 1.5;"
)


def quote_html(text: str, css_class: str = "") -> str:
    """A passage quoted verbatim: escaped, line breaks kept, no Markdown interpretation."""
    cls = f' class="rag-quote {html.escape(css_class)}"' if css_class else ' class="rag-quote"'
    return f'<blockquote{cls} style="{QUOTE_STYLE}">{html.escape(text)}</blockquote>'


def _shorten(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def render_answer(answer: Answer, groups: Sequence[str], turn: int = 0) -> None:
    """A finished answer: its text with citation links (or the no-answer explanation), the status,
    the sources, timings per stage and every hit. ``turn`` keeps its element keys unique in a chat."""
    if answer.status == "no_answer":
        render_no_answer(answer, turn)
    else:
        if answer.status == "extractive":
            st.info(f"**Extractive answer** — a quote from the best source, not written by the model. "
                    f"{answer.message}", icon=":material/format_quote:")
        with st.container(key=f"rag-answer-{turn}"):
            st.markdown(answer_markdown(answer, groups))
        grounded = "every sentence is supported by the source it cites" if answer.grounded else (
            "some sentences are not supported by their sources (shown struck through)")
        st.caption(f"{answer.status} · {grounded} · {len(answer.citations)} source(s)")
        render_sources(answer, groups)
    st.caption(":material/timer: " + timings_text(answer.timings_ms))
    with st.expander(f"All hits ({len(answer.hits)} kept, {len(answer.dropped)} turned away by the gate)"):
        st.dataframe(hits_frame(answer), hide_index=True)
