"""Streamlit entry point: the shared frame and the router over pages/ (st.navigation)."""

from __future__ import annotations

import streamlit as st

from rag import store
from rag.config import load_settings
from rag.errors import RagError
from rag.ingest import index_health

st.set_page_config(page_title="Ask your documents", page_icon="📚", layout="wide")

try:
    settings = load_settings()
    conn = store.open_db(settings.db_path)
    health = index_health(conn, settings)
except RagError as e:
    st.error(str(e))
    st.stop()

st.title("Ask your documents")
c1, c2, c3, c4 = st.columns(4)
c1.metric("Documents", health.documents)
c2.metric("Chunks", health.chunks)
c3.metric("Failed", health.failed)
c4.metric("Stale", health.stale)
st.caption(f"Database: {settings.db_path} · models: {health.collections or 'none yet'}")
