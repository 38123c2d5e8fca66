"""`python -m asteria_bench ...`: the same as `asteria bench ...`, without the control plane's
packages loaded (a GPU box that has torch but not the web stack runs the training suites)."""

from __future__ import annotations

import argparse
import sys

from asteria_bench.cli import __doc__ as usage
from asteria_bench.cli import add_arguments, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asteria_bench", description=usage,
                                     allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
