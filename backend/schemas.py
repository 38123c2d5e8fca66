"""HTTP schemas, separate from the storage rows.

The policy and run config bodies are generated from the core's own descriptions (the policy's
field metadata, the config dataclasses), so a field is written once and the OpenAPI document
follows it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, create_model

from asteria_core.fields import Setting
from asteria_core.policy import policy_fields
from asteria_core.telemetry.records import StepRecord
from backend.config_schema import run_config_model, setting_type
from backend.run_states import RunCommand, RunStatus

CROSS_FIELD_RULES = ("swap_delay <= staleness_bound unless swap_delay is \"auto\"; "
                     "workers >= 1 when swap_mode is opportunistic")
NO_WORKERLESS_OPPORTUNISM = {
    "required": ["swap_mode", "workers"],
    "properties": {"swap_mode": {"const": "opportunistic"}, "workers": {"const": 0}}}
"""The cross-field rule JSON Schema can state (as `not`), for a body naming both fields; the
other (swap_delay <= staleness_bound) compares two values, which it cannot."""


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)  # an omitted field keeps its value; it does not take null


def policy_update_model(fields: Iterable[Setting] | None = None, *,
                        name: str = "PolicyUpdate", patch: bool = True) -> type[BaseModel]:
    """A partial policy built from the policy's own field descriptions (`policy_fields()` by
    default): every field optional, typed strictly, unknown fields refused.

    patch: a change of the policy in force (at least one field; omitted fields keep their
    values); else a run's initial policy (omitted fields take the default shown).
    """
    fields = policy_fields() if fields is None else tuple(fields)
    model_fields: dict[str, Any] = {
        f.name: (setting_type(f), Field(
            default=None, title=f.title, description=f.help,
            json_schema_extra=_no_default if patch else {"default": f.default}))
        for f in fields}
    if patch:
        about = ("A partial policy: only the fields to change (at least one). The change is "
                 "validated whole against the policy it applies to: " + CROSS_FIELD_RULES + ".")
        extra: dict[str, Any] = {"minProperties": 1, "not": NO_WORKERLESS_OPPORTUNISM}
    else:
        about = "Initial policy fields; omitted fields take their defaults."
        extra = {"not": NO_WORKERLESS_OPPORTUNISM}
    config = ConfigDict(extra="forbid", json_schema_extra=extra)
    return create_model(name, __config__=config, __doc__=about, **model_fields)


# Models built at import from the descriptions: to mypy, a model like any other.
if TYPE_CHECKING:
    PolicyUpdate: TypeAlias = BaseModel
    RunPolicy: TypeAlias = BaseModel
    RunConfigSections: TypeAlias = BaseModel
else:
    PolicyUpdate = policy_update_model()
    """The PATCH body of /runs/{id}/policy; dump it with exclude_unset (null is not a value)."""
    RunPolicy = policy_update_model(name="RunPolicy", patch=False)
    RunConfigSections = run_config_model(RunPolicy)


class RunCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    config: RunConfigSections = Field(
        default_factory=RunConfigSections,
        description="Config sections (model, optim, data, train, policy, telemetry) as in a "
                    "config file; omitted keys take their defaults.")
    policy: RunPolicy = Field(default_factory=RunPolicy,
                              description="Initial policy fields, applied over config.policy; "
                                          "omitted take defaults.")


class RunPublic(BaseModel):
    id: str
    status: RunStatus
    step: int
    total_steps: int
    checkpoint_step: int | None
    created_at: float
    updated_at: float
    run_dir: str | None = Field(description=(
        "The run's folder (checkpoints, step records), as an absolute path on the server; "
        "anonymous readers see it relative to the data folder. null for a run a script "
        "attached: the script keeps its own files."))
    error: str | None
    config: dict[str, dict[str, Any]]
    policy_version: int


class CommandAccepted(BaseModel):
    run: RunPublic
    command: RunCommand
    detail: str


class PolicyChangePublic(BaseModel):
    version: int
    effective_step: int
    diff: dict[str, list[Any]]
    client: str
    requested_at: float
    applied_at: float | None
    reason: str = Field("", description="Why, where the asker said: the autopilot's figures "
                                        "behind its change.")


class PolicyPublic(BaseModel):
    version: int
    policy: dict[str, Any]
    pending: list[PolicyChangePublic]


class PolicyAccepted(BaseModel):
    version: int
    effective_step: int = Field(description="The first step trained under the new policy.")
    diff: dict[str, list[Any]]


class StepPage(BaseModel):
    run_id: str
    steps: list[StepRecord] = Field(description="Step records, as the runtime writes them "
                                    "(asteria_core/telemetry/records.py; docs/metrics.md).")
    next_since: int = Field(description="Pass as `since` to get the steps after these.")


class Health(BaseModel):
    status: Literal["ok"]
    active_run: str | None
