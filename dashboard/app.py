"""The Asteria dashboard: the frame (connection, run picker) and the router of its pages.

    python -m streamlit run dashboard/app.py      # or: asteria start (control plane + this)

It reads and steers the control plane over HTTP only (dashboard/client.py); it never imports
torch or the runtime. Settings: ASTERIA_URL, ASTERIA_TOKEN or ASTERIA_TOKEN_FILE (held here, never
sent to a browser), ASTERIA_DASHBOARD_TOKEN or ASTERIA_DASHBOARD_TOKEN_FILE (see state.py).
"""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

import streamlit as st

ROOT = Path(__file__).resolve().parent
if str(ROOT.parent) not in sys.path:  # `streamlit run` puts only dashboard/ on sys.path
    sys.path.insert(0, str(ROOT.parent))

from dashboard import components, state  # noqa: E402
from dashboard.client import ApiError  # noqa: E402
from dashboard.markdown import code  # noqa: E402

PAGES = (("views/live.py", "Live", ":material/monitoring:", "live"),
         ("views/policy.py", "Policy", ":material/tune:", "policy"),
         ("views/runs.py", "Runs", ":material/list:", "runs"),
         ("views/compare.py", "Compare", ":material/compare_arrows:", "compare"))


def _label(run: dict) -> str:
    started = datetime.fromtimestamp(run["created_at"]).strftime("%m-%d %H:%M")
    optim = run["config"].get("optim", {}).get("name", "?")
    return f"{run['id'][-6:]} · {optim} · {run['status']} · {started}"


def run_picker() -> None:
    """The one run selection every page uses (st.session_state["run_id"])."""
    base = state.url()
    health, runs = state.health(base), state.runs(base)
    by_id = {r["id"]: r for r in runs}
    ss = st.session_state
    if "select_run" in ss:
        ss["run_id"] = ss.pop("select_run")
    if ss.get("run_id") not in by_id:
        ss["run_id"] = health.get("active_run") or (runs[0]["id"] if runs else None)
    st.selectbox("Run", list(by_id), key="run_id", format_func=lambda i: _label(by_id[i]),
                 placeholder="no runs yet", help="Live and past runs, newest first.")
    active = health.get("active_run")
    st.caption(f"Active run: {code(active)}" if active else "No run is training now.")


def sign_in_box() -> None:
    """Sign in to change things. The API token stays in this server process; the browser gets
    neither it nor the sign-in token (the password field starts empty, is never filled in)."""
    if state.signed_in():
        st.caption("Signed in: changes go out with the API token this dashboard holds.")
        st.button("Sign out", key="sign_out", on_click=state.sign_out)
        return
    _, where = state.env_sign_in_token()
    with st.form("sign_in", border=False):
        typed = st.text_input("Sign-in token", type="password", key="sign_in_token")
        # the explanation is a caption: a help button would share the input's accessible name
        st.caption(f"Watching needs none; changes do. It is {where}." if where else
                   "No token is configured (ASTERIA_DASHBOARD_TOKEN, ASTERIA_TOKEN or the token "
                   "file): nothing can be changed from this dashboard.")
        if st.form_submit_button("Sign in", key="sign_in_submit"):
            if state.sign_in(typed):
                st.rerun()
            if wait := state.sign_in_wait():  # the same answer whatever was typed
                st.error(f"Too many wrong tokens: try again in {wait} s.",
                         icon=":material/timer:")
            else:
                st.error("That is not the sign-in token.", icon=":material/key_off:")


def sidebar() -> ApiError | None:
    """Connection settings, sign-in and the run picker; the error when the control plane cannot
    be read."""
    with st.sidebar:
        # Not editable from a browser: a session that could point this server elsewhere could
        # send the API token there, or make it fetch any address (ASTERIA_URL sets it).
        st.caption(f"Control plane: {code(state.url())}")
        sign_in_box()
        st.toggle("Live updates", value=True, key="live")
        st.number_input("Refresh every (s)", min_value=1, max_value=60, value=2, step=1,
                        key="refresh_s")
        try:
            run_picker()
        except ApiError as err:
            st.session_state.pop("run_id", None)
            return err
    return None


def main() -> None:
    # page_icon: an emoji is drawn in the page; a :material/...: icon is fetched from Google Fonts
    st.set_page_config(page_title="Asteria", page_icon="📈", layout="wide")
    pages = [st.Page(ROOT / path, title=title, icon=icon, url_path=url, default=url == "live")
             for path, title, icon, url in PAGES]
    page = st.navigation(pages)
    err = sidebar()
    if err is not None:
        components.banner(err)
        return
    with components.guard():
        page.run()


if __name__ == "__main__":
    main()
