import math
import threading

import pytest
import torch
from torch import nn

from asteria_core.optim import SOAP, KLShampoo
from asteria_core.policy import PLANNED_DUTY, LivePolicy, Policy
from asteria_core.refresh import RefreshEngine, RefreshFailed
from tests.asteria_core.refresh.faults import RELEASE_HANGS, FaultyRefresh, SlowRefresh

STEPS = 24


def _problem(seed: int = 0):
    """A small two-layer regression; the same data stream for every run with the same seed."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 6))
    g = torch.Generator().manual_seed(seed + 1)
    target = torch.randn(12, 6, generator=g)
    batches = [torch.randn(32, 12, generator=g) for _ in range(STEPS)]
    return model, [(x, x @ target) for x in batches]


def _train(model, opt, batches, on_boundary=None):
    for x, y in batches:
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if on_boundary is not None:
            on_boundary(opt.num_steps)
    return [p.detach().clone() for p in model.parameters()]


def _soap(model, **kw):
    return SOAP(model.parameters(), lr=1e-2, precondition_frequency=3, **kw)


def _train_async(model, opt, batches, policy: Policy) -> list[torch.Tensor]:
    """Train with a refresh engine under `policy`; its parameters after."""
    engine = RefreshEngine(opt, LivePolicy(policy))
    try:
        return _train(model, opt, batches, engine.on_boundary)
    finally:
        engine.close()


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("kind", ["thread", "process"])
@pytest.mark.parametrize("delay", [0, 1, 2])
def test_deterministic_async_equals_native_delayed_reference_bit_for_bit(kind, delay):
    model, batches = _problem()
    reference = _train(model, _soap(model, refresh_delay=delay), batches)

    model, batches = _problem()
    opt = _soap(model)
    # a window of 1: the whole round swapped at s + d, as the optimizer's own delayed mode
    policy = LivePolicy(Policy(refresh_interval=3, staleness_bound=2, swap_delay=delay,
                               swap_window=1, workers=1, worker_kind=kind))
    engine = RefreshEngine(opt, policy)
    try:
        asteria = _train(model, opt, batches, engine.on_boundary)
    finally:
        engine.close()
    for a, b in zip(reference, asteria, strict=True):
        assert torch.equal(a, b)
    assert engine.failures == 0 and engine.inline_fallbacks == 0


def test_kl_shampoo_async_equals_its_delayed_reference():
    def make(model, **kw):
        return KLShampoo(model.parameters(), lr=1e-3, precondition_frequency=3, **kw)

    model, batches = _problem(3)
    reference = _train(model, make(model, refresh_delay=1), batches)
    model, batches = _problem(3)
    asteria = _train_async(model, make(model), batches, Policy(refresh_interval=3, swap_delay=1))
    assert all(torch.equal(a, b) for a, b in zip(reference, asteria, strict=True))


def test_slow_worker_staleness_stays_within_bound_and_waits_only_at_swap_steps():
    model, batches = _problem()
    opt = _soap(model)
    bound, delay = 2, 2
    policy = LivePolicy(Policy(refresh_interval=3, staleness_bound=bound, swap_delay=delay,
                               workers=1))
    engine = RefreshEngine(opt, policy, fn=SlowRefresh(0.05))
    due_at, waited_at, seen = [], [], []

    def boundary(step):
        before = engine.waited_seconds
        engine.on_boundary(step)
        if opt.due_blocks():
            due_at.append(step)
        if engine.waited_seconds > before:
            waited_at.append(step)
        seen.append(max(engine.staleness(step).values()))

    try:
        _train(model, opt, batches, boundary)
    finally:
        engine.close()
    assert max(seen) <= bound and max(seen) == delay
    # The workers are slower than two steps of this tiny problem, so every swap waited, and
    # nothing else did: waits happen exactly at the swap steps s + L + k of the slots k that
    # hold a block, and at step 1, whose first bases are swapped in at once.
    lead = delay - engine.schedule.window(policy.current) + 1
    used = sorted(set(engine.schedule.place(list(engine.blocks), policy.current).values()) or {0})
    assert due_at[0] == 1
    assert waited_at == [1] + sorted(s + lead + k for s in due_at[1:] for k in used
                                     if s + lead + k <= STEPS)
    # The record says why: each refresh took longer than its lead L = d - V + 1, counted in
    # steps of their own length (the waits left out), and the workers' duty is far above 1.
    assert engine.figures.swap_lead == lead
    assert engine.figures.refresh_latency_steps > lead
    assert engine.figures.background_load > 1


@pytest.mark.parametrize("how", ["raise", "nan"])
def test_failed_refresh_keeps_the_old_basis_counts_and_retries(how):
    model, batches = _problem()
    opt = _soap(model)
    engine = RefreshEngine(opt, LivePolicy(Policy(refresh_interval=3, swap_delay=1)),
                           fn=FaultyRefresh({4}, how))
    versions = {}

    def boundary(step):
        engine.on_boundary(step)
        versions[step] = {k: opt.basis_version(k) for k in engine.blocks}

    try:
        _train(model, opt, batches, boundary)
    finally:
        engine.close()
    n_blocks = len(engine.blocks)
    # Refreshes fall due at steps 1, 4, 7, ...; every block's refresh from step 4 failed once.
    assert engine.failures == n_blocks
    assert versions[5] == versions[4]  # the swap at 4 + 1 kept every old basis
    assert all(versions[8][k] == versions[5][k] + 1 for k in engine.blocks)  # retried at 7
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_consecutive_failures_stop_the_run_with_a_clear_error():
    model, batches = _problem()
    opt = _soap(model)
    engine = RefreshEngine(opt, LivePolicy(Policy(refresh_interval=3, swap_delay=1,
                                                  failure_limit=2)),
                           fn=FaultyRefresh({4, 7, 10}, "raise"))
    try:
        with pytest.raises(RefreshFailed, match=r"failed 2 times in a row .*injected"):
            _train(model, opt, batches, engine.on_boundary)
    finally:
        engine.close()


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_hung_worker_does_not_hang_the_run(kind):
    model, batches = _problem()
    opt = _soap(model)
    policy = LivePolicy(Policy(refresh_interval=3, swap_delay=1, workers=1, worker_kind=kind,
                               refresh_timeout_ms=300))
    engine = RefreshEngine(opt, policy, fn=FaultyRefresh({4}, "hang"))
    RELEASE_HANGS.clear()
    try:
        _train(model, opt, batches, engine.on_boundary)
    finally:
        engine.close()
        RELEASE_HANGS.set()
    assert engine.inline_fallbacks >= 1 and engine.failures == 0
    if kind == "process":
        import multiprocessing

        assert multiprocessing.active_children() == []  # the hung process was killed


def test_policy_change_takes_effect_at_the_next_boundary():
    model, batches = _problem()
    opt = _soap(model)
    policy = LivePolicy(Policy(refresh_interval=3, swap_delay=1))
    engine = RefreshEngine(opt, policy)
    due = []

    def boundary(step):
        version = policy.version
        policy.apply_pending(step)
        engine.on_boundary(step)
        if opt.due_blocks():
            due.append(step)
        if step == 10:
            change = policy.propose({"refresh_interval": 5, "staleness_bound": 1})
            assert change.effective_step == 12 and version == 1

    try:
        _train(model, opt, batches, boundary)
    finally:
        engine.close()
    # SOAP's first step sets the basis up (due at 1), then every 3 steps until the change
    # applied at the boundary of step 11, then every 5 (of the optimizer's own step count).
    assert due == [1, 4, 7, 10, 16, 21]
    assert [c.effective_step for c in policy.history()] == [12]
    assert all(g["precondition_frequency"] == 5 for g in opt.param_groups)


def test_workers_resize_mid_run_without_losing_work_and_shutdown_joins_all():
    before = set(threading.enumerate())
    model, batches = _problem()
    opt = _soap(model)
    policy = LivePolicy(Policy(refresh_interval=3, swap_delay=2, workers=1))
    engine = RefreshEngine(opt, policy, fn=SlowRefresh(0.02))

    def boundary(step):
        policy.apply_pending(step)
        engine.on_boundary(step)
        if step == 7:
            policy.propose({"workers": 2})
        if step == 13:
            policy.propose({"workers": 0})

    try:
        _train(model, opt, batches, boundary)
    finally:
        engine.close()
    assert engine.failures == 0 and engine.inline_fallbacks == 0
    assert not [t for t in set(threading.enumerate()) - before
                if t.name.startswith("refresh-")]


def _ages(opt, engine, model, batches):
    """Train; per swap after the first bases, (swap step, the step its statistics were read)."""
    ages = []

    def boundary(step):
        before = {key: opt.basis_version(key) for key in engine.blocks}
        engine.on_boundary(step)
        ages.extend((step, opt.basis_step(key)) for key in engine.blocks
                    if opt.basis_version(key) != before[key] and before[key] > 0)

    try:
        return _train(model, opt, batches, boundary), ages
    finally:
        engine.close()


@pytest.mark.parametrize("window", [3, "auto"])
def test_pacing_reads_each_block_at_its_release_and_keeps_the_swap_steps(window):
    """With pace on, a round's jobs go to the workers over the V boundaries of the swap window,
    about 1/V of the round's cost at each (the first round, swapped in at once, all at once),
    and each block's statistics are read when its job goes out: every basis is d - V + 1
    steps old at its swap. Off, the round is read at once when it falls due (older bases).
    The swap steps are the same either way."""
    interval = delay = 4
    runs = {}
    for pace in (True, False):
        model, batches = _problem(5)
        opt = SOAP(model.parameters(), lr=1e-2, precondition_frequency=interval)
        policy = LivePolicy(Policy(refresh_interval=interval, staleness_bound=delay,
                                   swap_window=window, workers=1, pace=pace))
        engine = RefreshEngine(opt, policy)
        v = engine.schedule.window(policy.current)
        params, ages = _ages(opt, engine, model, batches)
        runs[pace] = params, [at for at, _ in ages]
        assert ages, "no refresh was swapped in"
        lead = delay - v + 1
        if pace:
            assert v > 1
            assert {at - step for at, step in ages} == {lead}  # every basis L steps old
        else:
            assert max(at - step for at, step in ages) == delay  # slot V - 1: d steps old
    assert runs[True][1] == runs[False][1]  # the same swap steps, block by block
    assert not all(torch.equal(a, b) for a, b in zip(runs[True][0], runs[False][0],
                                                     strict=True))


def test_paced_jobs_go_out_over_the_swap_window_by_cost():
    interval = delay = 4
    model, batches = _problem(5)
    opt = SOAP(model.parameters(), lr=1e-2, precondition_frequency=interval)
    engine = RefreshEngine(opt, LivePolicy(Policy(refresh_interval=interval,
                                                  staleness_bound=delay, swap_window=3,
                                                  workers=1)))
    held = []  # per round: (its step, {release step: cost held back for it})

    def boundary(step):
        due = bool(opt.due_blocks())
        engine.on_boundary(step)
        if due:
            slots = {}
            for item in engine.pacer.held:
                slots[item.release_step] = (slots.get(item.release_step, 0)
                                            + engine.blocks[item.key].cost)
            held.append((step, slots))

    try:
        _train(model, opt, batches, boundary)
    finally:
        engine.close()
    total = sum(b.cost for b in engine.blocks.values())
    biggest = max(b.cost for b in engine.blocks.values())
    assert len(held) >= 4, "too few refresh rounds"
    assert held[0] == (1, {})  # first bases: every job out at once
    for step, slots in held[1:]:
        # Slot 0 went out at once; the rest wait for boundaries step+1 .. step+V-1.
        assert set(slots) == {step + 1, step + 2}
        assert all(cost <= total / 3 + biggest for cost in slots.values())
        assert sum(slots.values()) >= total * 2 / 3 - biggest


def _swap_steps(opt, engine, batches, model):
    """Train; per block, the boundaries at which its basis changed (the steps whose refresh
    fell due under "due")."""
    swapped = {key: [] for key in engine.blocks} | {"due": []}

    def boundary(step):
        before = {key: opt.basis_version(key) for key in engine.blocks}
        if opt.due_blocks():
            swapped["due"].append(step)
        engine.on_boundary(step)
        for key in engine.blocks:
            if opt.basis_version(key) != before[key]:
                swapped[key].append(step)

    try:
        params = _train(model, opt, batches, boundary)
    finally:
        engine.close()
    return swapped, params


@pytest.mark.parametrize("workers", [0, 1])
def test_a_rounds_swaps_are_spread_over_the_swap_window_by_cost(workers):
    """Deterministic mode with d = 4 and a swap window V = 2: each block of a round is swapped
    at s + 3 or s + 4, never later than s + d, both boundaries take about half of the round's
    refresh cost, and the same blocks go to the same boundary in every round and with or
    without workers. The first round (its first bases) is swapped in at once."""
    interval, delay, spread = 5, 4, 2
    model, batches = _problem(7)
    opt = _soap(model)
    opt.param_groups[0]["precondition_frequency"] = interval
    engine = RefreshEngine(opt, LivePolicy(Policy(
        refresh_interval=interval, staleness_bound=delay, swap_delay=delay,
        swap_window=spread, workers=workers)))
    blocks = dict(engine.blocks)
    swapped, _ = _swap_steps(opt, engine, batches, model)
    due = swapped.pop("due")
    assert len(due) >= 4, "too few refresh rounds"
    lead = {}
    for key, steps in swapped.items():
        assert len(due) - 1 <= len(steps) <= len(due), (key, steps, due)
        assert steps[0] == due[0] == 1
        offsets = {at - s for at, s in zip(steps[1:], due[1:], strict=False)}
        assert len(offsets) == 1 and offsets <= {delay - 1, delay}, (key, steps, due)
        lead[key] = offsets.pop()
    work = {d: sum(blocks[k].cost for k, at in lead.items() if at == d)
            for d in (delay - 1, delay)}
    total, biggest = sum(work.values()), max(b.cost for b in blocks.values())
    assert all(w > 0 and w <= total / spread + biggest for w in work.values()), work


def test_spread_swaps_train_the_same_numbers_inline_and_on_workers():
    runs = {}
    for workers in (0, 1):
        model, batches = _problem(8)
        opt = _soap(model)
        engine = RefreshEngine(opt, LivePolicy(Policy(
            refresh_interval=3, staleness_bound=4, swap_delay=4, workers=workers)))
        assert engine.schedule.window(engine.policy.current) > 1  # "auto", fitted to the blocks
        runs[workers] = _swap_steps(opt, engine, batches, model)
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1], strict=True))


def test_swap_window_one_is_the_optimizers_own_delayed_mode_bit_for_bit():
    model, batches = _problem(9)
    reference = _train(model, _soap(model, refresh_delay=4), batches)
    model, batches = _problem(9)
    asteria = _train_async(model, _soap(model), batches, Policy(
        refresh_interval=3, staleness_bound=4, swap_delay=4, swap_window=1, workers=1))
    assert all(torch.equal(a, b) for a, b in zip(reference, asteria, strict=True))


def test_a_block_never_swaps_a_newer_refresh_before_an_older_one():
    """A live change of the swap window while a block has two refreshes in flight (interval 2,
    d = 6): the newer round's place may not come before the older one's swap, so a block's
    bases come in the order they fell due, uninterrupted and through a checkpoint's pending
    list alike."""
    model, batches = _problem(11)
    opt = _soap(model)
    opt.param_groups[0]["precondition_frequency"] = 2
    live = LivePolicy(Policy(refresh_interval=2, staleness_bound=6, swap_delay=6, swap_window=1,
                             workers=1))
    engine = RefreshEngine(opt, live)
    steps = []

    def boundary(step):
        if step == 5:  # the refresh of step 3 is in flight (swap at 9); widen the window
            live.propose({"swap_window": 6}, client="test")
            live.apply_pending(step)
        engine.on_boundary(step)
        for queue_ in engine.outstanding.values():
            at = [engine.schedule.swap_step(item, live.current) for item in queue_]
            steps.append(at)
            assert at == sorted(at), at

    try:
        _train(model, opt, batches, boundary)
    finally:
        engine.close()
    assert any(len(at) > 1 and at[0] == at[1] for at in steps), "no round was held back"


def test_blocks_handed_out_first_are_swapped_first():
    """The swap window follows pacing's order: the block in slot k of V is released at s + k and
    swapped at s + d - V + 1 + k (a worker that keeps up has each block done by its swap), and
    each boundary takes about 1/V of the round's refresh cost. "auto" fits V to the blocks:
    the widest whose lead d - V + 1 covers the busiest slot on workers loaded as planned, that
    do a round in PLANNED_DUTY x min(d, interval) steps."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(n, m) for n, m in [(24, 40), (40, 8), (8, 32), (32, 16)]])
    opt = SOAP(model.parameters(), lr=1e-2, precondition_frequency=10)
    policy = Policy(refresh_interval=10, staleness_bound=10, workers=1)  # d = 10, V auto
    engine = RefreshEngine(opt, LivePolicy(policy))
    try:
        blocks = engine.blocks
        due = list(blocks)
        slots = engine.schedule.place(due, policy)
        early = {key: engine.schedule.early(key, 1, slots, policy) for key in due}
        v = engine.schedule.window(policy)
    finally:
        engine.close()
    costs = sorted((b.cost for b in blocks.values()), reverse=True)
    total = sum(costs)
    lead = 10 - v + 1
    assert 1 < v <= 10
    peak = max(sum(blocks[k].cost for k in due if slots[k] == s) for s in range(v))
    span = PLANNED_DUTY * 10  # the steps a round takes on workers loaded as planned
    assert lead >= math.ceil(peak * span / total - 1e-9)  # the lead covers the busiest slot
    if v < 10:  # and one slot more would not have
        wider = Policy(refresh_interval=10, staleness_bound=10, swap_window=v + 1, workers=1)
        engine = RefreshEngine(opt, LivePolicy(wider))
        try:
            wide = engine.schedule.place(due, wider)
        finally:
            engine.close()
        peak = max(sum(blocks[k].cost for k in due if wide[k] == s) for s in range(v + 1))
        assert lead - 1 < math.ceil(peak * span / total - 1e-9)
    for key in due:
        assert early[key] == v - 1 - slots[key]  # swapped at s + lead + slot
    work = [sum(blocks[k].cost for k in due if slots[k] == s) for s in range(v)]
    assert all(w <= total / v + costs[0] for w in work), work
