"""The progress line of a run: a bar with the newest step's loss, tokens/s and step time.

`asteria train` draws it from its own step records; `asteria start` from the ones the control
plane serves (backend/launch.py), so both terminals show the same line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from tqdm import tqdm


def progress_bar(start: int, total: int) -> tqdm[NoReturn]:
    from tqdm import tqdm

    return tqdm(total=total, initial=start, unit="step", dynamic_ncols=True)


def progress_figures(loss: float | None, tokens: int, step_seconds: float,
                     eval_loss: float | None = None) -> dict[str, str]:
    """The figures the line shows of one step; a figure the step lacks is left out."""
    figures = {} if loss is None else {"loss": f"{loss:.4f}"}
    if step_seconds > 0:
        figures["tok/s"] = f"{tokens / step_seconds:,.0f}"
    figures["step_ms"] = f"{step_seconds * 1e3:.1f}"
    if eval_loss is not None:
        figures["val"] = f"{eval_loss:.4f}"
    return figures
