"""Source view: a document's text with one passage highlighted and scrolled into view.

Citation links open it as ``source?document=ID&from=A&to=B&groups=a,b``; without parameters it
offers the documents the reader may see. Whether the reader may open the document and the range
is ``rag.access``'s decision, the same one ``rag source`` makes.
"""

from __future__ import annotations

import streamlit as st

from rag import access, ui
from rag.errors import RagError

with ui.frame("open_source") as view:
    params = st.query_params

    st.title("Source")
    try:
        if params.get("document") is None:
            rows = access.readable_documents(view.conn, view.collection, view.groups)
            if not rows:
                st.info(f"No document of “{view.collection}” is visible to {', '.join(view.groups)}.")
                st.stop()
            titles = {r["id"]: f"{r['title'] or r['source']} ({r['source']})" for r in rows}
            document_id = st.selectbox("Document", list(titles), format_func=titles.__getitem__)
        else:
            document_id = access.parse_document_id(params.get("document"))
        doc = access.readable_document(view.conn, document_id, view.groups)
    except RagError as e:
        ui.stop_on(e)

    text = doc["canonical_text"] or ""
    # A document's title and path are its author's text: never Markdown (a planted [x](http://…) stays text).
    st.subheader(ui.escape_markdown(doc["title"] or doc["source"]))
    st.caption(ui.escape_markdown(f"{doc['source']} · collection {doc['collection']} · "
                                  f"readable by {', '.join(access.document_groups(doc))}"))
    try:
        passage = access.parse_range(params.get("from"), params.get("to"), len(text))
    except RagError as e:
        st.error(f"{e}. Showing the whole document instead.")
        passage = None

    if passage is None:
        st.html(ui.plain_html(text))
    else:
        start, end = passage
        st.markdown(f"**Cited passage** · characters {start}–{end} · highlighted below")
        st.html(ui.highlight_html(text, start, end) + ui.scroll_script(), unsafe_allow_javascript=True)
