"""HTTP schemas: explicit, separate from the core dataclasses and the storage rows."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

RunStatus = Literal["running", "paused", "finished", "stopped", "failed", "interrupted"]


class PolicyUpdate(BaseModel):
    """A partial policy: only the fields to change. Unknown fields are rejected."""

    model_config = ConfigDict(extra="forbid")

    refresh_interval: int | None = Field(default=None, ge=1, le=1_000_000)
    staleness_bound: int | None = Field(default=None, ge=0, le=1_000_000)
    swap_delay: Annotated[int, Field(ge=0, le=1_000_000)] | Literal["auto"] | None = Field(
        default=None, description='d <= staleness_bound, or "auto" (d follows the bound)')
    swap_mode: Literal["deterministic", "opportunistic"] | None = None
    workers: int | None = Field(default=None, ge=0, le=256)
    worker_threads: int | None = Field(default=None, ge=1, le=256)
    worker_kind: Literal["thread", "process"] | None = None
    worker_nice: int | None = Field(default=None, ge=0, le=19)
    refresh_timeout_ms: int | None = Field(default=None, ge=1, le=86_400_000)
    priority: Literal["stale_then_cost", "fifo"] | None = None
    pace: bool | None = None
    failure_limit: int | None = Field(default=None, ge=1, le=1_000_000)
    device_budget_bytes: int | None = Field(default=None, ge=0, le=2**53)
    host_budget_bytes: int | None = Field(default=None, ge=0, le=2**53)
    disk_dir: str | None = Field(default=None, max_length=4096)
    offload_mode: Literal["none", "host", "disk", "auto"] | None = None


class RunCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    config: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Config sections (model, optim, data, train) as in a config file; "
                    "omitted keys take their defaults.")
    policy: PolicyUpdate = Field(default_factory=PolicyUpdate,
                                 description="Initial policy fields; omitted take defaults.")


class RunPublic(BaseModel):
    id: str
    status: RunStatus
    step: int
    total_steps: int
    checkpoint_step: int | None
    created_at: float
    updated_at: float
    run_dir: str
    error: str | None
    config: dict[str, dict[str, Any]]
    policy_version: int


class CommandAccepted(BaseModel):
    run: RunPublic
    command: str
    detail: str


class PolicyChangePublic(BaseModel):
    version: int
    effective_step: int
    diff: dict[str, list[Any]]
    client: str
    requested_at: float
    applied_at: float | None


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
    steps: list[dict[str, Any]]
    next_since: int = Field(description="Pass as `since` to get the steps after these.")


class Health(BaseModel):
    status: Literal["ok"]
    active_run: str | None
