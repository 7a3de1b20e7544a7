"""Assertions shared by the CLI tests: the exit code and the one stderr line."""

from __future__ import annotations

from gpushape.cli.main import main


def fails(capsys, argv: list[str], code: int = 2) -> str:
    """Run the CLI, expecting `code` and exactly one line on stderr: that line."""
    assert main(argv) == code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def errors(capsys, argv: list[str]) -> str:
    """Exit 2 with one `gpushape: error: ...` line: the message after the prefix."""
    line = fails(capsys, argv)
    assert line.startswith("gpushape: error: "), line
    return line.removeprefix("gpushape: error: ")
