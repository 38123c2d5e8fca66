"""Runs: start, list, get, and the commands stop | pause | resume | checkpoint."""

from __future__ import annotations

import dataclasses

from fastapi import APIRouter, Response, status
from fastapi.concurrency import run_in_threadpool

from asteria_core.train.config_io import config_from_dict
from backend import paths, public
from backend.deps import Client, Manager, Reader, RunIdPath, SettingsDep
from backend.run_states import RunCommand
from backend.schemas import CommandAccepted, RunCreate, RunPublic

router = APIRouter(prefix="/runs", tags=["runs"])
COMMAND_DETAIL = {
    RunCommand.STOP: "the run stops at its next step boundary and writes a checkpoint",
    RunCommand.PAUSE: "the run pauses at its next step boundary",
    RunCommand.RESUME: "the run continues (from its checkpoint if it was not active; from the "
                       "one kept before it, saying so, if the newest is damaged)",
    RunCommand.CHECKPOINT: "a checkpoint is written at the next step boundary",
}


@router.post("", status_code=status.HTTP_201_CREATED,
             responses={409: {"description": "a run is already active"},
                        401: {"description": "missing or wrong token"}})
def create_run(body: RunCreate, manager: Manager, _client: Client,
               settings: SettingsDep) -> RunPublic:
    # only the keys sent: omitted ones take their defaults in config_from_dict
    raw = body.config.model_dump(exclude_unset=True)
    changes = body.policy.model_dump(exclude_unset=True)
    paths.check_config(raw, changes, settings)  # before validation reads any of them
    config = config_from_dict(raw)  # ConfigError -> 422
    policy = dataclasses.replace(config.policy, **changes)  # PolicyError -> 422
    return RunPublic.model_validate(manager.start(config, policy))


@router.get("")
def list_runs(manager: Manager, reader: Reader) -> list[RunPublic]:
    """Every run, newest first; without the token, paths and errors shortened (public.py)."""
    return [RunPublic.model_validate(row if reader else public.run(row))
            for row in manager.store.list_runs()]


@router.get("/{run_id}", response_model=RunPublic,
            responses={404: {"description": "no such run"}})
async def get_run(run_id: RunIdPath, manager: Manager, reader: Reader) -> Response | RunPublic:
    """The active run from memory (polled often), any other from the store."""
    body = manager.live_run_json(run_id, anonymous=not reader)
    if body is not None:
        return Response(body, media_type="application/json")
    row = await run_in_threadpool(manager.get, run_id)
    return RunPublic.model_validate(row if reader else public.run(row))


def _command_route(command: RunCommand) -> None:
    def run_command(run_id: RunIdPath, manager: Manager, _client: Client) -> CommandAccepted:
        row, note = manager.command(run_id, command)
        return CommandAccepted(run=RunPublic.model_validate(row), command=command,
                               detail=note or COMMAND_DETAIL[command])

    router.add_api_route(
        f"/{{run_id}}/{command}", run_command, methods=["POST"],
        status_code=status.HTTP_202_ACCEPTED, name=f"{command}_run",
        summary=f"{command.capitalize()} a run", description=COMMAND_DETAIL[command],
        responses={404: {"description": "no such run"},
                   409: {"description": "the run's state does not allow this (a resume: or "
                                         "no checkpoint of it can be used)"},
                   401: {"description": "missing or wrong token"}})


for _command in COMMAND_DETAIL:
    _command_route(_command)
