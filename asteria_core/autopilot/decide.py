"""The autopilot's decision: a window of step records, the policy in force and its change history
in; at most one change out, with the reason that cites the figures behind it.

No clock and no randomness: steps are the only time it knows, so a recorded run (its records and
its policy history) replays into the same decisions (tests/asteria_core/autopilot/test_pilot.py).

In order, the first rule that has something to do wins:
1. the quality guard: the loss after the autopilot's last change regressed beyond noise -> undo
   it (and hold its fields);
2. refreshes fall behind (the duty against the steps a round has, min(d, interval), above 1;
   or the step waits for them, or in a data-parallel run for another rank's: sync_wait) ->
   give them time: the swap delay back up to min(S, interval); where the workers keep up but a
   refresh outlasts its lead (latency above the lead: one block alone takes longer), a lead
   that covers it (a narrower swap window, else a longer d); else more workers, then more steps for
   a round (a larger S while d is short of the interval, else a longer interval with S along;
   in the workers' change when their bound leaves the duty above the target, a worker on the
   training thread's own core counting for no capacity), then a larger S (before a second
   longer interval when steps still wait at the bound);
3. the step waits for a slower tier -> a device budget that holds the disk's share too, or
   disk -> host, or a larger budget on the faster tier;
4. with room to spare (duty under half), where the operator asks for fresher bases (`freshen`)
   and has set the swap window: an earlier swap (d below S: no extra work, but a refresh's
   latency must fit d). The "auto" window already swaps each basis as soon after its read as
   the blocks' work allows (refresh/schedule.py): a smaller d would only narrow the pacing;
5. with much room (duty under 0.3, 0.5 for the energy objective): one worker fewer, if the rest
   stay under 0.8;
6. time objective with `freshen`, much room: a shorter refresh interval while the duty it
   predicts stays under 0.8.
Hysteresis: a change aims at a duty of 0.8, and the rules that add work only act below 0.5 or
0.3, the rules that remove it above 1.05, so a change does not call for its own undoing; nor
does the autopilot turn a field back the way it moved it within `hold` steps (only the quality
guard may). A decision reads `settle` steps after the last change, then `window` records, and
at least two refresh rounds, under the policy in force (before any change: from step 2, the
first step's first bases being a one-off); when the step waits 10% of its time or more (for
refreshes, a slower tier or another rank), or the duty is above 1.05 (measured from the last
round's refresh seconds: every round will wait), half the window, at least one round, is
enough: every step of a long look costs that much. `spacing` steps lie between changes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from asteria_core.autopilot.config import AutopilotConfig, Objective
from asteria_core.autopilot.signals import Record, Signals, loss_shift, read
from asteria_core.fields import AUTO
from asteria_core.policy import PLANNED_DUTY, OffloadMode, SwapMode

AUTOPILOT = "autopilot"
"""The client name of the autopilot's policy changes (the audit's actor)."""
UNDO = "quality guard"
"""How an undo's reason begins."""

TARGET_DUTY = PLANNED_DUTY  # 0.8, what `asteria plan` recommends and "auto" windows assume
BEHIND_DUTY = 1.05
BEHIND_WAIT = 0.02  # share of step time waited for refreshes
TIER_WAIT = 0.05  # share of step time waited for a slower tier
SYNC_WAIT = 0.05  # share of step time waited for another rank (ranks drift a little anyway)
EARLY_SWAP_DUTY = 0.5
SPARE_DUTY: dict[str, float] = {Objective.TIME: 0.3, Objective.ENERGY: 0.5}
URGENT_WAIT = 0.1  # share of step time waited (any cause) that is read over a shorter window
FIRST_READ = 2  # the first record a decision reads before any change: step 1 has first bases


@dataclass(frozen=True)
class Decision:
    changes: dict[str, Any]
    reason: str
    step: int
    """The newest record's step when it was decided."""
    undo: bool = False


def _after(change: Mapping[str, Any]) -> int:
    return int(change["effective_step"])


