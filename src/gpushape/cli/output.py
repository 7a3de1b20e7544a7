"""Output files for the subcommands: checked before the work, written whole or not at all.

`write_text(path, text)` writes a regular file atomically: a temporary file beside it is
written, flushed and synced (a full disk fails there, not after "wrote"), then renamed over the
target, so a failed write leaves any old file as it was. A target that exists and is not a
regular file (`/dev/stdout`, a FIFO, `/dev/null`) is written in place. Every failure is a
`GpushapeError` naming the path, which the CLI prints as one line and exit 2.

`to_stdout()` wraps what a subcommand prints: a standard output that cannot be written (a
full disk behind `> file`) is a GpushapeError too; a closed pipe stays a BrokenPipeError.

`check_file(path)` / `check_folder(path)` fail early, before minutes of tracing or measuring,
when the output could not be written: a missing folder, a folder where a file is meant, no
write permission.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..errors import GpushapeError


def write_text(path: str | Path, text: str) -> None:
    """Write `text` (UTF-8) to `path`, whole or not at all; a GpushapeError when it fails."""
    target = Path(path)
    check_file(target)
    try:
        if target.exists() and not target.resolve().is_file():
            _write_in_place(target, text)
        else:
            _write_replacing(target.resolve() if target.exists() else target, text)
    except OSError as exc:
        raise GpushapeError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from exc


@contextlib.contextmanager
def to_stdout() -> Iterator[None]:
    """Run the body, then flush standard output; a write error there is a GpushapeError."""
    try:
        yield
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        if exc.filename is not None:  # not stdout's: some file the body touched
            raise
        raise GpushapeError(f"cannot write to standard output: {exc.strerror or exc}") from exc


def flush_stdout() -> None:
    """Flush standard output; a write error is a GpushapeError (see `to_stdout`)."""
    with to_stdout():
        pass


def check_file(path: str | Path) -> None:
    """A GpushapeError when `path` cannot be a file written here (checked, not written)."""
    target = Path(path)
    if target.is_dir():
        raise GpushapeError(f"cannot write {str(path)!r}: it is a folder; name a file in it")
    if target.exists():
        if not os.access(target, os.W_OK):
            raise GpushapeError(f"cannot write {str(path)!r}: permission denied")
        return
    _check_parent(target, str(path))


def check_folder(path: str | Path) -> None:
    """A GpushapeError when `path` is not a writable folder and cannot be made one (the
    nearest existing folder above it must be writable)."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise GpushapeError(f"cannot write into {str(path)!r}: it is a file, not a folder")
    existing = next(p for p in (folder, *folder.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise GpushapeError(f"cannot write into {str(path)!r}: {str(existing)!r} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise GpushapeError(f"cannot write into {str(path)!r}: permission denied on {existing}")


def _check_parent(target: Path, label: str) -> None:
    parent = target.absolute().parent
    if not parent.exists():
        raise GpushapeError(
            f"cannot write {label!r}: folder {str(parent)!r} does not exist; create it first"
        )
    if not parent.is_dir():
        raise GpushapeError(f"cannot write {label!r}: {str(parent)!r} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise GpushapeError(f"cannot write {label!r}: permission denied on folder {str(parent)!r}")


def _write_in_place(target: Path, text: str) -> None:
    """A device or FIFO: written and flushed (errors such as ENOSPC surface on flush)."""
    with target.open("w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()


def _write_replacing(target: Path, text: str) -> None:
    """A temporary file beside `target`, synced, then renamed over it (in place when only the
    file, not its folder, is writable)."""
    mode = target.stat().st_mode & 0o7777 if target.exists() else _new_file_mode()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except PermissionError:
        if not target.exists():
            raise
        _write_in_place(target, text)  # a writable file in a folder we may not add to
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _new_file_mode() -> int:
    """The mode `open(path, "w")` would give a new file: 0o666 less the umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask
