"""Streamlit entry point and the Ask page: a question in, a streamed answer out, every [n] a link
to the exact passage it cites.

The other pages are the files of ``pages/``, found by Streamlit's pages-directory mechanism (no
``st.navigation``); each page, this one included, draws the shared frame with ``ui.frame()``.

When nothing in the reader's documents is close enough, the page says so — with the best distance
against the gate's threshold and the nearest passages — instead of letting the model guess.
"""

from __future__ import annotations

import streamlit as st

from rag import ask, ui
from rag.errors import RagError

with ui.frame() as view:
    settings = view.settings

    st.title("Ask")
    st.caption(
        f"Answers come only from the documents of “{view.collection}” that **{', '.join(view.groups)}** may read "
        "(change *viewing as* in the sidebar). Click a [n] to open the passage it cites."
    )
    if not view.collections:
        st.info("Nothing is indexed yet: add documents on the Documents page, or run `rag demo`.")
        st.stop()

    history: list[tuple[str, object, list[str]]] = st.session_state.setdefault("asked", [])
    for turn, (asked, answer, groups) in enumerate(history):
        with st.chat_message("user"):
            st.markdown(ui.escape_markdown(asked))
        with st.chat_message("assistant"):
            ui.render_answer(answer, groups, turn)  # type: ignore[arg-type]

    question = st.chat_input("Ask a question about your documents, e.g. How do I start the app on another port?")
    if question:
        with st.chat_message("user"):
            st.markdown(ui.escape_markdown(question))
        with st.chat_message("assistant"):
            try:
                model = ui.collection_embedder(view.conn, view.collection)
                llm = ui.llm(settings.llm_path, settings.n_ctx, settings.threads, settings.seed)
                with st.spinner("Searching and writing…"):
                    answer = ui.stream_answer(
                        ask.ask_stream(
                            question, settings=settings, groups=view.groups, collection=view.collection,
                            embedder=model, llm=llm, conn=view.conn, resources=ui.resources(settings),
                        )
                    )
            except RagError as e:
                st.error(str(e))
            else:
                history.append((question, answer, list(view.groups)))
                st.rerun()  # draw it with its links, sources and timings, like every earlier answer
