"""A plain loop on the installed wheel: 20 steps, their records, /metrics answered (JSON out)."""

import json
import urllib.request

import torch

import asteria_core as asteria

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = asteria.optimizer(model, "soap", lr=1e-2)
records = []
opt.runtime.add_listener(records.append)
port = opt.runtime.telemetry.serve(port=0)
for _ in range(20):
    x = torch.randn(4, 8)
    loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    opt.runtime.log(loss=loss.item())
body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
opt.runtime.close()
print(json.dumps({"records": len(records), "steps": [r.step for r in records][-1],
                  "metrics": [line for line in body.splitlines()
                              if line.startswith("asteria_train_loss")]}))
