"""The round-robin suites' arrangements: where training and the refresh workers run."""

import os
import threading

import pytest
import torch

from asteria_bench import turns
from asteria_bench.options import BenchOptions
from tests.components import missing

TINY = ["--model.n_layer", "1", "--model.n_embd", "32", "--model.n_head", "2",
        "--model.block_size", "32", "--data.batch_size", "4",
        "--policy.refresh_interval", str(turns.INTERVAL)]


def test_device_host_pins_every_arms_training_and_only_asterias_workers(tmp_path, monkeypatch):
    """Every arm trains on the device CPU with one thread; Asteria's worker runs on the host CPU;
    the calling thread is pinned only while an arm builds, trains or evaluates."""
    if not hasattr(os, "sched_setaffinity"):
        missing("os.sched_setaffinity (pinning a thread needs Linux)")
    if max(turns.DEVICE_CPU, turns.HOST_CPU) >= (os.cpu_count() or 1):
        missing(f"CPUs {turns.DEVICE_CPU} and {turns.HOST_CPU} for the device-host arrangement")
    configs = [turns.arranged(turns.Config(label, args, "soap"), "device-host") for label, args in
               (("native", [*turns.SOAP, *turns.NATIVE]),
                ("asteria", [*turns.SOAP, *turns.asteria(5)]))]
    seen: dict[str, list] = {"native": [], "asteria": []}
    build = turns.build

    def build_and_watch(config, *args):
        # Thread objects, not idents: an ident freed by a thread that ended is reused.
        before, cpus = set(threading.enumerate()), os.sched_getaffinity(0)
        contender = build(config, *args)
        assert os.sched_getaffinity(0) == cpus  # pinned for the build only, not after it
        workers = [t for t in threading.enumerate()  # this arm's own (its pool starts eagerly)
                   if t not in before and t.name.startswith("refresh-worker")]

        def look(step):
            seen[config.label].append((os.sched_getaffinity(0), torch.get_num_threads(),
                                       [os.sched_getaffinity(t.native_id) for t in workers]))
        contender.trainer.runtime.at_boundary(look)
        return contender

    monkeypatch.setattr(turns, "build", build_and_watch)
    affinity = os.sched_getaffinity(0)
    opts = BenchOptions(quick=True, out_dir=tmp_path, corpus=None, device="cpu", peers=False,
                        command="test", progress=False)
    runs = turns.round_robin(configs, 2 * turns.INTERVAL, tmp_path, opts, TINY)
    assert os.sched_getaffinity(0) == affinity
    assert [r["threads"] for r in runs] == [1, 1]
    for r in runs:  # the device's own busy time beside the wall time, step by step
        assert len(r["step_cpu_ms"]) == len(r["step_ms"]) == 2 * turns.INTERVAL
        assert all(ms > 0 for ms in r["step_cpu_ms"]) and r["cpu_spike"] >= 1.0
    for label in ("native", "asteria"):
        assert len(seen[label]) == 2 * turns.INTERVAL
        assert all(cpus == {turns.DEVICE_CPU} and threads == 1
                   for cpus, threads, _ in seen[label]), label
    assert all(w == [] for _, _, w in seen["native"])  # native refreshes inline: no worker
    assert all(w and all(c == {turns.HOST_CPU} for c in w) for _, _, w in seen["asteria"])


def test_an_unknown_arrangement_names_the_allowed_ones():
    with pytest.raises(ValueError, match="^arrangement: got 'gpu'; allowed: shared | "
                                         "device-host$"):
        turns.arrangement_args("gpu")
    assert turns.arrangement_args("shared") == []
