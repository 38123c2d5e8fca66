"""The autopilot: the runtime tunes its own policy from its step records, within the bounds the
operator sets (docs/architecture.md, "The autopilot")."""

from asteria_core.autopilot.config import (
    ACTIONS,
    DEFAULT_BOUNDS,
    AutopilotConfig,
    AutopilotError,
    Mode,
    Objective,
)
from asteria_core.autopilot.decide import AUTOPILOT, UNDO, Decision, decide
from asteria_core.autopilot.pilot import (
    Autopilot,
    NoProposal,
    Outcome,
    Proposal,
    ProposalNotOpen,
)

__all__ = ["ACTIONS", "AUTOPILOT", "DEFAULT_BOUNDS", "UNDO", "Autopilot", "AutopilotConfig",
           "AutopilotError", "Decision", "Mode", "NoProposal", "Objective", "Outcome", "Proposal",
           "ProposalNotOpen", "decide"]
