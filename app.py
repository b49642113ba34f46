"""Streamlit entry point: the router over pages/ (st.navigation) and the frame shared by every page.

The frame (sidebar: database, collection, "viewing as" groups, index health) lives in
``rag.ui.frame``; each page reads its selection with ``rag.ui.current_view()``.
"""

from __future__ import annotations

import streamlit as st

from rag import ui

st.set_page_config(page_title="Ask your documents", page_icon="📚", layout="wide")

page = st.navigation(
    [
        st.Page("pages/ask.py", title="Ask", icon=":material/forum:", url_path="ask", default=True),
        st.Page("pages/source.py", title="Source", icon=":material/description:", url_path=ui.SOURCE_PAGE),
        st.Page("pages/documents.py", title="Documents", icon=":material/folder_open:", url_path="documents"),
        st.Page("pages/chunks.py", title="Chunks", icon=":material/view_agenda:", url_path="chunks"),
        st.Page("pages/evaluation.py", title="Evaluation", icon=":material/monitoring:", url_path="evaluation"),
    ]
)
ui.frame()
try:
    page.run()
finally:
    ui.forget_view()  # the View belongs to this run only (see ui.current_view)
