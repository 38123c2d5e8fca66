"""A run's live policy: read it, change it (validated whole), and its audit history."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from asteria_core.policy import PolicyChange
from backend import paths, public
from backend.deps import Client, Manager, Reader, RunIdPath, SettingsDep
from backend.schemas import PolicyAccepted, PolicyChangePublic, PolicyPublic, PolicyUpdate

router = APIRouter(prefix="/runs/{run_id}/policy", tags=["policy"])


@router.get("", responses={404: {"description": "no such run"}})
def get_policy(run_id: RunIdPath, manager: Manager, reader: Reader) -> PolicyPublic:
    policy, version, pending = manager.policy(run_id)
    if not reader:  # paths and who asked are for token holders (public.py)
        policy, pending = public.policy(policy), [public.change(c) for c in pending]
    return PolicyPublic(version=version, policy=policy, pending=[_public(c) for c in pending])


@router.patch("", responses={404: {"description": "no such run"},
                             409: {"description": "the run is not active"},
                             401: {"description": "missing or wrong token"}})
def patch_policy(run_id: RunIdPath, body: PolicyUpdate, manager: Manager,
                 client: Client, settings: SettingsDep) -> PolicyAccepted:
    changes = body.model_dump(exclude_unset=True)
    if not changes:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            [{"loc": ["body"], "msg": "no fields to change",
                              "type": "value_error"}])
    manager.get(run_id)  # 404 first
    paths.check_policy(changes, settings)  # before the tier store's check creates the folder
    change = manager.propose_policy(run_id, changes, client)  # PolicyError -> 422
    return PolicyAccepted(version=change.version, effective_step=change.effective_step,
                          diff={k: list(v) for k, v in change.diff.items()})


@router.get("/history", responses={404: {"description": "no such run"}})
def policy_history(run_id: RunIdPath, manager: Manager, reader: Reader) -> list[PolicyChangePublic]:
    """Every change, including one acknowledged but not yet in force (applied_at null); the
    client that asked is shown to token holders only."""
    manager.get(run_id)
    changes = manager.policy_history(run_id)
    return [_public(change if reader else public.change(change)) for change in changes]


def _public(change: PolicyChange) -> PolicyChangePublic:
    return PolicyChangePublic(
        version=change.version, effective_step=change.effective_step,
        diff={k: list(v) for k, v in change.diff.items()}, client=change.client,
        requested_at=change.requested_at, applied_at=change.applied_at, reason=change.reason)
