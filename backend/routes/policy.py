"""A run's live policy: read it, change it (validated whole), and its audit history."""

from __future__ import annotations

import dataclasses

from fastapi import APIRouter, HTTPException, status

from backend import paths
from backend.deps import Client, Manager, SettingsDep
from backend.schemas import PolicyAccepted, PolicyChangePublic, PolicyPublic, PolicyUpdate

router = APIRouter(prefix="/runs/{run_id}/policy", tags=["policy"])


@router.get("", responses={404: {"description": "no such run"}})
def get_policy(run_id: str, manager: Manager) -> PolicyPublic:
    policy, version, pending = manager.policy(run_id)
    return PolicyPublic(version=version, policy=policy,
                        pending=[_public(dataclasses.asdict(c)) for c in pending])


@router.patch("", responses={404: {"description": "no such run"},
                             409: {"description": "the run is not active"},
                             401: {"description": "missing or wrong token"}})
def patch_policy(run_id: str, body: PolicyUpdate, manager: Manager,
                 client: Client, settings: SettingsDep) -> PolicyAccepted:
    changes = body.model_dump(exclude_unset=True)
    if not changes:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            [{"loc": ["body"], "msg": "no fields to change",
                              "type": "value_error"}])
    paths.check_policy(changes, settings)  # before the tier store's check creates the folder
    change = manager.propose_policy(run_id, changes, client)  # PolicyError -> 422
    return PolicyAccepted(version=change.version, effective_step=change.effective_step,
                          diff={k: list(v) for k, v in change.diff.items()})


@router.get("/history", responses={404: {"description": "no such run"}})
def policy_history(run_id: str, manager: Manager) -> list[PolicyChangePublic]:
    manager.get(run_id)
    return [_public(row) for row in manager.store.policy_changes(run_id)]


def _public(change: dict) -> PolicyChangePublic:
    return PolicyChangePublic(
        version=change["version"], effective_step=change["effective_step"],
        diff={k: list(v) for k, v in change["diff"].items()}, client=change["client"],
        requested_at=change["requested_at"], applied_at=change["applied_at"])
