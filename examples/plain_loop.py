"""Asteria in a plain PyTorch loop: SOAP, its refresh on a host worker, and the control plane
(dashboard, /metrics for Prometheus) on http://127.0.0.1:8000 (ASTERIA_PORT moves it) while it
trains."""
import os
import sys

import torch

import asteria_core as asteria
import backend
from asteria_core.train.data import BatchLoader, encode, load_corpus, split_tokens
from asteria_core.train.model import GPT, ModelConfig

PORT = int(os.environ.get("ASTERIA_PORT", "8000"))


def main(steps: int = 300, port: int | None = PORT, data_dir: str = "asteria-data") -> list:
    torch.manual_seed(1337)
    train, _ = split_tokens(encode(load_corpus("")), 0.1, 64)  # CPython's own docs, embedded
    loader = BatchLoader(train, block_size=64, batch_size=8, seed=1337)
    model = GPT(ModelConfig(n_layer=2, n_head=2, n_embd=64, block_size=64))
    opt = asteria.optimizer(model, "soap", lr=3e-3, policy=asteria.Policy(staleness_bound=5))
    plane = port is not None and backend.serve(opt.runtime, port=port, data_dir=data_dir)
    if plane:
        print(f"asteria: control plane on {plane.url} (token in {data_dir}/token)", flush=True)
    losses = []
    with opt.runtime:  # closing it joins the refresh workers and completes the last record
        for _ in range(steps):
            if opt.runtime.stop_requested:  # POST /runs/{id}/stop
                break
            with opt.runtime.phase("data"):
                x, y = loader.next_batch()
            _, loss = model(x, y)
            loss.backward()
            opt.step()  # the step boundary runs inside: policy, tiers, refresh swaps
            opt.zero_grad()
            losses.append(loss.item())
    if plane:
        plane.close()
    return losses


if __name__ == "__main__":
    print(f"final loss {main(*map(int, sys.argv[1:2]))[-1]:.4f}")
