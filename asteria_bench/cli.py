"""`asteria bench SUITE... [--quick]`: run suites, then render the report from their JSON.

    asteria bench all --quick              # every suite, small sizes, into ./asteria-bench-results
    asteria bench optimizers --corpus my.txt
    asteria bench critical-path staleness --out /tmp/bench
    asteria bench all --publish            # into the checkout's docs/benchmarks, docs/benchmarks.md
                                           # and the README's performance section
    asteria bench --publish --report-only  # render the published pages again from their JSON
    asteria bench optimizers --publish --resume   # continue a run cut short, keeping its runs

By default the results (each suite's JSON, its plots and report.md) go to a folder of the
user's; only --publish writes the project's published pages.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from asteria_bench import report
from asteria_bench.options import BenchOptions
from asteria_bench.resume import ResumeError
from asteria_bench.suites import SUITES, load

DEFAULT_OUT = Path("asteria-bench-results")
CHECKOUT = Path(__file__).resolve().parents[1]
PUBLISHED = {"out": CHECKOUT / "docs" / "benchmarks", "report": CHECKOUT / "docs" / "benchmarks.md",
             "readme": CHECKOUT / "README.md"}
MIN_SEEDS, MAX_SEEDS = 1, 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("suites", nargs="*", metavar="SUITE",
                        help=f"any of: {', '.join(SUITES)}, or all")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes: every suite within 10 minutes on 2 CPU cores")
    parser.add_argument("--corpus", metavar="PATH",
                        help="a text file to train on beside the default corpus (optimizers)")
    parser.add_argument("--out", metavar="DIR",
                        help=f"where each suite's JSON and plots go (default ./{DEFAULT_OUT}; "
                             "docs/benchmarks of the checkout with --publish)")
    parser.add_argument("--publish", action="store_true",
                        help="write the project's published results: the checkout's "
                             "docs/benchmarks, docs/benchmarks.md and README.md")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: the ~100M-parameter model on one CUDA device")
    parser.add_argument("--no-peers", action="store_true",
                        help="leave out the peers' optimizers even where they are installed")
    parser.add_argument("--report", metavar="FILE",
                        help="the Markdown report rendered from --out's JSON (default "
                             "OUT/report.md; docs/benchmarks.md with --publish)")
    parser.add_argument("--readme", metavar="FILE",
                        help="a README whose performance section is rendered (none by default; "
                             "the checkout's README.md with --publish)")
    parser.add_argument("--report-only", action="store_true",
                        help="run nothing; render the report (and README) from --out's JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--seeds", type=int, metavar="N",
                        help=f"seeds per configuration in the suites that run seeds "
                             f"(distributed: 3 unless set), {MIN_SEEDS} to {MAX_SEEDS}")
    parser.add_argument("--rung", choices=("default", "large"), default="default",
                        help="the model size of the optimizers suite: default (about 1M "
                             "parameters) | large (4x the parameters, 4x the tokens)")
    parser.add_argument("--resume", action="store_true",
                        help="continue a run cut short (optimizers): keep the runs its JSON in "
                             "--out holds, where the code it measures, the machine and the sizes "
                             "are the same, and train the rest")


def _peers_installed() -> bool:
    try:
        from asteria_bench import peers
    except ImportError:
        return False
    return bool(peers.available_peers("soap"))


def chosen_suites(names: list[str]) -> list[str]:
    if "all" in names:
        return list(SUITES)
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        raise ValueError(f"SUITE: got {', '.join(map(repr, unknown))}; allowed: "
                         f"{', '.join(SUITES)}, all")
    return list(dict.fromkeys(names))


def destinations(args: argparse.Namespace) -> tuple[Path, Path, Path | None]:
    """Where the JSON, the report and the README go: the user's folder, or with --publish the
    checkout's published pages (an explicit --out, --report or --readme wins either way)."""
    base = PUBLISHED if args.publish else {"out": DEFAULT_OUT, "report": None, "readme": None}
    out_dir = Path(args.out) if args.out else base["out"]
    report_path = Path(args.report) if args.report else base["report"] or out_dir / "report.md"
    readme = args.readme or base["readme"]
    return out_dir, report_path, Path(readme) if readme else None


def run(args: argparse.Namespace) -> int:
    try:
        names = chosen_suites(args.suites)
    except ValueError as err:
        print(f"asteria bench: {err}", file=sys.stderr)
        return 2
    if not names and not args.report_only:
        print("asteria bench: name a SUITE (or all), or --report-only", file=sys.stderr)
        return 2
    if args.seeds is not None and not MIN_SEEDS <= args.seeds <= MAX_SEEDS:
        print(f"asteria bench: --seeds: got {args.seeds}; allowed: {MIN_SEEDS} to {MAX_SEEDS}",
              file=sys.stderr)
        return 2
    if args.resume:
        resumable = [n for n in SUITES if getattr(load(n), "RESUMABLE", False)]
        cannot = [n for n in names if n not in resumable]
        if cannot:
            print(f"asteria bench: --resume: got {', '.join(cannot)}; allowed: "
                  f"{', '.join(resumable)}", file=sys.stderr)
            return 2
    if args.corpus and not Path(args.corpus).is_file():
        print(f"asteria bench: --corpus: {args.corpus!r} is not a file", file=sys.stderr)
        return 2
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("asteria bench: --device cuda: no CUDA device is available", file=sys.stderr)
            return 2
    out_dir, report_path, readme_path = destinations(args)
    peers = not args.no_peers and _peers_installed()
    if not args.no_peers and not peers and not args.report_only:
        print("asteria bench: the peers are not installed (pip install -e \".[bench]\"); "
              "running without them", file=sys.stderr)
    command = "asteria bench " + shlex.join(sys.argv[2:] if sys.argv[1:2] == ["bench"]
                                            else args.suites)
    opts = BenchOptions(quick=args.quick, out_dir=out_dir, corpus=args.corpus,
                        device=args.device, peers=peers, command=command,
                        progress=not args.no_progress, seeds=args.seeds, rung=args.rung,
                        resume=args.resume)
    t0 = time.perf_counter()
    for i, name in enumerate([] if args.report_only else names, 1):
        print(f"[{i}/{len(names)}] {name}: {load(name).TITLE}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        suite = load(name)
        try:
            result = suite.run(opts)
        except ResumeError as err:
            print(f"asteria bench: {err}", file=sys.stderr)
            return 2
        result.description = result.description or suite.__doc__ or ""
        result.complete = True
        result.save(out_dir)
        print(f"[{i}/{len(names)}] {name}: done in {time.perf_counter() - start:.0f} s -> "
              f"{out_dir / (result.suite + '.json')}", file=sys.stderr, flush=True)
    if names and not args.report_only:
        print(f"asteria bench: {len(names)} suite(s) in {time.perf_counter() - t0:.0f} s",
              file=sys.stderr)
    written = report.write(out_dir, report_path, readme_path)
    for path in written:
        print(f"asteria bench: wrote {path}", file=sys.stderr)
    return 0
