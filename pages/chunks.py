"""Chunks: what the chunker made of a document — each chunk's quoted ``content`` beside its
embedded ``text``, offsets, tokens against the encoder window — the document with its chunk
boundaries, and the cut-position audit for any strategy."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from rag import access, ui
from rag.audit import audit_document, audit_table
from rag.chunking import STRATEGIES
from rag.errors import RagError
from rag.registry import encoder_window

with ui.frame("view_chunks") as view:
    st.title("Chunks")
    if view.team:
        st.caption("The chunks of the documents you may read.")
    else:
        st.caption("Operator view: every indexed document of the collection, whatever the sidebar's *viewing as* "
                   "groups.")
    docs = access.readable_documents(view.conn, view.collection, view.scope)
    coll = view.stamp
    if not docs or coll is None:
        st.info("No indexed document in this collection yet: add some on the Documents page.")
        st.stop()

    labels = {r["id"]: f"{r['source']} · {r['chunk_count']} chunks" for r in docs}
    document_id = st.selectbox("Document", list(labels), format_func=labels.__getitem__)
    try:
        doc = access.readable_document(view.conn, document_id, view.scope)
        rows = access.readable_chunks(view.conn, view.scope, document_id=document_id)
    except RagError as e:
        ui.stop_on(e)
    text = doc["canonical_text"] or ""
    window = encoder_window(coll.embedder)

    sections = list(dict.fromkeys(r["section"] for r in rows))
    left, right = st.columns([2, 1])
    section = left.selectbox("Section", ["(all sections)", *sections])
    needle = right.text_input("Content contains", placeholder="filter words")
    shown = [
        r for r in rows
        if (section == "(all sections)" or r["section"] == section) and ui.filter_matches(needle, r["content"])
    ]

    table = pd.DataFrame(
        {
            "#": [r["ordinal"] for r in shown],
            "section": [r["section"] for r in shown],
            "from": [r["char_from"] for r in shown],
            "to": [r["char_to"] for r in shown],
            "chars": [r["char_to"] - r["char_from"] for r in shown],
            "tokens": [r["token_count"] for r in shown],
            "window": [window] * len(shown),
            "truncated": [bool(r["truncated"]) for r in shown],
            "kind": [r["kind"] for r in shown],
            "page": [r["page"] for r in shown],
        }
    )
    st.dataframe(
        table,
        hide_index=True,
        column_config={
            "tokens": st.column_config.ProgressColumn(
                "tokens / window", help=f"Tokens of the embedded text against the encoder window ({window}).",
                format="%d", min_value=0, max_value=window,
            ),
            "truncated": st.column_config.CheckboxColumn(
                help="Longer than the encoder window: its tail is not embedded."
            ),
        },
    )
    st.caption(
        f"{len(shown)} of {len(rows)} chunks · model {coll.embedder} (window {window} tokens) · "
        f"strategy {coll.strategy} · {sum(bool(r['truncated']) for r in rows)} truncated"
    )
    if not shown:
        st.info("No chunk matches the filter.")
        st.stop()

    by_ordinal = {r["ordinal"]: r for r in shown}
    ordinal = st.selectbox(
        "Chunk", list(by_ordinal), format_func=lambda o: f"#{o} · {by_ordinal[o]['section']}",
        key=f"chunk-{document_id}",
    )
    chunk = by_ordinal[ordinal]
    st.caption(
        f"characters {chunk['char_from']}–{chunk['char_to']} · {chunk['token_count']} / {window} tokens"
        + (" · **truncated**" if chunk["truncated"] else "")
    )
    content_col, text_col = st.columns(2)
    with content_col:
        st.markdown("**content** — the chunk's own words, quoted to users")
        st.code(chunk["content"], language=None, wrap_lines=True)
    with text_col:
        st.markdown("**text** — what is embedded and indexed (header + content)")
        st.code(chunk["text"], language=None, wrap_lines=True)

    with st.expander("Document with chunk boundaries", expanded=False):
        st.caption("Shaded: one chunk each (alternating colours); orange: overlap; grey: in no chunk. The selected "
                   "chunk is outlined.")
        ranges = [(r["ordinal"], r["char_from"], r["char_to"]) for r in rows]
        st.html(ui.chunk_map_html(text, ranges, selected=ordinal))

    st.subheader("Cut-position audit")
    st.caption("Where a strategy would cut this document, and which cuts fall inside a sentence, list, table or code "
               "block. Nothing is stored.")
    strategy = st.selectbox("Strategy", STRATEGIES, index=STRATEGIES.index(coll.strategy))
    try:
        audit = audit_document(doc, strategy, ui.collection_embedder(view.conn, coll.name), view.settings)
    except RagError as e:
        ui.stop_on(e)
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("Chunks", audit.chunks)
    c2.metric("Cuts", audit.cuts)
    c3.metric("Valid boundaries", audit.boundaries)
    c4.metric("Cuts mid-sentence", f"{audit.outside} ({audit.outside_pct:.1f} %)")
    budget = f"{audit.budget} tokens" if audit.budget else f"{audit.size or 'default'} characters"
    st.caption(f"Strategy {strategy}, budget {budget}. A cut mid-sentence can split the one sentence that answers a "
               "question; no embedding model can then retrieve it whole.")
    if audit.outside:
        st.dataframe(pd.DataFrame(audit_table(text, audit)), hide_index=True)
    else:
        st.success("Every cut falls on a sentence or block boundary.")
