"""Runs: live and past runs, commands for the selected one, and a form to start a new one."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import components, state
from dashboard.client import ACTIVE, RESUMABLE, ApiError, RunCommand, RunStatus
from dashboard.markdown import text

MODELS = {"tiny (~30K params)": {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32},
          "small (~0.2M)": {"n_layer": 1, "n_head": 4, "n_embd": 128, "block_size": 128},
          "default (~1M)": {}}
# The default run's energy estimate (backend/commands.py SERVED_RUN; tests/dashboard/
# test_defaults.py holds the two equal: the dashboard reaches the control plane over HTTP only).
# A comment, not a string under the name: Streamlit's magic would show a bare string on the page.
DEFAULT_WATTS = 15.0


def run_table(runs: list[dict[str, Any]]) -> None:
    if not runs:
        st.caption("No runs yet.")
        return
    st.dataframe(pd.DataFrame([{
        "run": r["id"], "status": r["status"], "step": r["step"], "of": r["total_steps"],
        "optimizer": r["config"].get("optim", {}).get("name"),
        "lr": r["config"].get("optim", {}).get("lr"), "policy v": r["policy_version"],
        "checkpoint at": r["checkpoint_step"],
        "started": datetime.fromtimestamp(r["created_at"]).strftime("%Y-%m-%d %H:%M:%S"),
        "error": r["error"] or ""} for r in runs]), hide_index=True, key="runs_table")
    st.caption("Pick the run to watch, tune or command in the sidebar.")


def _command(run_id: str, command: str) -> None:
    """Button callback: send one command, keep the answer for the banner below the buttons."""
    try:
        answer = state.client().command(run_id, command)
        st.session_state["command_answer"] = ("ok", text(f"{command}: {answer['detail']}."))
    except ApiError as err:
        st.session_state["command_answer"] = ("error", err)
    state.forget_reads()


def commands(run: dict[str, Any]) -> None:
    status = run["status"]
    st.subheader(f"Run {text(run['id'])}: {text(status)} at step {run['step']}")
    enabled = {RunCommand.PAUSE: status == RunStatus.RUNNING,
               RunCommand.RESUME: status in RESUMABLE, RunCommand.CHECKPOINT: status in ACTIVE,
               RunCommand.STOP: status in ACTIVE}
    cols = st.columns(4, width=560)
    for col, command in zip(cols, enabled, strict=True):
        col.button(command.capitalize(), key=f"cmd_{command}", disabled=not enabled[command],
                   on_click=_command, args=(run["id"], command), width="stretch")
    kind, payload = st.session_state.pop("command_answer", (None, None))
    if kind == "ok":
        st.success(payload, icon=":material/check:")
    elif kind == "error":
        components.banner(payload)


def start_form(base: str) -> None:
    st.subheader("Start a new run")
    optimizers = components.config_choices(state.openapi(base), "optim", "name")
    with st.form("start_run"):
        c1, c2, c3, c4 = st.columns(4)
        optim = c1.selectbox("Optimizer", optimizers, key="new_optim")
        model = c2.selectbox("Model", list(MODELS), key="new_model")
        steps = c3.number_input("Steps", min_value=1, value=500, step=100, key="new_steps")
        lr = c4.number_input("Learning rate", min_value=0.0, value=3e-3, step=1e-3,
                             format="%.4g", key="new_lr")
        batch = c1.number_input("Batch size", min_value=1, value=16, step=1, key="new_batch")
        evals = c2.number_input("Eval every (steps)", min_value=1, value=100, step=10,
                                key="new_eval")
        watts = c3.number_input("Energy estimate (W per busy core, 0 = off)", min_value=0.0,
                                value=DEFAULT_WATTS, step=5.0, key="new_watts",
                                help="telemetry.model_cpu_watts: an estimate, shown as such; "
                                     "measured sources (NVML, RAPL) are used where present.")
        bound = c4.number_input("Staleness bound", min_value=0, value=10, step=1,
                                key="new_bound")
        started = st.form_submit_button("Start run", type="primary", key="new_submit")
    if not started:
        return
    config = {"model": MODELS[model], "optim": {"name": optim, "lr": lr},
              "data": {"batch_size": batch}, "train": {"steps": steps, "eval_interval": evals},
              "telemetry": {"model_cpu_watts": watts}}
    try:
        new = state.client().start_run(config, {"staleness_bound": bound})
    except ApiError as err:
        components.banner(err)
        return
    state.forget_reads()
    state.select_run_later(new["id"])
    st.rerun()


def main() -> None:
    st.title("Runs")
    base = state.url()
    run_table(state.runs(base))
    run_id = state.selected_run()
    if run_id is not None:
        commands(state.run(base, run_id))
    start_form(base)


if __name__ == "__main__":
    main()