def _tuning(change: Mapping[str, Any]) -> bool:
    """The autopilot's own change, not an undo of one (an operator's is neither)."""
    return change["client"] == AUTOPILOT and not str(change.get("reason", "")).startswith(UNDO)


def window_size(policy: Mapping[str, Any], config: AutopilotConfig,
                urgent: bool = False) -> int:
    """Records a decision reads: `window`, and at least two refresh rounds (a duty or a wait
    read over less than a round says more about where the window fell than about the work).
    `urgent` (the step waits URGENT_WAIT of its time or more): half of it, at least a round."""
    interval = int(policy["refresh_interval"])
    if urgent:
        return max(config.window // 2, interval, 5)
    return max(config.window, 2 * interval)


def _urgent(s: Signals, policy: Mapping[str, Any]) -> bool:
    """Steps wait URGENT_WAIT of their time or more, or the workers have more work than time
    (the duty comes from the last round's measured refresh seconds, not from where the
    window fell: every round from now on will wait)."""
    duty = window_duty(s.duty, policy)
    return max(s.refresh_wait, s.transfer_wait, s.sync_wait) >= URGENT_WAIT \
        or (duty is not None and duty > BEHIND_DUTY)


@dataclass(frozen=True)
class Held:
    fields: set[str]
    """Fields the autopilot leaves alone now."""
    last_move: dict[str, tuple[Any, Any]]
    """(old, new) of the autopilot's own last move of a field, within `hold` steps."""


def held_fields(history: Sequence[Mapping[str, Any]], now: int, config: AutopilotConfig,
                holds: Mapping[str, int] | None = None) -> Held:
    """What the autopilot leaves alone at step `now`: fields an operator changed, or an undo
    restored, within `config.hold` steps, and those `holds` keeps until a later step (a
    dismissed proposal); and the direction of its own recent moves, not to be turned back."""
    held = {name for name, until in (holds or {}).items() if until > now}
    moves: dict[str, tuple[Any, Any]] = {}
    for change in history:
        if _after(change) + config.hold <= now:
            continue
        if _tuning(change):
            moves.update({k: tuple(v) for k, v in change["diff"].items()})
        else:
            held.update(change["diff"])
    return Held(held, moves)


def _guard(records: Sequence[Record], history: Sequence[Mapping[str, Any]], now: int,
           config: AutopilotConfig) -> Decision | None:
    """Undo the autopilot's newest change if the loss regressed after it. Judged once its
    `guard_steps` after it are recorded, while nobody changed the policy since, from records
    fixed by then: the verdict never depends on when it is asked."""
    if not history:
        return None
    change = history[-1]
    if not _tuning(change):
        return None  # the newest change is an operator's or an undo: nothing to judge
    start, g = _after(change), config.guard_steps
    if now < start + g - 1:
        return None
    before = [r for r in records if start - g <= r["step"] < start]
    after = [r for r in records if start <= r["step"] < start + g]
    if len(before) < g or len(after) < g:
        return None  # not both sides whole (yet, or any more): no verdict
    shift = loss_shift(before, after)
    if shift is None or not shift.regressed(config.guard_tolerance):
        return None
    restore = {name: old for name, (old, _new) in change["diff"].items()}
    moves = ", ".join(f"{n} {new} -> {old}" for n, (old, new) in change["diff"].items())
    return Decision(restore, f"{UNDO}: {shift.describe()}, beyond tolerance "
                             f"{config.guard_tolerance:g} after v{change['version']}: {moves}",
                    now, undo=True)


def _move(policy: Mapping[str, Any], name: str, value: Any, config: AutopilotConfig,
          held: Held) -> dict[str, Any] | None:
    """{name: value} within its bound, or None when the field is not the autopilot's to move,
    the bound leaves it where it is, or it would turn back the autopilot's own recent move."""
    if name not in config.bounds or name in held.fields:
        return None
    value = config.within(name, value)
    if value is None or value == policy[name]:
        return None
    last = held.last_move.get(name)
    if last is not None and direction(last[0], last[1]) == -direction(policy[name], value):
        return None  # hysteresis: not back the way it came within `hold` steps
    return {name: value}


def direction(old: Any, new: Any) -> int:
    """+1 up, -1 down, 0 for what has no order (a choice, "auto")."""
    if isinstance(old, int) and isinstance(new, int):
        return (new > old) - (new < old)
    return 0


def _delay(policy: Mapping[str, Any]) -> int:
    d = policy["swap_delay"]
    return min(policy["staleness_bound"], policy["refresh_interval"]) if d == AUTO else int(d)


def window_duty(duty: float | None, policy: Mapping[str, Any]) -> float | None:
    """The duty against the steps a round may take: its blocks are swapped in by d steps after
    it falls due, so the workers have min(d, interval) steps of an interval for it, not the
    interval (a longer interval past d gives them no more time)."""
    if duty is None:
        return None
    interval = policy["refresh_interval"]
    due = policy["staleness_bound"] if policy["swap_mode"] == SwapMode.OPPORTUNISTIC \
        else _delay(policy)  # opportunistic: in by the bound
    return duty * interval / max(min(due, interval), 1)


def _capacity(workers: int, added: int, cores: int | None) -> int:
    """The workers' capacity `added` workers are counted as, in workers of the duty's measure:
    those on the cores the training thread leaves free (`cores` - 1; None: as many as asked),
    never fewer than the `workers` the duty was measured with. A worker on the training's own
    core adds no capacity of its own: it takes its time from the training's, which the duty,
    read at the steps' own (slower) time, does not show."""
    if cores is None:
        return added
    return max(workers, min(added, cores - 1))


def _behind(s: Signals, policy: Mapping[str, Any], config: AutopilotConfig,
            held: Held, cores: int | None = None) -> dict[str, Any] | None:
    # sync_wait: in a data-parallel run this rank waits at the swap steps of blocks another
    # rank refreshes when those refreshes are late (a slowed rank): the same remedies help
    # every rank, and only rank 0 decides, so its waits for the others count too
    duty = window_duty(s.duty, policy)
    waits = s.refresh_wait > BEHIND_WAIT or s.sync_wait > SYNC_WAIT
    if not ((duty is not None and duty > BEHIND_DUTY) or waits):
        return None
    # a d short of the interval leaves a round less than its interval; past the interval (or
    # S) a later swap gives the workers no more time
    full = min(policy["staleness_bound"], policy["refresh_interval"])
    if _delay(policy) < full and (move := _move(policy, "swap_delay", full, config, held)):
        return move
    bound = policy["staleness_bound"]
    if s.latency_at_lead and s.latency is not None and s.lead is not None \
            and (s.latency > s.lead or waits) and (duty is None or duty <= 1.0) \
            and (move := _longer_lead(s, policy, config, held)):
        return move
    need = (duty or 1.0) / TARGET_DUTY  # how much more time or capacity the work needs
    workers = policy["workers"]
    more = max(workers + 1, math.ceil(workers * need)) if workers else 1
    if added := _move(policy, "workers", more, config, held):
        # the workers' bound short of the need: the time still missing, in the same change
        # (the duty they leave above the target the change aims at: no headroom for a
        # slower round, and every round's waits queue behind the one before)
        left = need * workers / _capacity(workers, added["workers"], cores)
        if left > 1.0 and (time := _more_time(left, policy, config, held)):
            return added | time
        return added
    longer = _more_time(need, policy, config, held)
    # Steps still wait at the bound after a longer interval: a refresh takes longer than the
    # S steps it may lag (latency, not capacity), so S grows first (d follows it on "auto").
    larger = _move(policy, "staleness_bound", max(bound + 1, 2 * bound), config, held) \
        if s.at_bound > 0.2 else None
    if larger and "refresh_interval" in held.last_move:
        return larger
    return longer or larger


def _more_time(need: float, policy: Mapping[str, Any], config: AutopilotConfig,
               held: Held) -> dict[str, Any] | None:
    """`need` times the steps a round has: while d is short of the interval, a larger S (d
    follows it on "auto"; no more work, later swaps), up to the interval; else a longer
    interval, with S along (past d a round would gain no time from it)."""
    interval, bound, delay = policy["refresh_interval"], policy["staleness_bound"], \
        _delay(policy)
    follows = policy["swap_delay"] == AUTO  # d is S
    if follows and delay < interval and (move := _move(
            policy, "staleness_bound", min(interval, max(bound + 1, math.ceil(delay * need))),
            config, held)):
        return move
    target = max(interval + 1, math.ceil(interval * min(max(need, 1.25), 4.0)))
    if not (follows and delay >= interval):
        return _move(policy, "refresh_interval", target, config, held)
    # no longer than S can follow, where that is longer at all: past d, a longer interval buys
    # less time than the d steps it lacks, and costs fresher bases all the same
    along = _move(policy, "staleness_bound", target, config, held)
    reach = along["staleness_bound"] if along else bound
    longer = _move(policy, "refresh_interval", reach if interval < reach < target else target,
                   config, held)
    if longer:
        longer |= _move(policy, "staleness_bound", longer["refresh_interval"], config,
                        held) or {}
    return longer


def _longer_lead(s: Signals, policy: Mapping[str, Any], config: AutopilotConfig,
                 held: Held) -> dict[str, Any] | None:
    """Refreshes outlast their lead L = d - V + 1 while the workers keep up (one block alone
    takes longer than L steps: no worker or interval helps): a lead of their latency (one step
    more, at least), from a narrower swap window; where d is too short for that lead even at
    V = 1, a longer d: by V - 1 more for an explicit V, by the interval - 1 for "auto" (it may
    widen up to min(d, interval) as d grows). On "auto" (d = min(S, interval)) a larger S gives
    it up to the interval; past the interval, d is set, with S along where it must be."""
    assert s.latency is not None and s.lead is not None  # latency_at_lead
    delay, lead = _delay(policy), max(s.latency, s.lead + 1)
    narrower = delay - lead + 1
    if narrower >= 1 and (move := _move(policy, "swap_window", narrower, config, held)):
        return move
    if policy["swap_delay"] != AUTO:
        return None
    window = policy["swap_window"]
    interval = policy["refresh_interval"]
    need = lead + (interval if window == AUTO else int(window)) - 1
    if need <= interval:
        return _move(policy, "staleness_bound", need, config, held)
    later = _move(policy, "swap_delay", need, config, held)
    if later is None or later["swap_delay"] <= policy["staleness_bound"]:
        return later
    along = _move(policy, "staleness_bound", later["swap_delay"], config, held)
    return later | along if along and along["staleness_bound"] >= later["swap_delay"] else None


def _tier_bound(s: Signals, policy: Mapping[str, Any], config: AutopilotConfig,
                held: Held) -> dict[str, Any] | None:
    """Steps wait for state on a slower tier: bring it nearer in one move where the bounds
    allow: a device budget that holds what is on disk too; else all of it to the host (offload
    host: no disk at all); else a doubled device budget (within its bound), else a doubled host
    budget (more staging: a deeper prefetch)."""
    if s.transfer_wait <= TIER_WAIT:
        return None
    device = policy["device_budget_bytes"]
    bound = config.bounds.get("device_budget_bytes")
    if device > 0 and s.disk_bytes and bound is not None and bound[1] >= device + s.disk_bytes \
            and (move := _move(policy, "device_budget_bytes", device + s.disk_bytes, config,
                               held)):
        return move
    if policy["offload_mode"] == OffloadMode.DISK and (
            move := _move(policy, "offload_mode", OffloadMode.HOST.value, config, held)):
        return move
    for budget in ("device_budget_bytes", "host_budget_bytes"):
        if policy[budget] > 0 and (move := _move(policy, budget, 2 * policy[budget], config,
                                                 held)):
            return move
    return None


def _early_swap(s: Signals, policy: Mapping[str, Any], config: AutopilotConfig,
                held: Held) -> dict[str, Any] | None:
    duty = window_duty(s.duty, policy)
    if not config.freshen or duty is None or duty >= EARLY_SWAP_DUTY \
            or s.refresh_wait > BEHIND_WAIT / 4 or policy["swap_window"] == AUTO:
        return None
    delay = _delay(policy)
    # A model, not a measurement: a round's work is due within min(d, interval) steps, so d
    # steps instead of `delay` load the workers about span / d times more.
    span = min(delay, policy["refresh_interval"])
    target = max(1, math.ceil(span * duty / TARGET_DUTY))
    if target > delay - 2:
        return None
    return _move(policy, "swap_delay", target, config, held)


def _fewer_workers(s: Signals, policy: Mapping[str, Any], config: AutopilotConfig,
                   held: Held) -> dict[str, Any] | None:
    workers, duty = policy["workers"], window_duty(s.duty, policy)
    if duty is None or workers < 2 or duty >= SPARE_DUTY[Objective(config.objective)]:
        return None
    if duty * workers / (workers - 1) > TARGET_DUTY:
        return None
    return _move(policy, "workers", workers - 1, config, held)


def _shorter_interval(s: Signals, policy: Mapping[str, Any], config: AutopilotConfig,
                      held: Held) -> dict[str, Any] | None:
    if not config.freshen or config.objective != Objective.TIME or s.duty is None \
            or s.duty >= SPARE_DUTY[Objective.TIME] or s.refresh_wait > BEHIND_WAIT / 4:
        return None
    interval = policy["refresh_interval"]
    shorter = max(1, math.ceil(interval * s.duty / TARGET_DUTY))
    if shorter > interval * 3 // 4:
        return None
    return _move(policy, "refresh_interval", shorter, config, held)


RULES = (_behind, _tier_bound, _early_swap, _fewer_workers, _shorter_interval)


def decide(records: Sequence[Record], policy: Mapping[str, Any],
           history: Sequence[Mapping[str, Any]], config: AutopilotConfig,
           holds: Mapping[str, int] | None = None, cores: int | None = None) -> Decision | None:
    """At most one policy change for the newest of `records` (oldest first, as JSON), under
    `policy` (the newest, as a dict) with its `history` (applied changes, oldest first, each
    with version, effective_step, diff {field: [old, new]}, client and reason). `cores`: the
    CPU cores this rank's training thread and its refresh workers share (None: not modelled,
    every worker a core of its own)."""
    if not records:
        return None
    now = int(records[-1]["step"])
    if guarded := _guard(records, history, now, config):
        return guarded
    since = max((_after(c) for c in history), default=0)
    if history and now - since + 1 < config.spacing:
        return None
    version = records[-1].get("policy_version")
    # after a change, `settle` steps; at the start only the first step (its first bases,
    # computed at once, a one-off): a run that starts behind is answered a settle sooner
    first = since + config.settle if history else FIRST_READ
    under = [r for r in records if r.get("policy_version") == version and r["step"] >= first]
    full, short = window_size(policy, config), window_size(policy, config, urgent=True)
    if len(under) >= full:
        signals = read(under[-full:])
    elif len(under) >= short and _urgent(early := read(under[-short:]), policy):
        signals = early  # a severe wait need not wait for the whole window
    else:
        return None
    held = held_fields(history, now, config, holds)
    for rule in (functools.partial(_behind, cores=cores), *RULES[1:]):
        if changes := rule(signals, policy, config, held):
            moves = ", ".join(f"{k} {policy[k]} -> {v}" for k, v in changes.items())
            return Decision(changes, f"{signals.describe()}: {moves}", now)
    return None
