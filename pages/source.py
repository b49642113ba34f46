"""Source view: a document's text with one passage highlighted and scrolled into view.

Citation links open it as ``source?document=ID&from=A&to=B&groups=a,b``; without parameters it
offers the documents the reader may see.
"""

from __future__ import annotations

import streamlit as st

from rag import ui
from rag.errors import RagError

view = ui.current_view()
params = st.query_params

st.title("Source")
try:
    with ui.connection(view.settings) as conn:
        if params.get("document") is None:
            rows = ui.readable_documents(conn, view.collection, view.groups)
            if not rows:
                st.info(f"No document of “{view.collection}” is visible to {', '.join(view.groups)}.")
                st.stop()
            titles = {r["id"]: f"{r['title'] or r['source']} ({r['source']})" for r in rows}
            chosen = st.selectbox("Document", list(titles), format_func=titles.__getitem__)
            doc = ui.readable_document(conn, chosen, view.groups)
        else:
            doc = ui.readable_document(conn, ui.parse_document_id(params.get("document")), view.groups)
except RagError as e:
    ui.stop_on(e)

text = doc["canonical_text"] or ""
st.subheader(doc["title"] or doc["source"])
st.caption(f"{doc['source']} · collection {doc['collection']} · readable by {', '.join(ui.json_list(doc['groups']))}")
try:
    passage = ui.parse_range(params, len(text))
except RagError as e:
    st.error(f"{e}. Showing the whole document instead.")
    passage = None

if passage is None:
    st.html(ui.plain_html(text))
else:
    start, end = passage
    st.markdown(f"**Cited passage** · characters {start}–{end} · highlighted below")
    st.html(ui.highlight_html(text, start, end) + ui.scroll_script(), unsafe_allow_javascript=True)
