"""The runtime finds its device at the first step: an optimizer built before `model.cuda()`
times, meters and homes state where the parameters train. The meta device stands in for CUDA
(this machine has none): a fake at the hardware boundary; the CUDA test runs on a GPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import asteria_core as asteria
from asteria_core.telemetry.config import TelemetryConfig
from asteria_core.tiers.placement import working_set

QUIET = TelemetryConfig(nvml=False, rapl=False)


def move_in_place(model: nn.Module, device: str) -> None:
    """What `model.cuda()` does to the optimizer's parameters: the same Parameter objects, now
    on `device` (torch swaps the tensors in place, as set_data does for CPU to CUDA)."""
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model.to(device)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)


def host_copies(runtime) -> list[int]:
    """Parameters whose state passes through the tier store's host buffers."""
    return [i for i in range(len(runtime.tiers.params)) if runtime.tiers.buffered(i)]


def host_offloaded(model: nn.Module, tmp_path):
    """SOAP with every parameter's state but the working set homed on the host."""
    probe = asteria.optimizer(model, "soap", run_dir=tmp_path, telemetry=QUIET)
    w = working_set(probe.runtime.tiers.entries)
    probe.runtime.close()
    return asteria.optimizer(model, "soap", run_dir=tmp_path, telemetry=QUIET,
                             policy=asteria.Policy(offload_mode="host", device_budget_bytes=w))


def test_parts_follow_the_parameters_moved_after_the_optimizer_was_built(tmp_path):
    model = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 4))
    opt = host_offloaded(model, tmp_path)
    assert opt.runtime.tiers.tier_bytes()["host"] > 0
    runtime = opt.runtime
    assert runtime.device.type == "cpu" and host_copies(runtime) == []  # host tier in place
    params = list(model.parameters())
    move_in_place(model, "meta")
    assert {p.device.type for p in params} == {"meta"}
    model(torch.ones(2, 32, device="meta"))  # the first training forward starts the step
    assert runtime.device.type == "meta"
    assert runtime.timer.device.type == "meta"
    assert runtime.tiers.device.type == "meta"
    assert host_copies(runtime) != []  # off the CPU, host-homed state is copied in and out
    runtime.close()


def test_parameters_that_stay_put_change_nothing(tmp_path):
    model = nn.Linear(8, 4)
    opt = asteria.optimizer(model, "soap", run_dir=tmp_path, telemetry=QUIET)
    timer, tiers = opt.runtime.timer, opt.runtime.tiers
    model(torch.ones(2, 8)).sum().backward()
    opt.step()
    assert opt.runtime.timer is timer and timer.device.type == "cpu" and tiers.device.type == "cpu"
    opt.runtime.close()


@pytest.mark.gpu
def test_an_optimizer_built_before_model_cuda_times_on_cuda_and_copies_host_state(tmp_path):
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 8))
    opt = host_offloaded(model, tmp_path)
    model.cuda()
    for _ in range(3):
        model(torch.ones(4, 64, device="cuda")).square().mean().backward()
        opt.step()
        opt.zero_grad()
    runtime = opt.runtime
    assert runtime.device.type == "cuda" and runtime.timer.cuda
    assert host_copies(runtime) != []
    homes = [t for t in runtime.tiers.homes.pinned.values()]
    assert homes and all(t.is_pinned() for t in homes)
    record = runtime.end_step()
    assert record is not None and record.phase_seconds["optimizer"] > 0
    runtime.close()
