"""Pieces several pages share: error banners, the run's status banner, the policy form."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd
import streamlit as st
from streamlit.errors import StreamlitAPIException

from dashboard import state
from dashboard.client import (
    ACTIVE,
    ApiError,
    Invalid,
    NotSignedIn,
    RunStatus,
    Unauthorized,
    Unreachable,
    without_field,
)
from dashboard.markdown import code, text

log = logging.getLogger(__name__)
POLICY_SCHEMA = "PolicyUpdate"
RUN_SCHEMA = "RunCreate"
"""The OpenAPI component of the policy PATCH body: the form's fields, labels and widgets."""
FRONT = ("staleness_bound", "swap_delay", "swap_mode", "refresh_interval", "workers",
         "offload_mode", "device_budget_bytes", "host_budget_bytes")
"""Fields shown first; every other field of the schema goes under "Advanced"."""
MAX_SAFE_INT = 2**53 - 1
"""The largest integer a number input takes (a JavaScript number holds it exactly)."""


@dataclass(frozen=True)
class FormField:
    """One policy field as the form shows it, read from the API's schema."""

    name: str
    label: str
    help: str
    widget: str
    """number | select | checkbox | text | word_or_int (one of `words`, or an integer)."""
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[Any, ...] = ()
    words: tuple[str, ...] = ()
    max_length: int | None = None


def form_fields(openapi: dict[str, Any]) -> tuple[FormField, ...]:
    """The policy form's fields, in the schema's order, from an OpenAPI document."""
    schemas = openapi.get("components", {}).get("schemas", {})
    props = _resolve(schemas.get(POLICY_SCHEMA, {}), schemas).get("properties", {})
    return tuple(_form_field(name, _resolve(prop, schemas)) for name, prop in props.items())


def config_choices(openapi: dict[str, Any], section: str, key: str) -> tuple[str, ...]:
    """The values `POST /runs` allows for config key `section.key`, from the API's schema
    (empty when the schema lists none)."""
    schemas = openapi.get("components", {}).get("schemas", {})
    config = _resolve(schemas.get(RUN_SCHEMA, {}).get("properties", {}).get("config", {}),
                      schemas)
    part = _resolve(config.get("properties", {}).get(section, {}), schemas)
    return tuple(_resolve(part.get("properties", {}).get(key, {}), schemas).get("enum", ()))


