"""Settings: the models, how follow-up questions are read, and the refusal threshold — saved to
``rag.toml`` in the data directory (``rag.config.write_settings`` validates before it writes) —
and the model files on disk, with a button that deletes what nothing loads (``rag models prune``).

The threshold in force for a collection is its own calibrated one when it has one (stamped for
its embedding model, or set from an evaluation run); the file's ``max_distance`` serves the
collections without one.
"""

from __future__ import annotations

import streamlit as st

from rag import assets, config, gate, history, ui
from rag.errors import RagError

with ui.frame("manage_settings") as view:
    settings = view.settings

    st.title("Settings")
    st.caption(f"Saved to `{config.settings_file()}`. Environment variables (`RAG_*`) win over the file.")
    ui.show_flash()
    overridden = config.env_overrides()
    if overridden:
        st.warning("Set by the environment, so a value saved here does not apply until it is unset: "
                   + ", ".join(f"`{name}`" for name in overridden))

    with st.form("settings"):
        st.subheader("Models")
        choices = list(dict.fromkeys([*ui.EMBEDDER_CHOICES, settings.embedder]))  # a model path stays offered
        embedder = st.radio(
            "Embedding model for new collections", choices,
            index=choices.index(settings.embedder), horizontal=True,
            help="minilm: English, fast. e5: multilingual (Vietnamese), about 8× slower to ingest. auto: chosen "
            "from the files' language. An existing collection keeps the model it was built with.",
        )
        models = [*ui.LLM_CHOICES, "a GGUF file"]
        current = settings.llm_path or ui.LLM_CHOICES[0]
        picked = st.radio(
            "Language model", models, index=models.index(current) if current in models else len(models) - 1,
            horizontal=True, help=ui.LLM_HELP,
        )
        # Always drawn: a widget inside a form cannot appear on a choice made in the same form.
        gguf = st.text_input("GGUF file (used when “a GGUF file” is chosen)",
                             value="" if current in models else settings.llm_path,
                             placeholder="/home/me/models/model.gguf")
        llm_path = "" if picked == ui.LLM_CHOICES[0] else picked  # "": the default, whichever it is
        if picked == "a GGUF file":
            llm_path = gguf.strip()
        examiners = list(dict.fromkeys([*ui.EXAMINER_CHOICES, settings.answer_examiner]))  # a GGUF path stays
        examiner = st.radio("Answer examiner", examiners, index=examiners.index(settings.answer_examiner),
                            horizontal=True, help=ui.EXAMINER_HELP)
        retry = st.checkbox("Second attempt when nothing the model wrote is verified", value=settings.answer_retry,
                            help=ui.RETRY_HELP)
        st.subheader("Conversation")
        methods = ["rules", "model", "off"]
        rewrite = st.radio(
            "Follow-up questions", methods, index=methods.index(settings.rewrite), horizontal=True,
            help="rules: a follow-up such as “And which port does it use?” is searched with the previous question's "
            "words added (instant). model: the language model rewrites it (about 0.5 s; falls back to the rules). "
            "off: every question is searched as typed.",
        )
        st.subheader("Refusal threshold")
        default_threshold = st.number_input(
            "Default threshold (collections without their own)", min_value=0.0, max_value=2.0,
            value=float(settings.max_distance), step=0.005, format="%.3f",
            help="A passage farther than this cosine distance from the question is not close enough to answer from.",
        )
        saved = st.form_submit_button("Save settings", type="primary")
    if saved:
        try:
            view.require("manage_settings")
            if picked == "a GGUF file" and not llm_path:
                raise RagError("name the GGUF file to use (or choose a listed language model)")
            changes = {"embedder": embedder, "llm_path": llm_path.strip(), "answer_examiner": examiner,
                       "answer_retry": bool(retry), "rewrite": rewrite,
                       "max_distance": round(float(default_threshold), 4)}
            path = config.write_settings(changes)
            view.audit("settings_save", changes)
            ui.flash("success", f"Saved to {path}.")
        except RagError as e:
            ui.flash("error", str(e))
        st.rerun()

    in_force = gate.gate_threshold(settings, view.stamp)
    own = view.stamp is not None and view.stamp.max_distance is not None
    st.markdown(f"Threshold in force for “{view.collection}”: **{in_force:.3f}** "
                + ("(the collection's own, for its model)" if own else "(the default above)"))
    try:
        recommendation = history.latest_recommendation(view.conn, view.collection)
    except RagError as e:
        ui.stop_on(e)
    if recommendation is None:
        st.caption("No evaluation run of this collection yet: run one on the Evaluation page to get a recommended "
                   "threshold.")
    else:
        st.caption(f"Evaluation run #{recommendation.run_id} ({recommendation.golden_name}, "
                   f"{recommendation.created_at[:16].replace('T', ' ')}) recommends **{recommendation.threshold:.3f}** "
                   f"(it measured {recommendation.in_force:.3f}).")
        if st.button(f"Apply the recommended value {recommendation.threshold:.3f} to “{view.collection}”",
                     disabled=abs(recommendation.threshold - in_force) < 1e-9):
            try:
                view.require("manage_settings")
                applied = history.apply_recommendation(view.conn, view.collection)
                view.audit("threshold_apply", {"collection": view.collection, "threshold": applied.threshold})
                ui.flash("success", f"“{view.collection}” now refuses beyond {applied.threshold:.3f}.")
            except RagError as e:
                ui.flash("error", str(e))
            st.rerun()

    st.subheader("Model files")
    keep = assets.files_named_by(settings.llm_path, settings.answer_examiner)
    entries = assets.stored_files(keep=keep)
    total = assets.megabytes(sum(entry.size for entry in entries))
    st.caption(f"`{assets.models_dir()}` holds {total}: models are assembled or exported there on first use.")
    if entries:
        st.dataframe(ui.model_files_frame(entries), hide_index=True)
    removable = sum(entry.size for entry in entries if entry.removable)
    if removable and st.button(f"Delete the files nothing loads ({assets.megabytes(removable)})"):
        try:
            view.require("manage_settings")
            removed = assets.prune_models(keep=keep)
            view.audit("models_prune", {"files": [entry.path.name for entry in removed]})
            ui.flash("success", f"Deleted {len(removed)} file(s), {assets.megabytes(sum(e.size for e in removed))}.")
        except RagError as e:
            ui.flash("error", str(e))
        st.rerun()
