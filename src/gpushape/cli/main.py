"""`gpushape` command line: one module per subcommand, each with `register(subparsers)` and
`run(args)`.

Exit codes, the contract scripts and CI rely on:
- 0: done.
- 1: only `audit --fail-on`: a finding reached the severity (each one named on stderr).
- 2: bad usage, bad input or a missing environment (no CUDA, an unwritable output file), and
  anything else that stopped the command: always ONE line on stderr, `gpushape: error: ...`.
  That covers argparse's own errors, every `GpushapeError`, an OSError (its message and file),
  and a `sys.exit()` from code gpushape ran for the user. An exception gpushape did not expect,
  a bug or an input it does not handle, is one line too, `gpushape: internal error: ... (run
  with --debug for the traceback)`, and exit 2: never 1, which a CI gate would read as
  "findings", and never a traceback the user did not ask for.
- 130: interrupted (Ctrl-C); 141: standard output closed early (`gpushape audit ... | head`).

`--debug`, before or after the subcommand, prints the traceback above that line (exit codes
unchanged).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from ..errors import GpushapeError
from . import audit, bench, gpus, optimize, probe
from .output import flush_stdout

COMMANDS = [gpus, probe, audit, optimize, bench]
DEBUG_HELP = "show tracebacks on errors"


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's one-line errors."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"gpushape: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="gpushape",
        description="Make PyTorch networks fit the GPU they run on.",
    )
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.register(sub)
    for subparser in sub.choices.values():  # `gpushape audit ... --debug` too; SUPPRESS keeps
        subparser.add_argument(  # a --debug given before the subcommand
            "--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = int(args.func(args) or 0)
        flush_stdout()  # what is still buffered: a full or closed stdout fails in here
        return code
    except KeyboardInterrupt:
        print("gpushape: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _silence_stdout()
        return 141
    except (Exception, SystemExit) as exc:
        if isinstance(exc, SystemExit) and isinstance(exc.__context__, BrokenPipeError):
            return 141  # rich's Console exits 1 on a closed pipe; 1 would read as findings
        if args.debug:
            traceback.print_exc()  # then the one line, and still exit 2: 1 means findings
        print(error_line(exc, args.command), file=sys.stderr)
        return 2


def error_line(exc: BaseException, command: str) -> str:
    """The one stderr line for an exception that stopped `command`."""
    if isinstance(exc, GpushapeError):
        return f"gpushape: error: {_flat(exc)}"
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        return f"gpushape: error: {exc.strerror or _flat(exc)}{where}"
    if isinstance(exc, SystemExit):
        return (
            f"gpushape: error: code run by `gpushape {command}` (the model's?) called "
            f"sys.exit({exc.code!r}); gpushape stopped"
        )
    return (
        f"gpushape: internal error: {type(exc).__name__}: {_flat(exc)} "
        f"(run with --debug for the traceback)"
    )


def _flat(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _silence_stdout() -> None:
    """Point stdout at /dev/null so Python's exit flush does not fail on the closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass  # a stdout without a descriptor (tests capture it): nothing to flush at exit
    finally:
        os.close(devnull)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
