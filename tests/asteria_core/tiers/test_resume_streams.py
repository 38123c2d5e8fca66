"""Resuming streams the optimizer state from the checkpoint (checkpoints at 1B).

Resume used to read the whole checkpoint into memory (torch.load without mmap) and then place
the optimizer's state into its tiers: at the moment of loading the state was in memory twice,
and a disk tier did not help (its share was read in whole, then written to its files). Now the
checkpoint is mapped and each tensor is copied out into its tier, its pages pushed out again.

Measured in a fresh process (peak RSS, VmHWM, reset through /proc/self/clear_refs just before
the load) on ~200 MB of SOAP state, most of it on the disk tier: the peak growth
must stay well under the state's size (it was all of it), no tensor may still view the
checkpoint file afterwards (the next save replaces it), and the resumed run must train exactly
as the uninterrupted one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.asteria_core.tiers.streams import PRELUDE

SCRIPT = PRELUDE + textwrap.dedent('''
    out, phase = Path(sys.argv[1]), sys.argv[2]

    if phase == "save":
        model, opt = build(out / "a")
        train(model, opt, 2, seed=1)
        ckpt.save_atomic({"format_version": ckpt.FORMAT_VERSION, "model": model.state_dict(),
                          "optimizer": opt.state_dict()}, out / "checkpoint.pt")
        train(model, opt, 2, seed=2)
        torch.save([p.detach().clone() for p in model.parameters()], out / "straight.pt")
        tiers = opt.runtime.tiers
        print(json.dumps({"disk_bytes": tiers.tier_bytes()["disk"],
                          "state_bytes": sum(e.nbytes for e in tiers.entries)}))
        opt.runtime.close()
    else:
        model, opt = build(out / "b")
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS now
        start = kib("VmRSS:")
        saved = ckpt.load(out / "checkpoint.pt")
        # as the trainer's resume does (before: model.load_state_dict)
        getattr(ckpt, "restore_module", type(model).load_state_dict)(model, saved["model"])
        opt.load_state_dict(saved["optimizer"])
        growth = kib("VmHWM:") - start
        del saved
        gc.collect()
        resume_rss = kib("VmRSS:") - start
        target = str((out / "checkpoint.pt").resolve())
        still_mapped = any(line.rstrip().endswith(target) for line in open("/proc/self/maps"))
        train(model, opt, 2, seed=2)
        straight = torch.load(out / "straight.pt", weights_only=True)
        exact = all(torch.equal(a, b) for a, b in zip(straight, model.parameters(), strict=True))
        opt.runtime.close()
        print(json.dumps({"growth": growth, "resume_rss": resume_rss,
                          "still_mapped": still_mapped, "exact": exact}))
''')


def run(tmp_path: Path, phase: str) -> dict:
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), phase],
                          capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).parents[3])
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_resume_copies_the_state_out_a_tensor_at_a_time_and_resumes_exactly(tmp_path: Path):
    saved = run(tmp_path, "save")
    assert saved["disk_bytes"] > 0.8 * saved["state_bytes"] > 150 << 20  # the size it is about
    got = run(tmp_path, "load")  # a fresh process: its peak is the load's own
    # Above what stays resident (the 24 MiB device tier), the load's peak holds about one
    # parameter's state (17 MB here) at a time, not a second copy of all of it.
    assert got["growth"] - got["resume_rss"] < saved["state_bytes"] / 4, (saved, got)
    assert not got["still_mapped"], "a restored tensor still views the checkpoint file"
    assert got["exact"]
