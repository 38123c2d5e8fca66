"""Tiered optimizer state: device, host and disk homes under byte budgets, prefetched ahead of
use (docs/architecture.md, "The three runtime ideas")."""

from asteria_core.tiers.disk import DiskTier, TierFileError
from asteria_core.tiers.lifecycle import BACKGROUND, CLASSES, COLD, READ, WRITTEN, Entry
from asteria_core.tiers.placement import Plan, plan, working_set
from asteria_core.tiers.store import TierStore

__all__ = [
    "BACKGROUND",
    "CLASSES",
    "COLD",
    "READ",
    "WRITTEN",
    "DiskTier",
    "Entry",
    "Plan",
    "TierFileError",
    "TierStore",
    "plan",
    "working_set",
]