def _resolve(schema: dict[str, Any], schemas: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref", "")
    return schemas.get(ref.rsplit("/", 1)[-1], {}) if ref else schema


def _int(value: Any) -> int | None:
    return None if value is None else int(value)  # FastAPI writes bounds as floats


def _form_field(name: str, prop: dict[str, Any]) -> FormField:
    field = FormField(name, prop.get("title") or name, prop.get("description", ""), "text",
                      max_length=prop.get("maxLength"))
    bounds = {"minimum": _int(prop.get("minimum")), "maximum": _int(prop.get("maximum"))}
    if "enum" in prop:
        return replace(field, widget="select", choices=tuple(prop["enum"]))
    if prop.get("type") == "boolean":
        return replace(field, widget="checkbox")
    if prop.get("type") == "integer":
        return replace(field, widget="number", **bounds)
    options = prop.get("anyOf", ())
    integers = [o for o in options if o.get("type") == "integer"]
    words = tuple(w for o in options for w in ([o["const"]] if "const" in o else o.get("enum", ())))
    if integers and words:  # such as swap_delay: "auto" or an integer
        return replace(field, widget="word_or_int", words=words,
                       minimum=_int(integers[0].get("minimum")),
                       maximum=_int(integers[0].get("maximum")))
    return field  # a string, or a type the form does not know: typed as text


def banner(err: ApiError) -> None:
    if isinstance(err, Unreachable):
        st.error(f"**Control plane unreachable.** {text(err)}", icon=":material/cloud_off:")
    elif isinstance(err, Unauthorized):
        st.error(f"**Token refused.** {text(err)}", icon=":material/key_off:")
    elif isinstance(err, NotSignedIn):
        st.warning(f"**Not signed in.** {text(err)}", icon=":material/lock:")
    else:
        st.error(text(err), icon=":material/error:")


@contextmanager
def guard() -> Iterator[None]:
    """Run a block; an API failure or an unexpected error becomes a banner, never a traceback."""
    try:
        yield
    except ApiError as err:
        banner(err)
    except Exception as err:  # the operator gets a sentence; the log keeps the traceback
        log.exception("dashboard error")
        st.error(f"Unexpected error: {type(err).__name__}: {text(err)}", icon=":material/error:")


def selected_run() -> tuple[str, dict[str, Any]] | None:
    """(base URL, run) of the run picked in the sidebar, with its status banner shown;
    None, with a notice, when there is no run yet."""
    run_id = state.selected_run()
    if run_id is None:
        st.info("No run yet: start one on the Runs page.", icon=":material/info:")
        return None
    base = state.url()
    run = state.run(base, run_id)
    run_banner(run)
    return base, run


def run_banner(run: dict[str, Any]) -> None:
    rid, status, step = text(run["id"]), text(run["status"]), run["step"]
    where = f"at step {step} of {run['total_steps']}"
    match status:
        case RunStatus.RUNNING:
            return
        case RunStatus.PAUSED:
            st.warning(f"Run {rid} is **paused** {where}. Resume it on the Runs page.",
                       icon=":material/pause_circle:")
        case RunStatus.FINISHED:
            kept = run.get("checkpoint_step")
            st.success(f"**Run {rid} has finished**: all {run['total_steps']} steps done. "
                       + (f"Its checkpoint is at step {kept}. " if kept is not None else "")
                       + "Its records stay here to view (the final loss is the headline's "
                       "Train loss); its policy can no longer be changed.",
                       icon=":material/flag:")
        case RunStatus.STOPPED | RunStatus.INTERRUPTED:
            st.warning(f"Run {rid} is **{status}** {where}. Showing its recorded history; "
                       "resume it from its last checkpoint on the Runs page.",
                       icon=":material/stop_circle:")
        case _:
            st.error(f"Run {rid} **{status}** {where}: {text(run.get('error') or 'no detail')}",
                     icon=":material/error:")


def markers_note(marks: pd.DataFrame) -> None:
    if marks.empty:
        st.caption("Policy changes: none yet (a change is marked on every chart by a dashed "
                   "red line at the step it took effect).")
        return
    items = [f"**{text(r.label)}** from step {r.step}: {text(r.text)}"
             for r in marks.tail(6).itertuples()]
    st.caption("Policy changes (dashed red lines): " + " · ".join(items))


def _newest(pol: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The policy with queued changes applied, and its version."""
    newest = dict(pol["policy"])
    for change in pol["pending"]:
        newest.update({k: v[1] for k, v in change["diff"].items()})
    version = pol["pending"][-1]["version"] if pol["pending"] else pol["version"]
    return newest, version


def _answer(run_id: str) -> None:
    kind, run, payload = st.session_state.get("policy_answer", (None, None, None))
    if run != run_id:
        return
    if kind == "ok":
        diff = text(", ".join(f"{k} {a} -> {b}" for k, (a, b) in payload["diff"].items()))
        st.success(f"Accepted: policy **version {payload['version']}**, takes effect at "
                   f"**step {payload['effective_step']}** ({diff}).", icon=":material/check:")
    elif kind == "unchanged":
        st.info("Every field equals the current policy: nothing was sent.")
    elif kind == "invalid":
        lines = "\n".join(f"- {code(field)}: {text(without_field(field, msg))}"
                          for field, msg in payload)
        st.error(f"The control plane rejected the change (422), the policy is unchanged:\n"
                 f"{lines}", icon=":material/block:")


def policy_form(run: dict[str, Any]) -> None:
    """Current against new values of the live policy; one PATCH per submit. The fields, their
    labels and widgets come from the control plane's schema of the PATCH body. Call it inside
    an `st.fragment`: a submit reruns that fragment only, not the page's charts (on a loaded
    machine those take seconds to draw, twice per submit)."""
    base, run_id = state.url(), run["id"]
    pol = state.policy(base, run_id)
    newest, version = _newest(pol)
    fields = [f for f in form_fields(state.openapi(base)) if f.name in newest]
    if not fields:
        st.warning(f"The control plane's API description has no `{POLICY_SCHEMA}` schema: the "
                   "policy cannot be edited here.", icon=":material/warning:")
        return
    front = sorted((f for f in fields if f.name in FRONT), key=lambda f: FRONT.index(f.name))
    advanced = [f for f in fields if f.name not in FRONT]
    active = run["status"] in ACTIVE
    pending = ", ".join(f"v{c['version']} at step {c['effective_step']}" for c in pol["pending"])
    st.caption(f"Policy version {pol['version']} in force" + (f"; queued: {pending}" if pending
                                                               else "") + ".")
    values: dict[str, Any] = {}
    # Enter in a field does not send: a change goes out only with the Apply button.
    with st.form(key=f"policy_form_{run_id}_{version}", enter_to_submit=False):
        _field_grid(front, newest, values, f"{run_id}_{version}", active)
        if advanced:
            with st.expander(f"Advanced ({len(advanced)} more fields)"):
                _field_grid(advanced, newest, values, f"{run_id}_{version}", active)
        sent = st.form_submit_button("Apply policy change", type="primary",
                                     disabled=not active, key=f"pf_submit_{run_id}")
    if not active:
        st.caption("The run is not active: its policy can no longer be changed.")
    if sent:
        _send(run_id, {k: v for k, v in values.items() if v != newest[k]})
    _answer(run_id)


def _field_grid(fields: list[FormField], newest: dict[str, Any], values: dict[str, Any],
                suffix: str, active: bool) -> None:
    """Fields in four columns, each with its current value under it; fills `values`."""
    cols = st.columns(4)
    for i, field in enumerate(fields):
        with cols[i % 4]:
            now = newest[field.name]
            values[field.name] = _widget(field, now, f"pf_{field.name}_{suffix}", not active)
            # the help sits by the current value, not the input: a widget's help button would
            # share the input's accessible name ("Help for <label>")
            st.caption(f"current: {code(now)}", help=field.help or None)


def _widget(field: FormField, now: Any, key: str, disabled: bool) -> Any:
    """The input for one field, by its type; returns the value it holds."""
    match field.widget:
        case "number":
            top = MAX_SAFE_INT if field.maximum is None else min(field.maximum, MAX_SAFE_INT)
            return st.number_input(field.label, value=int(now), min_value=field.minimum,
                                   max_value=top, step=1, key=key, disabled=disabled)
        case "select":
            index = field.choices.index(now) if now in field.choices else 0
            return st.selectbox(field.label, field.choices, index=index, key=key,
                                disabled=disabled)
        case "checkbox":
            return st.checkbox(field.label, value=bool(now), key=key, disabled=disabled)
        case "word_or_int":
            hint = " or ".join((*field.words, "an integer"))
            text = st.text_input(field.label, value=str(now), placeholder=hint, key=key,
                                 disabled=disabled)
            return _word_or_int(text, field.words)
    return st.text_input(field.label, value=str(now), max_chars=field.max_length, key=key,
                         disabled=disabled)


def _word_or_int(text: str, words: tuple[str, ...]) -> int | str:
    """One of `words`, an integer, or the text as typed (the API names what it allows)."""
    text = text.strip()
    if text in words:
        return text
    try:
        return int(text)
    except ValueError:
        return text


def _send(run_id: str, changes: dict[str, Any]) -> None:
    if not changes:  # the one outcome shown: it replaces an earlier answer
        st.session_state["policy_answer"] = ("unchanged", run_id, None)
        return
    try:
        answer = state.client().set_policy(run_id, changes)
    except Invalid as err:
        st.session_state["policy_answer"] = ("invalid", run_id, err.errors)
        return
    except ApiError as err:
        st.session_state.pop("policy_answer", None)
        banner(err)
        return
    st.session_state["policy_answer"] = ("ok", run_id, answer)
    state.forget_reads()
    rerun_here()


def rerun_here() -> None:
    """Redraw the form at the new version: its fragment alone when this run is that fragment's
    (a browser's submit; the charts follow on their timer), else the whole page (a submit that
    came with a full rerun, which Streamlit may merge it into, or AppTest's)."""
    try:
        st.rerun(scope="fragment")
    except StreamlitAPIException:  # not a fragment's run
        st.rerun()
