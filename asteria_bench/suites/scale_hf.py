"""The scale suite's Hugging Face row: a real `GPT2LMHeadModel` at GPT-2
small's size trains through `asteria_core.integrations.hf`, as a user drops it in.

Full: GPT-2 small from a `GPT2Config` (12 layers, 768 wide, 12 heads, 1024 positions, the
50257-token vocabulary: 124M parameters; nothing is downloaded), `STEPS` steps of 2 x 128 tokens
of the default corpus (its UTF-8 bytes as token ids), Asteria-SOAP at the block size
recommended for large models (1024) with one host worker thread, d = S = 10, inside HF's
`Trainer` with `hf.attach`. Quick: the same path with a tiny GPT2Config. The row holds the step
time (p50, mean, p99 over the steps after the first interval, whose first refresh is an eigh of
every block), the refreshes, staleness reached against S, refresh_wait per step, the
optimizer-state bytes by kind, the records (one per optimizer step, in the listener and the
JSONL file), Asteria's figures in HF's logs, and the run's Prometheus /metrics scraped over
HTTP while it trains. Arrangement: shared cores (training with torch's threads, the worker
wherever the OS puts it).
"""

from __future__ import annotations

import os
import statistics
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a model from a config: no hub at all
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from asteria_bench.clocks import peak_rss_bytes, reset_peak_rss  # noqa: E402
from asteria_bench.options import BenchOptions  # noqa: E402
from asteria_bench.results import percentile  # noqa: E402
from asteria_core.telemetry.state_bytes import state_bytes  # noqa: E402

INTERVAL = 10
BOUND = 10  # S = d
BLOCK_SIZE = 1024  # the block size recommended for large models (precond_block_size's default)


@dataclass(frozen=True)
class HFShape:
    n_layer: int
    n_embd: int
    n_head: int
    vocab_size: int
    n_positions: int
    seq: int
    batch: int
    steps: int


FULL = HFShape(12, 768, 12, 50257, 1024, 128, 2, 30)  # GPT-2 small: 124M parameters
QUICK = HFShape(2, 64, 2, 256, 64, 32, 4, 2 * INTERVAL)


class ByteWindows(torch.utils.data.Dataset):
    """Consecutive windows of the corpus's bytes; GPT-2 shifts the labels itself."""

    def __init__(self, data: torch.Tensor, block: int) -> None:
        self.data, self.block = data, block

    def __len__(self) -> int:
        return len(self.data) // self.block

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        window = self.data[i * self.block:(i + 1) * self.block]
        return {"input_ids": window, "labels": window}


def hf_row(opts: BenchOptions) -> dict[str, Any]:
    """The row: GPT2LMHeadModel at GPT-2 small's size (quick: a tiny one) through the HF
    integration with Asteria-SOAP."""
    return train_hf(opts.pick(QUICK, FULL), opts.out_dir / ".scale-hf", device=opts.device,
                    progress=opts.progress)


def build_model(shape: HFShape):
    import transformers

    torch.manual_seed(1337)
    config = transformers.GPT2Config(
        n_layer=shape.n_layer, n_embd=shape.n_embd, n_head=shape.n_head,
        vocab_size=shape.vocab_size, n_positions=shape.n_positions, bos_token_id=0,
        eos_token_id=0, loss_type="ForCausalLM")
    model = transformers.GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # where every transformers version looks (the example's)
    return model


def scraper(url: str, steps: int):
    """A TrainerCallback that scrapes the run's /metrics over HTTP at the last step's end,
    while the runtime still serves it (it stops serving when training ends); `.text`."""
    import transformers

    class ScrapeAtLastStep(transformers.TrainerCallback):
        text = ""

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == steps:
                with urllib.request.urlopen(url, timeout=30) as response:
                    self.text = response.read().decode()

    return ScrapeAtLastStep()


