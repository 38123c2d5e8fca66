"""The runtime suite's words: the runtime's own CPU per step of each arm, and the attached AdamW
step over the bare one."""

from __future__ import annotations

from typing import Any

from asteria_bench.results import Words


def render(data: dict[str, Any], words: Words) -> None:
    config, runs = data["config"], data["runs"]
    bare, attached, soap = runs
    batch, block = config["batch"]
    table = words.table(
        f"The runtime's own CPU per step ({config['params'] / 1e6:.2f}M-parameter GPT, "
        f"batch {batch} x {block}, {config['threads']} threads, {config['rounds']} x "
        f"{config['steps_per_turn']} steps an arm)",
        ["arm", "step p50 ms", "runtime CPU ms/step", "share of the step",
         "of which basis swaps ms/step", "bookkeeping share"])
    for r in runs:
        cells = [r.get("runtime_cpu_ms_mean"), r.get("runtime_share_of_step"),
                 r.get("swap_cpu_ms_mean"), r.get("bookkeeping_share_of_step")]
        table.add(r["label"], f"{r['step_ms_median']:.1f}",
                  *("-" if v is None else f"{v:{f}}"
                    for v, f in zip(cells, (".3f", ".2%", ".3f", ".2%"), strict=True)))
    words.quote("runtime_share", [attached["runtime_share_of_step"],
                                  soap["runtime_share_of_step"], soap["swap_share_of_step"],
                                  soap["bookkeeping_share_of_step"]],
                "the runtime's own CPU is {value[0]:.2%} of an AdamW step and {value[1]:.2%} "
                "of a SOAP step (the refresh runs on the worker); of the latter, "
                "{value[2]:.2%} is the basis swaps at the boundary (SOAP's own moment "
                "rotation, which native SOAP does inside its step) and {value[3]:.2%} the "
                "runtime's bookkeeping")
    ratio = attached["step_ms_median"] / bare["step_ms_median"]
    words.findings.append(
        f"The attached AdamW step over the bare one, side by side in one run (interleaved "
        f"ABBA turns): {ratio:.4f}.")
