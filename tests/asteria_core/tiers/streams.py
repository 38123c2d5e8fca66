"""The script both streaming tests run in a fresh process: imports, a 25M-parameter stack of
linear layers with ~198 MB of SOAP state (most on the disk tier), and its training loop."""

import textwrap

PRELUDE = textwrap.dedent('''
    import gc, json, sys
    from pathlib import Path
    import torch
    from torch import nn
    import asteria_core as asteria
    from asteria_core.train import checkpoint as ckpt

    torch.set_num_threads(1)
    LAYERS, ROWS, COLS = 12, 8192, 256  # 25M parameters; SOAP state ~198 MB

    def kib(field):
        for line in open("/proc/self/status"):
            if line.startswith(field):
                return int(line.split()[1]) * 1024

    def build(run_dir):
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(COLS, ROWS, bias=False) for _ in range(LAYERS)])
        policy = asteria.Policy(offload_mode="disk", device_budget_bytes=24 << 20, workers=0)
        opt = asteria.optimizer(model, "soap", max_precond_dim=COLS, policy=policy,
                                run_dir=run_dir)
        return model, opt

    def train(model, opt, steps, seed):
        g = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            x = torch.randn(2, COLS, generator=g)
            loss = sum(m(x).square().mean() for m in model)
            opt.zero_grad()
            loss.backward()
            opt.step()
        opt.runtime.end_step()
''')
