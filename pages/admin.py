"""Admin (team mode, administrators only): users — add, groups, role, password, disable, enable —
and the audit log, filtered, exported as CSV and pruned to the retention setting.

Every change goes through ``rag.auth`` with the signed-in admin as ``actor``: the library checks
the role again and writes the audit row in the same transaction. In desktop mode there are no
users and no log: the page says how to turn team mode on.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, time, timedelta

import pandas as pd
import streamlit as st

from rag import auth, ui
from rag.errors import RagError


def groups_from_text(text: str) -> list[str]:
    return [g.strip() for g in text.split(",") if g.strip()]


with ui.frame("manage_users") as view:
    st.title("Admin")
    if not view.team or view.user is None:
        st.info("Users, roles and the audit log belong to team mode, which is off: set `auth = true` in "
                "`rag.toml` (or start the app with `rag serve --team`) after creating an administrator with "
                "`rag users add NAME --role admin`.")
        st.stop()
    admin = view.user
    ui.show_flash()

    def run(message: str, change: Callable[[], object]) -> None:
        """Flash what a change did (or why it was refused) and rerun so every table is fresh."""
        try:
            change()
            ui.flash("success", message)
        except RagError as e:
            ui.flash("error", str(e))
        st.rerun()

    # --- users ------------------------------------------------------------------------------------

    st.subheader("Users")
    users = auth.list_users(view.conn)
    st.dataframe(
        pd.DataFrame({
            "name": [u.name for u in users], "role": [u.role for u in users],
            "groups": [", ".join(u.groups) for u in users], "disabled": [u.disabled for u in users],
            "created": [u.created_at[:16].replace("T", " ") for u in users],
            "changed": [u.updated_at[:16].replace("T", " ") for u in users],
        }),
        hide_index=True, key="rag-users",
    )
    names = [u.name for u in users]
    st.caption("Groups: " + ", ".join(view.known_groups) + " (documents name them in their front matter or the "
               "access map; every user also reads `all`).")

    add_tab, groups_tab, role_tab, password_tab, state_tab = st.tabs(
        ["Add a user", "Groups", "Role", "Reset password", "Disable or enable"])
    with add_tab, st.form("rag-user-add", clear_on_submit=True):
        name = st.text_input("Name", key="rag-add-name")
        password = st.text_input("Password (at least 8 characters)", type="password", key="rag-add-password",
                                 autocomplete="new-password")
        role = st.radio("Role", auth.ROLES, horizontal=True, key="rag-add-role")
        groups = st.text_input("Groups (comma-separated)", placeholder="hr, eng", key="rag-add-groups")
        if st.form_submit_button("Add user", type="primary"):
            run(f"Added {name.strip()} ({role}).",
                lambda: auth.add_user(view.conn, name, password, role=role, groups=groups_from_text(groups),
                                      actor=admin))
    with groups_tab, st.form("rag-user-groups"):
        who = st.selectbox("User", names, key="rag-groups-user")
        groups = st.text_input("New groups (comma-separated; empty = only `all`)", key="rag-groups-groups")
        if st.form_submit_button("Set groups") and who:
            run(f"{who} now reads the groups {', '.join(groups_from_text(groups)) or 'all'}.",
                lambda: auth.set_groups(view.conn, who, groups_from_text(groups), actor=admin))
    with role_tab, st.form("rag-user-role"):
        who = st.selectbox("User", names, key="rag-role-user")
        role = st.radio("New role", auth.ROLES, horizontal=True, key="rag-role-role")
        if st.form_submit_button("Set role") and who:
            run(f"{who} is now {role}.", lambda: auth.set_role(view.conn, who, role, actor=admin))
    with password_tab, st.form("rag-user-password", clear_on_submit=True):
        who = st.selectbox("User", names, key="rag-password-user")
        password = st.text_input("New password", type="password", key="rag-password-new",
                                 autocomplete="new-password")
        again = st.text_input("The same password again", type="password", key="rag-password-again",
                              autocomplete="new-password")
        st.caption("The user is signed out everywhere.")
        if st.form_submit_button("Reset password") and who:
            if password != again:
                ui.flash("error", "The two passwords differ: nothing was changed.")
                st.rerun()
            run(f"New password set for {who}.", lambda: auth.set_password(view.conn, who, password, actor=admin))
    with state_tab, st.form("rag-user-state"):
        who = st.selectbox("User", names, key="rag-state-user")
        left, right = st.columns(2)
        disable = left.form_submit_button("Disable (signs them out)")
        enable = right.form_submit_button("Enable (also lifts a sign-in lock)")
        if disable and who:
            run(f"{who} is disabled.", lambda: auth.disable_user(view.conn, who, actor=admin))
        if enable and who:
            run(f"{who} is enabled.", lambda: auth.enable_user(view.conn, who, actor=admin))

    # --- audit log --------------------------------------------------------------------------------

    st.subheader("Audit log")
    view.require("view_audit")
    today = datetime.now(UTC).date()
    c1, c2, c3, c4 = st.columns(4)
    since = c1.date_input("From", value=today - timedelta(days=7), key="rag-audit-since")
    until = c2.date_input("To (inclusive)", value=today, key="rag-audit-until")
    who_filter = c3.selectbox("User", ["(everyone)", *names], key="rag-audit-user")
    action_filter = c4.text_input("Action", placeholder="ask, sign_in_failed, user_add…", key="rag-audit-action")
    try:
        rows = auth.audit_rows(
            view.conn,
            since=datetime.combine(since, time(), UTC) if since else None,
            until=datetime.combine(until, time(), UTC) + timedelta(days=1) if until else None,
            user=None if who_filter == "(everyone)" else who_filter,
            action=action_filter.strip() or None,
        )
    except RagError as e:
        ui.stop_on(e)
    shown = list(reversed(rows))  # newest first
    st.dataframe(
        pd.DataFrame({
            "when (UTC)": [r.at[:19].replace("T", " ") for r in shown],
            "user": [r.user or "" for r in shown],
            "action": [r.action for r in shown],
            "question": [str(r.detail.get("question", "")) for r in shown],
            "outcome": [str(r.detail.get("status", r.detail.get("reason", ""))) for r in shown],
            "cited": ["; ".join(str(c.get("source", "")) for c in r.detail.get("cited", []) if isinstance(c, dict))
                      for r in shown],
            "detail": [str(r.detail) for r in shown],
        }),
        hide_index=True, key="rag-audit",
    )
    st.caption(f"{len(rows)} rows. Passwords and session tokens are never recorded.")
    if st.download_button("Download these rows (CSV)", auth.export_csv(rows), file_name="audit.csv",
                          mime="text/csv", icon=":material/download:", key="rag-audit-csv"):
        view.audit("audit_export", {"rows": len(rows)})

    days = view.settings.audit_retention_days
    if days:
        st.caption(f"Retention: {days} days (`audit_retention_days`).")
        if st.button(f"Delete rows older than {days} days", key="rag-audit-prune"):
            try:
                deleted = auth.prune_audit(view.conn, days, actor=admin)
                ui.flash("success", f"Deleted {deleted} audit rows older than {days} days.")
            except RagError as e:
                ui.flash("error", str(e))
            st.rerun()
    else:
        st.caption("Retention: everything is kept (`audit_retention_days = 0`).")
