"""`gpushape` command line: one module per subcommand, each with `register(subparsers)`.

Exit codes: 0 done, 1 findings above --fail-on, 2 bad usage or bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..errors import GpushapeError
from . import audit, gpus, probe

COMMANDS = [gpus, probe, audit]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpushape",
        description="Make PyTorch networks fit the GPU they run on.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except GpushapeError as exc:
        if args.debug:
            raise
        print(f"gpushape: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gpushape: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
