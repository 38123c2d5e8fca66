"""The suites' plots (matplotlib, no display): one function a kind of figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path, caption: str, dpi: int = 100) -> dict[str, str]:
    """Write `fig` to `path`, close it, and return the plot's entry for a suite's `plots`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return {"file": path.name, "caption": caption}


def step_time_plot(runs: list[dict[str, Any]], path: Path, title: str) -> dict[str, str]:
    """Every configuration's step time per step, one panel a family (SOAP, KL-Shampoo, ...),
    each beside AdamW; log scale, so a refresh spike and a flat line both read."""
    plt = pyplot()
    families = [f for f in dict.fromkeys(r["family"] for r in runs) if f != "adamw"] or ["adamw"]
    fig, axes = plt.subplots(len(families), 1, figsize=(10, 3.6 * len(families)), sharex=True,
                             squeeze=False)
    for ax, family in zip(axes[:, 0], families, strict=True):
        for r in runs:
            if r["family"] in (family, "adamw"):
                ax.plot(r["step_ms"], label=r["label"], linewidth=1)
        ax.set_yscale("log")
        ax.set_ylabel("step time, ms (measured, log)")
        ax.set_title(f"{family}: {title}")
        ax.legend(fontsize=8)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    return save(fig, path, title)


def xy_plot(series: list[tuple[str, list[float], list[float]]], path: Path, *, title: str,
            xlabel: str, ylabel: str) -> dict[str, str]:
    """Lines (label, x, y) in one panel."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    for label, x, y in series:
        ax.plot(x, y, marker="o", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save(fig, path, title)
