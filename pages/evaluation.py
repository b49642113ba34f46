"""Evaluation: run a golden set against the selected collection and read the result — recall@k
per stage with Wilson intervals, the gate sweep, the chunking-strategy comparison, every query
with what flipped since the previous run, and the history of runs kept in the database."""

from __future__ import annotations

import time

import streamlit as st

from rag import evaluate, history, ui
from rag.ask import collection_policy
from rag.errors import RagError
from rag.golden import Golden, load_golden
from rag.ingest import load_acl

with ui.frame("run_eval") as view:
    settings = view.settings

    st.title("Evaluation")
    st.caption(
        "How well retrieval finds the evidence of a golden set (questions with the passage that answers them), and "
        "whether the gate refuses what it must. Every run is stored in the database."
    )
    ui.show_flash()

    # --- golden set -------------------------------------------------------------------------------

    origin = st.radio(
        "Golden set", ["Bundled user-guide set", "A file on this machine", "Upload a file"], horizontal=True,
        help="Format: a JSON list of items {id, kind answerable|unanswerable|forbidden, question, paraphrases, groups, "
        "evidence [{source, quote}]}.",
    )
    golden_path, golden_upload = "", None
    if origin == "Bundled user-guide set":
        golden_path = str(ui.BUNDLED_GOLDEN)
        st.caption(f"`{golden_path}` — questions about this app's own user guide (the demo corpus).")
    elif origin == "A file on this machine":
        golden_path = st.text_input("Path of the golden set", value=str(ui.BUNDLED_GOLDEN)).strip()
    else:
        golden_upload = st.file_uploader("Golden set (JSON)", type=["json"])


    def chosen_golden() -> Golden:
        if golden_upload is not None:
            return ui.golden_from_upload(golden_upload)
        if not golden_path:
            raise RagError("choose a golden set first")
        return load_golden(golden_path)


    with st.form("run"):
        left, middle, right = st.columns([2, 1, 1])
        stages = left.multiselect("Stages", evaluate.STAGES, default=list(evaluate.default_stages(settings)))
        ks_text = middle.text_input("k", value=",".join(str(k) for k in evaluate.DEFAULT_KS),
                                    help="cut-offs for recall@k")
        as_golden = right.checkbox(
            "Ask as each item's groups", value=True,
            help="Off: every query is asked as a public reader; items that need other groups must then be refused.",
        )
        run_clicked = st.form_submit_button(f"Run on “{view.collection}”", type="primary")

    if run_clicked:
        try:
            view.require("run_eval")
            golden = chosen_golden()
            model = ui.collection_embedder(view.conn, view.collection)
            started = time.perf_counter()
            with st.spinner(f"Running {golden.name} on {view.collection}…"):
                report = evaluate.run_eval(
                    view.conn, golden, embedder=model, settings=settings, collection=view.collection, stages=stages,
                    ks=evaluate.parse_ks(ks_text),
                    groups_as_golden=as_golden, commit=evaluate.current_commit(),
                )
                run_id = history.save_run(view.conn, report)
            view.audit("eval_run", {"collection": view.collection, "golden": golden.name, "run": run_id})
            ui.flash("success", f"Run #{run_id}: {report.queries.total} queries in "
                                f"{time.perf_counter() - started:.1f} s.")
        except RagError as e:
            ui.flash("error", str(e))
        st.rerun()

    # --- a stored run -----------------------------------------------------------------------------

    try:
        runs = history.list_runs(view.conn, collection=view.collection)
    except RagError as e:
        ui.stop_on(e)
    if not runs:
        st.info(f"No evaluation of “{view.collection}” yet: pick a golden set and press Run.")
    else:
        labels = {r.id: f"#{r.id} · {r.created_at[:19]} · {r.golden_name} · {r.embedder}" for r in runs}
        run_id = st.selectbox("Run", list(labels), format_func=labels.__getitem__)
        try:
            report = history.load_report(view.conn, run_id)
            flipped, flips_note = history.flips_since(view.conn, run_id, k=8)
        except RagError as e:
            ui.stop_on(e)
        gate = report.gate
        c1, c2, c3, c4, c5 = st.columns(5)
        c1.metric("Queries", report.queries.total, help=f"{report.queries.answerable} answerable")
        c2.metric("Leaks", report.leaks.total, help="Forbidden evidence in the top k: must be 0.")
        c3.metric("Destroyed", report.destroyed.queries,
                  help="Answerable queries whose quote is in its document but no chunk holds it whole.")
        c4.metric("Threshold", f"{gate.current.threshold:.3f}",
                  help=f"{gate.current.bluffs} bluffs, {gate.current.lost} lost answers")
        c5.metric("Recommended", f"{gate.recommended.threshold:.3f}",
                  help=f"{gate.recommended.bluffs} bluffs, {gate.recommended.lost} lost answers")

        if report.destroyed.missing:
            st.warning(ui.missing_needles_text(report.destroyed))
        chart_left, chart_right = st.columns(2)
        with chart_left:
            st.markdown("**Recall@k per stage** (95 % Wilson intervals)")
            st.altair_chart(ui.recall_chart(report), width="stretch")
        with chart_right:
            st.markdown(f"**Gate sweep** on the {gate.stage} stage, up to {gate.max_sources} sources")
            st.altair_chart(ui.gate_chart(report), width="stretch")

        st.markdown("**By query kind** — the answerable queries asked as the question or as a paraphrase, and "
                    "written in Vietnamese with tones, without tones, or in English")
        st.dataframe(ui.breakdown_frame(report), hide_index=True)

        st.markdown("**Every query** — first relevant rank per stage (None = not retrieved), gate outcome at the "
                    "current threshold, and R@8 flips since the previous run on the same golden set")
        if flipped:
            st.caption(f"{len(flipped)} flip(s) since the previous run.")
        elif flips_note:
            st.caption(flips_note + ".")
        st.dataframe(ui.per_query_frame(report, flipped), hide_index=True)

    # --- the answer-or-refuse decision -------------------------------------------------------------

    st.subheader("Answer or refuse")
    policy = collection_policy(view.conn, view.collection, settings)
    if policy is None:
        st.info("The decision is off (setting `decision`): the distance gate alone decides what reaches the model.")
    else:
        fitted = ", ".join(policy.before.fitted_on) or "?"
        st.caption(
            f"Past the distance gate, a calibrated model decides whether to call the language model (threshold "
            f"{policy.before.threshold:.2f}), and whether what it shows is right (threshold "
            f"{policy.after.threshold:.2f}); else the reply is *not found*. This one is "
            f"{'bundled with the desk' if policy.source == 'bundled' else 'fitted for ' + policy.source}, on {fitted}. "
            "Refit it on your own golden set with `rag eval answers --golden G.json --calibrate`."
        )
        if policy.report:
            st.markdown("**Leave-one-corpus-out**: each corpus scored by the decision fitted on the others "
                        "(without it → with it)")
            st.dataframe(ui.decision_frame(policy.report), hide_index=True)
            st.markdown("**Coverage–risk** on each held-out corpus")
            st.altair_chart(ui.coverage_risk_chart(policy.report), width="stretch")

    # --- strategy comparison ----------------------------------------------------------------------

    st.subheader("Chunking strategies")
    st.caption("Ingests a corpus once per strategy (A–F, R) into temporary databases and evaluates each: minutes on a "
               "laptop. Or load the JSON of `rag eval strategies --json OUT`.")
    with st.expander("Compare strategies", expanded="strategy_result" not in st.session_state):
        corpus = st.text_input("Corpus folder", value=str(ui.BUNDLED_CORPUS))
        acl_path = st.text_input("Access map (optional)", value=str(ui.BUNDLED_ACL))
        compare_clicked = st.button("Run the strategy comparison")
        saved = st.file_uploader("…or load a saved strategy table (JSON)", type=["json"], key="strategy_upload")
    if compare_clicked:
        try:
            view.require("run_eval")
            golden = chosen_golden()
            model, _ = ui.ingest_embedder(view.conn, settings, view.collection, settings.embedder, [corpus])
            with st.status("Comparing strategies…") as status:
                result = evaluate.run_strategies(
                    corpus, golden, settings=settings, embedder=model, acl=load_acl(acl_path.strip() or None),
                    on_strategy=lambda s: status.update(label=f"Strategy {s}: ingesting and evaluating…"),
                )
                status.update(label="Strategies compared", state="complete")
            st.session_state["strategy_result"] = result
        except RagError as e:
            st.error(str(e))
    elif saved is not None:
        try:
            st.session_state["strategy_result"] = ui.strategies_from_upload(saved)
        except RagError as e:
            st.error(str(e))
    shown_table = st.session_state.get("strategy_result")
    if shown_table:
        result = shown_table
        st.markdown(f"**Recall@k per strategy** on the {result.stage} stage, golden set {result.golden}")
        st.altair_chart(ui.strategy_chart(result), width="stretch")
        st.dataframe(ui.strategy_table(result), hide_index=True)
        if result.sign_tests:
            st.caption("Paired sign tests (wins/losses of the first strategy over the second):")
            st.dataframe([t.to_json() for t in result.sign_tests], hide_index=True)

    # --- history ----------------------------------------------------------------------------------

    try:
        every_run = history.list_runs(view.conn)
    except RagError as e:
        ui.stop_on(e)
    if every_run:
        st.subheader("Per corpus")
        st.caption("The newest run of each golden set on each collection of this database.")
        st.dataframe(ui.latest_runs_frame(every_run), hide_index=True)

    if runs:
        st.subheader("Run history")
        st.dataframe(ui.history_frame(runs), hide_index=True)
