"""The dashboard's policy form is generated from the control plane's OpenAPI document, so a field
added to `Policy` reaches the API schema and the form with nothing else written."""

import dataclasses

from fastapi import FastAPI

import asteria_core.policy as policy_module
from asteria_core.compat import StrEnum
from asteria_core.policy import Policy, policy_fields
from backend.app import create_app
from backend.schemas import policy_update_model
from backend.settings import Settings
from dashboard.components import FormField, form_fields


def test_the_form_has_every_policy_field_with_its_widget():
    doc = create_app(Settings(start_default_run=False)).openapi()
    fields = {f.name: f for f in form_fields(doc)}
    assert list(fields) == [f.name for f in policy_fields()]
    assert fields["staleness_bound"] == FormField(
        "staleness_bound", "Staleness bound S (steps)", fields["staleness_bound"].help,
        "number", minimum=0, maximum=1_000_000)
    assert fields["swap_delay"].widget == "word_or_int"
    assert (fields["swap_delay"].words, fields["swap_delay"].maximum) == (("auto",), 1_000_000)
    assert fields["swap_mode"].choices == ("deterministic", "opportunistic")
    assert fields["pace"].widget == "checkbox"
    assert (fields["disk_dir"].widget, fields["disk_dir"].max_length) == ("text", 4096)
    assert all(f.help for f in fields.values())


def test_a_field_added_to_the_policy_reaches_the_api_schema_and_the_form():
    class TierOrder(StrEnum):
        FAST = "fast"
        CHEAP = "cheap"

    @dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
    class Wider(Policy):
        prefetch: int = policy_module._int(2, 0, 8, "Prefetch (blocks)",
                                           "Blocks fetched from the disk tier ahead of use.")
        tier_order: str = policy_module._choice(TierOrder.FAST, "Tier order",
                                                "Which tier is filled first.")

    app = FastAPI()

    @app.patch("/policy")
    def patch(body: policy_update_model(policy_fields(Wider))) -> None:  # as the route does
        pass

    doc = app.openapi()
    props = doc["components"]["schemas"]["PolicyUpdate"]["properties"]
    assert props["prefetch"]["description"] == "Blocks fetched from the disk tier ahead of use."
    assert (props["prefetch"]["minimum"], props["prefetch"]["maximum"]) == (0, 8)
    fields = {f.name: f for f in form_fields(doc)}
    assert fields["prefetch"] == FormField("prefetch", "Prefetch (blocks)",
                                           "Blocks fetched from the disk tier ahead of use.",
                                           "number", minimum=0, maximum=8)
    assert (fields["tier_order"].widget, fields["tier_order"].choices) == ("select",
                                                                          ("fast", "cheap"))


def test_an_unknown_schema_gives_no_fields_and_odd_types_give_text():
    assert form_fields({}) == ()
    doc = {"components": {"schemas": {"PolicyUpdate": {"properties": {
        "ratio": {"type": "number", "title": "Ratio"}}}}}}
    assert form_fields(doc) == (FormField("ratio", "Ratio", "", "text"),)


def test_the_start_form_offers_the_optimizers_the_api_lists():
    """The run form's optimizers come from the API's schema (the key's setting's choices as its
    enum): the core's registry, not a list copied into the dashboard."""
    from asteria_core.optim.registry import OPTIMIZERS
    from dashboard.components import config_choices

    doc = create_app(Settings(start_default_run=False)).openapi()
    assert config_choices(doc, "optim", "name") == OPTIMIZERS
    assert config_choices(doc, "train", "device") == ("auto", "cpu", "cuda")
    assert config_choices(doc, "optim", "lr") == ()  # not a choice


def test_the_dashboards_statuses_and_commands_are_the_apis():
    """The dashboard talks HTTP only, so it names run statuses and commands itself
    (dashboard/client.py); they are the API's, as its OpenAPI document lists them."""
    from dashboard.client import RunCommand, RunStatus

    schemas = create_app(Settings(start_default_run=False)).openapi()["components"]["schemas"]
    assert list(RunStatus) == schemas["RunStatus"]["enum"]
    assert list(RunCommand) == schemas["RunCommand"]["enum"]
