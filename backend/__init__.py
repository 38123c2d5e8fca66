"""The control plane: a FastAPI app over a run store, for launched or attached runs.

`backend.serve(runtime)` serves a user's own training script (see backend/attach.py). It loads
on first use, so `import backend.commands` (the control plane's part of the `asteria` command)
loads no web stack for `train`.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ControlPlane", "serve"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from asteria_core.extras import require

        require("server", f"backend.{name}")  # one line naming the extra, where it is missing
        return getattr(importlib.import_module("backend.attach"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
