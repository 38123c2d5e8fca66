"""A run's autopilot (asteria_core/autopilot): read its mode, bounds, proposals and decision
counts; set its mode and bounds (mode off is the kill switch); accept or dismiss a proposal.
What it applies is an ordinary policy change: in /runs/{id}/policy/history with client
`autopilot` and its reason."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, status
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt

from asteria_core.autopilot import ACTIONS, AutopilotConfig, Proposal
from asteria_core.policy import policy_fields
from backend.deps import Client, Manager, RunIdPath

CHOICES = tuple(sorted({c for s in policy_fields() if s.name in ACTIONS for c in s.choices}))
router = APIRouter(prefix="/runs/{run_id}/autopilot", tags=["autopilot"])
ERRORS: dict[int | str, dict[str, Any]] = {404: {"description": "no such run or proposal"},
          409: {"description": "the run is not active, has no autopilot, or the proposal is "
                               "not open"}}
Bound = Annotated[list[StrictInt | Literal[CHOICES]],  # type: ignore[valid-type]
                  Field(min_length=1, max_length=8)]


class AutopilotUpdate(BaseModel):
    """The fields to change (at least one); validated whole, or nothing changes."""

    model_config = ConfigDict(extra="forbid")
    mode: Literal["off", "propose", "apply"] | None = Field(
        None, description="off (the kill switch: at once, open proposals withdrawn) | propose "
                          "(the operator accepts or dismisses each decision) | apply.")
    objective: Literal["time", "energy"] | None = None
    freshen: bool | None = Field(None, description="Spend spare refresh capacity on fresher "
                                                   "bases (an earlier swap, a shorter interval).",
                                 strict=True)
    bounds: dict[Literal[ACTIONS], Bound] | None = Field(  # type: ignore[valid-type]
        None, description="Per policy field: [low, high] for a number, the allowed values for "
                          "a choice. A field not named is never moved. Replaces the bounds "
                          "whole, the defaults included: to add or change one field's bound, "
                          "send every bound to keep (GET shows them); the answer holds the "
                          "bounds now in force.")
    window: StrictInt | None = None
    settle: StrictInt | None = None
    spacing: StrictInt | None = None
    hold: StrictInt | None = None
    guard_steps: StrictInt | None = None
    guard_tolerance: StrictFloat | StrictInt | None = None


class ProposalPublic(BaseModel):
    id: int
    step: int = Field(description="The newest record's step when it was decided.")
    changes: dict[str, Any]
    reason: str
    undo: bool = Field(description="The quality guard's undoing of an earlier change.")
    status: str = Field(description="proposed | applied | accepted | dismissed | superseded "
                                    "| rejected")
    version: int | None = Field(description="The policy version it became, once applied.")


class DecisionCount(BaseModel):
    field: str
    outcome: str
    count: int


class AutopilotPublic(BaseModel):
    config: dict[str, Any]
    decides: bool = Field(description="False on a data-parallel rank other than 0.")
    cores: int | None = Field(None, description=(
        "CPU cores this rank's training and refresh workers share, as the decisions model them "
        "(a worker past cores - 1 adds no capacity of its own); null: not modelled."))
    proposals: list[ProposalPublic] = Field(description="Newest last; at most 200 kept.")
    counts: list[DecisionCount]
    reading: dict[str, Any] | None = Field(None, description=(
        "What the latest decision read: its step, the records read of those its window needs, "
        "and each figure (value, null before a refresh) with the thresholds its rules compare "
        "it with (low, target, high) and what they do; null before the first decision."))


ProposalId = Annotated[int, PathParam(ge=1, le=2**53, description="The proposal's id.")]


def _public(manager: Manager, run_id: str) -> AutopilotPublic:
    return AutopilotPublic(**manager.autopilot(run_id).snapshot())


@router.get("", responses=ERRORS)
def get_autopilot(run_id: RunIdPath, manager: Manager) -> AutopilotPublic:
    return _public(manager, run_id)


@router.patch("", responses={**ERRORS, 401: {"description": "missing or wrong token"}})
def patch_autopilot(run_id: RunIdPath, body: AutopilotUpdate, manager: Manager,
                    _client: Client) -> AutopilotPublic:
    """Change the fields sent; those not sent keep their values, but `bounds`, when sent,
    replaces the bounds whole (the defaults included). Answers the autopilot as it now is."""
    changes = body.model_dump(exclude_unset=True)
    if not changes:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            [{"loc": ["body"], "msg": "no fields to change",
                              "type": "value_error"}])
    AutopilotConfig(**changes)  # the values alone first: a bad one is a 422 on any run
    pilot = manager.autopilot(run_id)
    pilot.configure(dataclasses.replace(pilot.config, **changes))  # AutopilotError -> 422
    return _public(manager, run_id)


def _proposal(proposal: Proposal) -> ProposalPublic:
    return ProposalPublic(**dataclasses.asdict(proposal))


@router.post("/proposals/{proposal_id}/accept",
             responses={**ERRORS, 401: {"description": "missing or wrong token"},
                        422: {"description": "the policy refuses the change"}})
def accept(run_id: RunIdPath, proposal_id: ProposalId, manager: Manager,
           _client: Client) -> ProposalPublic:
    return _proposal(manager.accept_proposal(run_id, proposal_id))


@router.post("/proposals/{proposal_id}/dismiss",
             responses={**ERRORS, 401: {"description": "missing or wrong token"}})
def dismiss(run_id: RunIdPath, proposal_id: ProposalId, manager: Manager,
            _client: Client) -> ProposalPublic:
    return _proposal(manager.autopilot(run_id).dismiss(proposal_id))

