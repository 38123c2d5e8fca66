"""The control plane: a FastAPI app over a run store, for launched or attached runs.

`backend.serve(runtime)` serves a user's own training script (see backend/serve.py).
"""

from backend.serve import ControlPlane, serve

__all__ = ["ControlPlane", "serve"]
