"""What a basis swap costs the training thread: the rotation of the first moment and the
second moment's re-indexing, and no copy of a whole moment besides (at GPT-2 small's
size the swap step was the slowest of its interval)."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from asteria_core.optim import SOAP, refresh_fn
from asteria_core.optim.layout import map_dim_by
from asteria_core.optim.soap import EXP_AVG_E


def _second_round_results(opt: SOAP, p: torch.Tensor) -> list:
    """Train to the second refresh point (the first basis is in use), and refresh there."""
    gen = torch.Generator().manual_seed(3)
    results = []
    for _ in range(2 * opt.defaults["precondition_frequency"] + 1):
        p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
        due = opt.due_blocks()
        if due and opt.num_steps > 1:
            results = [refresh_fn(opt.snapshot(k), opt.refresh_config(k)) for k in due]
        elif due:  # the first basis, swapped at once
            for k in due:
                opt.apply_refresh(k, refresh_fn(opt.snapshot(k), opt.refresh_config(k)))
    return results


def test_a_swap_copies_no_moment_besides_rotating_it():
    """Rotating a matrix's first moment along its rows used to come out transposed, and its
    install copied the whole moment once more (a contiguous copy) on the training thread."""
    p = torch.zeros(96, 64, requires_grad=True)
    opt = SOAP([p], precondition_frequency=4)
    opt.external_refresh = True
    results = _second_round_results(opt, p)
    assert sorted(r.key.dim for r in results) == [0, 1] and all(
        r.rotation is not None and r.base_version == 1 for r in results)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for result in results:
            opt.apply_refresh(result.key, result)
    ops = [e.key for e in prof.key_averages()]
    copies = {op: n for op, n in ((e.key, e.count) for e in prof.key_averages())
              if op in ("aten::clone", "aten::copy_", "aten::contiguous")}
    assert "aten::mm" in ops  # the rotation itself
    assert copies == {}, copies
    assert opt.state[p][EXP_AVG_E].is_contiguous()


def test_rotating_along_the_first_axis_gives_a_contiguous_result_with_the_same_values():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(40, 3, 7, generator=gen, dtype=torch.float64)
    m = torch.randn(40, 40, generator=gen, dtype=torch.float64)
    y = map_dim_by(x, 0, m)
    assert y.is_contiguous()
    torch.testing.assert_close(y, torch.einsum("iab,ij->jab", x, m))
    z = torch.randn(3, 40, 7, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(map_dim_by(z, 1, m), torch.einsum("aib,ij->ajb", z, m))
