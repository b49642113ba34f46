"""Streamlit entry point and the Ask page: a conversation with your documents. Every [n] of an
answer links to the exact passage it cites.

The other pages are the files of ``pages/``, found by Streamlit's pages-directory mechanism (no
``st.navigation``); each page, this one included, draws the shared frame with ``ui.frame()``.

A follow-up question is made standalone before it is searched (``rag.conversation``), and the
reader sees what was searched. The chat is kept in the database, per collection, so a reload
shows it again. The page speaks the language of the question (``rag.messages``). When nothing in
the reader's documents is close enough, it says so plainly and folds the closest passages below;
the numbers (distance, ranks, timings, every hit) are behind each answer's Details.
"""

from __future__ import annotations

import streamlit as st

from rag import ask, conversation, ui, ui_auth
from rag.errors import RagError
from rag.messages import say

with ui.frame("ask") as view:
    settings = view.settings
    user_id = view.user.id if view.user else None  # team mode keeps each user's chats apart
    if view.collections and settings.preload_models:
        ui.warm_models(str(settings.db_path), view.collection, settings.llm_path, settings)

    replaced = st.session_state.pop(ui.REPLACE_KEY, None)
    if replaced is not None:  # "ask again": the last answer goes, its question is asked anew below
        conversation.delete_turn(view.conn, replaced)
    chat = ui.open_chat(view.conn, view.collection, user_id)
    turns = conversation.chat_turns(view.conn, view.collection, chat, user_id)
    stopped = st.session_state.pop(ui.ASKING_KEY, None)  # the last run was interrupted while answering
    pending = st.session_state.pop(ui.PENDING_KEY, None)
    language = turns[-1].answer.language if turns else "en"

    title, new = st.columns([5, 1], vertical_alignment="bottom")
    title.title(say(language, "title"))
    new.button(say(language, "new_chat"), icon=":material/add_comment:", disabled=not turns, key="rag-new-chat",
               on_click=ui.start_new_chat, args=(view.collection,))
    # A team-mode reader has no "viewing as" to switch (only an admin's preview has it).
    chooses_groups = view.user is None or view.may("view_as")
    st.caption(say(language, "caption" if chooses_groups else "caption_team", collection=view.collection,
                   groups=", ".join(view.groups)))
    if view.user is not None:
        ui_auth.render_history(view.conn, view.user)
    if not view.collections:
        st.info(say(language, "nothing_indexed"))
        st.stop()

    for i, turn in enumerate(turns):
        with st.chat_message("user"):
            ui.render_question(turn.question, turn.searched, turn.answer.language)
        with st.chat_message("assistant"):
            if not conversation.visible_to(turn, view.groups):
                st.info(say(turn.answer.language, "hidden" if chooses_groups else "hidden_team",
                            groups=", ".join(turn.groups)))
                continue
            ui.render_answer(turn.answer, turn.groups, turn.id)
            copy, again, _ = st.columns([1, 1, 4])
            with copy.popover(say(turn.answer.language, "copy"), icon=":material/content_copy:",
                              key=f"rag-copy-{turn.id}"):
                st.caption(say(turn.answer.language, "copy_help"))
                st.code(ui.answer_text(turn.answer), language=None, wrap_lines=True)
            if i == len(turns) - 1 and not stopped:
                again.button(say(turn.answer.language, "regenerate"), icon=":material/refresh:", key="rag-again",
                             on_click=ui.queue_question, args=(turn.question, turn.id))

    if stopped:
        with st.chat_message("assistant"):
            st.info(say(language, "stopped"), icon=":material/stop_circle:")
            st.button(say(language, "regenerate"), icon=":material/refresh:", key="rag-again-stopped",
                      on_click=ui.queue_question, args=(stopped,))

    if not turns and not stopped and not pending:
        st.markdown(say(language, "indexed", documents=view.health.documents, collection=view.collection,
                        chunks=view.health.chunks, model=view.stamp.embedder if view.stamp else "?"))
        examples = conversation.example_questions(view.conn, view.collection, view.groups)
        if examples:
            st.caption(say(language, "examples"))
            for n, example in enumerate(examples):
                st.button(example, key=f"rag-example-{n}", icon=":material/chat:", on_click=ui.queue_question,
                          args=(example,))

    question = st.chat_input(say(language, "placeholder")) or pending
    if question:
        previous = [t.searched for t in turns if conversation.visible_to(t, view.groups)]
        try:
            model = ui.collection_embedder(view.conn, view.collection)
            llm = ui.llm(settings.llm_path, settings.n_ctx, settings.threads, settings.seed)
            rewrite = conversation.standalone_question(question, previous, method=settings.rewrite, llm=llm)
        except RagError as e:
            ui.stop_on(e)
        with st.chat_message("user"):
            ui.render_question(question, rewrite.searched, rewrite.language)
        with st.chat_message("assistant"):
            st.session_state[ui.ASKING_KEY] = question  # still set on the next run: this one was stopped
            st.button(say(rewrite.language, "stop"), icon=":material/stop_circle:", key="rag-stop")
            try:
                view.require("ask")
                events = ask.ask_stream(
                    rewrite.searched, settings=settings, groups=view.groups, collection=view.collection,
                    embedder=model, llm=llm, conn=view.conn, resources=ui.resources(settings),
                    language=rewrite.language,
                )
                if view.user is not None:  # team mode: who asked what, and what they were shown
                    events = ui_auth.audited(events, view.conn, view.user, question=question, groups=view.groups,
                                             collection=view.collection, preview=view.preview)
                answer = ui.stream_answer(events, view.groups, rewrite.language)
            except RagError as e:
                st.session_state.pop(ui.ASKING_KEY, None)
                st.error(str(e))
            else:
                conversation.save_turn(view.conn, collection=view.collection, chat_id=chat, question=question,
                                       searched=rewrite.searched, answer=answer, groups=view.groups,
                                       user_id=user_id)
                st.session_state.pop(ui.ASKING_KEY, None)
                st.rerun()  # draw it with its links, sources and details, like every earlier answer
