"""The CLI's exit-code contract: 0 done, 1 only for --fail-on, 2 for everything that stops a
command, always one stderr line (a traceback only with --debug, before or after the
subcommand)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gpushape.cli.audit as audit_cli
from gpushape.cli.main import main

from .helpers import errors, fails

NO_ROOT = pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permissions")


# --- devices ---------------------------------------------------------------------------------


def test_cuda_without_cuda_is_one_line(capsys, nets, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("cuda", "cuda:1"):
        err = errors(capsys, ["audit", f"{nets}:tiny", "--device", device])
        assert f"device '{device}' is not available" in err and "meta" in err


def test_bad_device_string_is_one_line(capsys, nets):
    err = errors(capsys, ["audit", f"{nets}:tiny", "--device", "nodevice"])
    assert err.startswith("bad device 'nodevice': not a torch device")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_cuda_without_cuda_in_a_real_process():
    """The observed bug: a 47-line traceback and exit 1."""
    proc = subprocess.run(
        [sys.executable, "-m", "gpushape.cli.main", "audit", "resnet50", "--device", "cuda"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "device 'cuda' is not available" in proc.stderr


# --- what the subcommand did not expect ------------------------------------------------------


def _raising(exc: BaseException):
    def build_report(args):
        raise exc

    return build_report


def test_a_bug_is_one_line_and_exit_2_not_1(capsys, nets, monkeypatch):
    monkeypatch.setattr(audit_cli, "build_report", _raising(TypeError("unhashable thing")))
    line = fails(capsys, ["audit", f"{nets}:tiny"])
    assert line == (
        "gpushape: internal error: TypeError: unhashable thing (run with --debug for the traceback)"
    )


def test_an_os_error_is_one_line(capsys, nets, monkeypatch):
    exc = OSError(errno.EMFILE, "Too many open files", "/some/file")
    monkeypatch.setattr(audit_cli, "build_report", _raising(exc))
    assert errors(capsys, ["audit", f"{nets}:tiny"]) == "Too many open files (/some/file)"


def test_sys_exit_inside_a_command_is_one_line(capsys, nets, monkeypatch):
    monkeypatch.setattr(audit_cli, "build_report", _raising(SystemExit(1)))
    assert "called sys.exit(1)" in errors(capsys, ["audit", f"{nets}:tiny"])


def test_a_closed_pipe_under_rich_is_141_not_1(capsys, nets, monkeypatch):
    """rich's Console answers a BrokenPipeError with SystemExit(1): not a --fail-on result."""

    def build_report(args):
        try:
            raise BrokenPipeError(32, "Broken pipe")
        except BrokenPipeError:
            raise SystemExit(1) from None

    monkeypatch.setattr(audit_cli, "build_report", build_report)
    assert main(["audit", f"{nets}:tiny"]) == 141
    assert capsys.readouterr().err == ""


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("argv", [["gpus"], ["gpus", "--json"], ["audit", "nets.py:tiny"]])
def test_a_full_standard_output_is_one_line(nets, argv):
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "gpushape.cli.main", *argv],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            cwd=Path(nets).parent,
        )
    assert proc.returncode == 2
    assert (
        proc.stderr == "gpushape: error: cannot write to standard output: No space left on device\n"
    )


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_before_or_after_the_subcommand(capsys, nets, where):
    argv = ["audit", f"{nets}:broken"]
    assert main(["--debug", *argv] if where == "before" else [*argv, "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValueError: no width given" in err
    assert err.strip().splitlines()[-1].startswith("gpushape: error: factory ")


def test_usage_errors_are_one_line(capsys):
    for argv in (["audit"], ["audit", "resnet50", "--dtype", "int3"], ["nosuch"], []):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("gpushape: error: ") and "--help" in err


# --- user factories --------------------------------------------------------------------------


def test_factory_calling_sys_exit(capsys, nets):
    err = errors(capsys, ["audit", f"{nets}:exits"])
    assert err == f"model factory '{nets}:exits' called sys.exit(3)"


def test_file_calling_sys_exit_on_import(capsys, tmp_path):
    path = tmp_path / "quits.py"
    path.write_text("import sys\nsys.exit('no GPU here')\n")
    err = errors(capsys, ["audit", f"{path}:make"])
    assert err == f"importing {path} called sys.exit('no GPU here')"


def test_factory_raising_names_factory_and_exception(capsys, nets):
    err = errors(capsys, ["audit", f"{nets}:broken"])
    assert err == f"factory {nets}:broken raised ValueError: no width given"


# --- output files ----------------------------------------------------------------------------


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("fmt", ["table", "json", "md"])
def test_full_disk_is_one_line_and_never_wrote(capsys, nets, fmt):
    err = errors(capsys, ["audit", f"{nets}:tiny", "--format", fmt, "-o", "/dev/full"])
    assert err == "cannot write '/dev/full': No space left on device"


def test_missing_folder(capsys, nets, tmp_path):
    out = tmp_path / "none" / "r.json"
    err = errors(capsys, ["audit", f"{nets}:tiny", "-o", str(out)])
    assert err == f"cannot write '{out}': folder '{out.parent}' does not exist; create it first"


def test_folder_given_as_the_file(capsys, nets, tmp_path):
    err = errors(capsys, ["audit", f"{nets}:tiny", "-o", str(tmp_path)])
    assert "it is a folder" in err


@NO_ROOT
def test_unwritable_folder(capsys, nets, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    err = errors(capsys, ["audit", f"{nets}:tiny", "-o", str(locked / "r.md")])
    assert "permission denied" in err


def test_folder_without_write_permission(capsys, nets, tmp_path, monkeypatch):
    """The same check where the tests run as root: os.access says no."""
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path)
    err = errors(capsys, ["audit", f"{nets}:tiny", "-o", str(tmp_path / "r.md")])
    assert err == f"cannot write '{tmp_path / 'r.md'}': permission denied on folder '{tmp_path}'"


def test_failed_write_keeps_the_old_file(capsys, nets, tmp_path, monkeypatch):
    """The report goes to a temporary file first: a write that fails (here at fsync, as a full
    disk may) leaves the old report, no temporary file, and no 'wrote' line."""
    out = tmp_path / "r.json"
    out.write_text("old report")

    def no_space(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", no_space)
    err = errors(capsys, ["audit", f"{nets}:tiny", "-o", str(out)])
    assert err == f"cannot write '{out}': No space left on device"
    assert out.read_text() == "old report" and os.listdir(tmp_path) == ["nets.py", "r.json"]


def test_a_written_file_keeps_its_mode(capsys, nets, tmp_path):
    out = tmp_path / "r.md"
    out.write_text("old")
    out.chmod(0o640)
    assert main(["audit", f"{nets}:tiny", "-o", str(out)]) == 0
    assert out.stat().st_mode & 0o777 == 0o640 and out.read_text().startswith("# gpushape")
    assert capsys.readouterr().err.strip() == f"gpushape: wrote {out}"


# --- contradicting options -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--batch", "4", "--input", "8x3x8x8"], "--batch does not apply with --input"),
        (["--profile", "p.json", "--no-profile"], "--profile and --no-profile contradict"),
        (["--format", "json", "--top", "5"], "--top does not apply to JSON"),
        (["-o", "r.json", "--top", "5"], "--top does not apply to JSON"),
        (["--format", "json", "-o", "r.html"], "--format json contradicts -o 'r.html'"),
        (["--format", "md", "-o", "r.HTM"], "--format md contradicts -o 'r.HTM'"),
        (["--top", "0"], "--top must be at least 1"),
        (["--fail-on", "info"], "info findings never fail a run"),
    ],
)
def test_contradicting_options(capsys, nets, extra, says):
    assert says in errors(capsys, ["audit", f"{nets}:tiny", *extra])


# --- probe -----------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_probe_without_cuda(capsys):
    assert "needs a CUDA device" in errors(capsys, ["probe", "--quick"])


def test_probe_checks_its_outputs_before_measuring(capsys, tmp_path):
    a_file = tmp_path / "f"
    a_file.write_text("")
    # a missing folder is made (the probe's profile usually goes to a new results folder),
    # one under a file cannot be
    assert "is a file" in errors(capsys, ["probe", "-o", str(a_file / "none" / "p.json")])
    assert "it is a folder" in errors(capsys, ["probe", "-o", str(tmp_path)])
    err = errors(capsys, ["probe", "--report-dir", str(a_file)])
    assert "it is a file, not a folder" in err
