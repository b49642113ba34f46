"""Documents: add files (upload or a folder path) with a progress bar per run, see each
document's status, and fix what went wrong (retry failed, re-embed stale, delete)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd
import streamlit as st

from rag import access, ui
from rag.errors import RagError
from rag.ingest import (
    IngestReport,
    check_ingest_root,
    delete_documents,
    document_statuses,
    ingest,
    ingest_roots,
    reindex,
    retry_failed_documents,
    save_uploads,
)


def progress_callback(label: str) -> Callable[[int, int, int, str], None]:
    """A st.progress bar fed by ingest's ``on_progress(done, total, chunks, source)``."""
    bar = st.progress(0.0, text=f"{label}: starting…")

    def update(done: int, total: int, chunks: int, source: str) -> None:
        where = f" · {source}" if source else ""
        bar.progress(done / total if total else 1.0, text=f"{label}: {done}/{total} files, {chunks} chunks{where}")

    return update


with ui.frame("upload") as view:
    settings = view.settings

    st.title("Documents")
    if view.team:
        st.caption("The documents you may read. Supported files: Markdown, text, HTML, PDF, Word (.docx) and "
                   "OpenDocument (.odt).")
    else:
        st.caption(
            "Operator view: every document of the collection, whatever the sidebar's *viewing as* groups. "
            "Supported files: Markdown, text, HTML, PDF, Word (.docx) and OpenDocument (.odt)."
        )
    ui.show_flash()

    # --- add documents ----------------------------------------------------------------------------

    st.subheader("Add documents")
    new_allowed = view.may("manage_collections")  # team mode: administrators create collections
    target = st.text_input(
        "Into collection", value=view.collection, disabled=not new_allowed,
        help="A new name creates a new collection with the model chosen below." if new_allowed else
        "Administrators create collections; documents go into the one selected in the sidebar.",
    ).strip() or view.collection
    is_new = target not in view.collections
    if is_new:
        choice = st.radio(
            "Embedding model for the new collection",
            ui.EMBEDDER_CHOICES,
            horizontal=True,
            help="minilm: all-MiniLM-L6-v2 (int8 ONNX), English, fast. e5: multilingual-e5-small, for Vietnamese "
            "and mixed corpora, about 8× slower to ingest. auto: pick from the language of the files. minilm-fp32: "
            "the same MiniLM in full precision, about 2× slower. The model is stamped on the collection and never "
            "mixed.",
        )
    else:
        choice = ""
        st.caption(f"Collection **{target}** uses {view.health.collections.get(target, 'its stamped model')}.")

    upload_tab, folder_tab = st.tabs(["Upload files", "Ingest a folder"])
    with upload_tab:
        # A new key after each indexing run empties the uploader: files left in it would be indexed again.
        uploads = st.file_uploader("Files", accept_multiple_files=True,
                                   key=f"uploads-{st.session_state.get('_rag_upload_round', 0)}")
        upload_clicked = st.button("Index uploaded files", disabled=not uploads, type="primary")
    with folder_tab:
        roots = ingest_roots(settings)
        folder = st.text_input("Folder or file path on this machine", placeholder="/home/me/notes",
                               disabled=not roots)
        st.caption("Allowed folders: " + (", ".join(f"`{r}`" for r in roots) if roots else
                                          "none (ingest_roots in rag.toml is empty)"))
        folder_clicked = st.button("Ingest folder", disabled=not (roots and folder.strip()), type="primary")

    if upload_clicked or folder_clicked:
        try:
            view.require("upload" if upload_clicked else "ingest")
            if is_new:
                view.require("manage_collections")
            paths: list[str | Path]
            if upload_clicked:
                st.session_state["_rag_upload_round"] = st.session_state.get("_rag_upload_round", 0) + 1
                saved, refused = save_uploads(uploads or [], ui.uploads_folder())
                paths = list(saved)
                for message in refused:
                    ui.flash("error", f"Not indexed: {message}")
            else:
                paths = [check_ingest_root(folder, settings)]
            if paths:
                model, note = ui.ingest_embedder(view.conn, settings, target, choice, paths)
                if note:
                    ui.flash("info", note)
                report = ingest(
                    view.conn, paths, settings=settings, embedder=model, collection=target,
                    retry_failed=True, on_progress=progress_callback("Ingest"), writer=view.scope,
                    within=None if upload_clicked else ingest_roots(settings),
                )
                ui.report_messages(report)
                view.audit("ingest", {"collection": target, "from": "upload" if upload_clicked else "folder",
                                      "summary": report.summary()})
        except RagError as e:
            ui.flash("error", str(e))
        else:
            ui.select_collection_next_run(target)  # show the collection just filled
        st.rerun()

    # --- status -----------------------------------------------------------------------------------

    st.subheader(f"Status of “{view.collection}”")
    try:
        infos = access.readable_infos(view.conn, document_statuses(view.conn, settings, view.collection), view.scope)
    except RagError as e:
        ui.stop_on(e)

    if not infos:
        st.info("No documents in this collection yet: upload files or ingest a folder above.")
        st.stop()

    failed = [d for d in infos if d.status == "failed"]
    stale = [d for d in infos if d.stale]
    table = pd.DataFrame(
        {
            "document": [d.source for d in infos],
            "title": [d.title for d in infos],
            "status": [d.status for d in infos],
            "reason": [d.error or "" for d in infos],
            "chunks": [d.chunk_count for d in infos],
            "model": [d.embedder or "" for d in infos],
            "stale": [d.stale for d in infos],
            "groups": [", ".join(d.groups) for d in infos],
            "updated": [d.updated_at for d in infos],
        }
    )
    st.dataframe(
        table,
        hide_index=True,
        column_config={
            "stale": st.column_config.CheckboxColumn(help="Processed by an older chunker or extractor: re-embed it."),
            "reason": st.column_config.TextColumn(width="large"),
        },
    )
    st.caption(f"{len(infos)} documents · {len(infos) - len(failed)} ok · {len(failed)} failed · {len(stale)} stale")

    def run_with_collection_model(job: Callable[..., IngestReport], label: str) -> None:
        """Run ``retry_failed_documents`` or ``reindex`` on the listed documents (in team mode, the
        ones the user may read) with the collection's own model, then rerun."""
        try:
            view.require("ingest")
            model = ui.collection_embedder(view.conn, view.collection)
            report = job(
                view.conn, settings=settings, embedder=model, collection=view.collection,
                on_progress=progress_callback(label), sources={d.source for d in infos},
            )
            ui.report_messages(report)
            view.audit("ingest", {"collection": view.collection, "from": label.lower(), "summary": report.summary()})
        except RagError as e:
            ui.flash("error", str(e))
        st.rerun()

    retry_col, stale_col = st.columns(2)
    if retry_col.button(f"Retry failed ({len(failed)})", disabled=not failed):
        run_with_collection_model(retry_failed_documents, "Retry")
    if stale_col.button(f"Re-embed stale ({len(stale)})", disabled=not stale):
        run_with_collection_model(reindex, "Re-embed")

    if not view.may("delete_document"):  # team mode: administrators delete
        st.stop()
    with st.expander("Delete documents"), st.form("delete", clear_on_submit=True, border=False):
        by_source = {d.source: d.id for d in infos}
        doomed = st.multiselect("Documents to delete", list(by_source))
        if st.form_submit_button("Delete selected") and doomed:
            try:
                view.require("delete_document")
                delete_documents(view.conn, [by_source[source] for source in doomed])
                view.audit("delete_documents", {"collection": view.collection, "sources": doomed,
                                                "document_ids": [by_source[source] for source in doomed]})
                ui.flash("success", f"Deleted {len(doomed)} document(s): {', '.join(doomed)}")
            except RagError as e:
                ui.flash("error", str(e))
            st.rerun()