def train_hf(shape: HFShape, out_dir: Path, *, device: str = "cpu",
             progress: bool = False) -> dict[str, Any]:
    import transformers

    import asteria_core as asteria
    from asteria_core.integrations import hf
    from asteria_core.train.data import embedded_corpus, encode

    out_dir.mkdir(parents=True, exist_ok=True)
    reset_peak_rss()
    model = build_model(shape)
    data = encode(embedded_corpus())
    args = transformers.TrainingArguments(
        output_dir=str(out_dir), max_steps=shape.steps, per_device_train_batch_size=shape.batch,
        logging_steps=INTERVAL, save_strategy="no", eval_strategy="no", report_to=[],
        disable_tqdm=not progress, seed=1337, dataloader_pin_memory=device == "cuda")
    policy = asteria.Policy(workers=1, refresh_interval=INTERVAL, staleness_bound=BOUND)
    jsonl = out_dir / "records.jsonl"
    jsonl.unlink(missing_ok=True)
    opt, scheduler = hf.optimizers(
        model, "soap", lr=3e-3, policy=policy, num_training_steps=shape.steps, device=device,
        run_dir=out_dir, records=jsonl, block_size=BLOCK_SIZE)
    runtime, engine = opt.runtime, opt.runtime.refresh
    records: list = []
    runtime.add_listener(records.append)
    port = runtime.telemetry.serve("127.0.0.1", 0)
    scrape = scraper(f"http://127.0.0.1:{port}/metrics", shape.steps)
    trainer = transformers.Trainer(model=model, args=args,
                                   train_dataset=ByteWindows(data, shape.seq),
                                   optimizers=(opt, scheduler))
    hf.attach(trainer)
    trainer.add_callback(scrape)
    if not progress:
        trainer.remove_callback(transformers.PrinterCallback)  # HF's log lines on stdout
    trainer.train()  # the callback closes the runtime at the end: the last record completes
    peak = peak_rss_bytes()
    kinds = state_bytes(opt)
    return _figures(shape, model, records, jsonl, engine, kinds, scrape.text,
                    trainer.state.log_history, peak)


def _figures(shape: HFShape, model, records: list, jsonl: Path, engine, kinds: dict[str, int],
             metrics: str, log_history: list[dict], peak: int | None) -> dict[str, Any]:
    steady = [r.step_seconds for r in records[INTERVAL:]] or [r.step_seconds for r in records]
    ranked = sorted(steady)
    waits = sum((r.timing.idle_seconds.get("refresh_wait", 0.0) if r.timing else 0.0)
                for r in records)
    steps_total = _metric(metrics, "asteria_steps_total")
    logged = [log for log in log_history if "loss" in log]
    round_s = engine.work_seconds / engine.refreshes * len(engine.blocks) \
        if engine.refreshes else None
    interval_s = INTERVAL * statistics.fmean(steady)
    return {
        "model": "GPT2LMHeadModel", "shape": asdict(shape),
        "params": sum(p.numel() for p in model.parameters()),
        "tokens_per_step": shape.batch * shape.seq, "steps": len(records),
        "arrangement": "shared", "optimizer": "Asteria-SOAP (HF Trainer, 1 worker thread)",
        "block_size": BLOCK_SIZE, "warmup_steps": len(records) - len(steady),
        "p50_ms": 1e3 * percentile(ranked, 0.5), "mean_ms": 1e3 * statistics.fmean(steady),
        "p99_ms": 1e3 * percentile(ranked, 0.99), "max_ms": 1e3 * ranked[-1],
        "step_ms": [1e3 * r.step_seconds for r in records],
        "loss": [r.loss for r in records],
        "blocks": len(engine.blocks), "refreshes": engine.refreshes,
        "refresh_failures": engine.failures, "round_work_s": round_s,
        "interval_train_s": interval_s,
        "refresh_duty": None if round_s is None else round_s / interval_s,
        "staleness_max": max((r.refresh.staleness_max for r in records if r.refresh), default=0),
        "staleness_bound": BOUND,
        "refresh_wait_ms_per_step": 1e3 * waits / max(len(records), 1),
        "state_bytes": kinds, "state_bytes_total": sum(kinds.values()),
        "peak_rss_bytes": peak,
        "records": len(records),
        "records_jsonl": sum(1 for _ in jsonl.open()) if jsonl.exists() else 0,
        "metrics_exported": steps_total is not None and steps_total >= len(records) - 1,
        "metrics_steps_total": steps_total,
        "hf_logs_with_asteria_figures": sum(1 for log in logged
                                           if "asteria/staleness_max" in log),
        "hf_logs": len(logged),
    }


def _metric(text: str, name: str) -> float | None:
    """A sample's value from a Prometheus text exposition (the first unlabelled one)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None
