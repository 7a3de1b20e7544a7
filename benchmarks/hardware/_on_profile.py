"""What the scripts that add one measurement to an existing profile share: their arguments,
the check that the profile is this GPU's, and the stamped write (when, by which command)."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))  # this working tree's gpushape, installed or not

from gpushape.hardware.lookup import current_gpu, get_gpu  # noqa: E402
from gpushape.hardware.profile import read_profile  # noqa: E402
from gpushape.probe.profile import write_profile  # noqa: E402


def profile_parser(doc: str) -> argparse.ArgumentParser:
    """--profile P.json and -o OUT.json (default: over the profile)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--profile", type=Path, required=True)
    parser.add_argument("-o", "--output", type=Path, default=None, help="default: over --profile")
    return parser


def this_gpus_profile(path: Path, script: str) -> dict[str, Any]:
    """The profile at `path`, which must be this GPU's (what the script measures is its);
    else the script stops with one line."""
    profile = read_profile(path)
    here, theirs = current_gpu(), get_gpu(profile["gpu"])
    if here is None or here.name != theirs.name:
        found = "no CUDA GPU" if here is None else here.name
        sys.exit(f"{script}: {path} is {theirs.name}'s profile; here: {found}")
    return profile


def write_stamped(profile: dict[str, Any], output: Path, at_key: str, command_key: str) -> None:
    """Write `profile` to `output` with the time and the command line under "probe"."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    profile.setdefault("probe", {})[at_key] = stamp
    profile["probe"][command_key] = " ".join(sys.argv)
    print(f"wrote {write_profile(profile, output)}")


def measure_into(
    doc: str,
    script: str,
    measure: Any,
    describe: Any,
    place: Any,
    stamp: str,
) -> None:
    """A script that measures one thing on this GPU and adds it to a profile of this chip:
    `measure()` (None: the script stops with one line), printed as `describe(profile, row)`,
    put in by `place(profile, row)` and stamped as `<stamp>_measured_at` / `<stamp>_command`;
    --dry-run prints it and writes nothing."""
    parser = profile_parser(doc)
    parser.add_argument("--dry-run", action="store_true", help="print it, write nothing")
    args = parser.parse_args()
    profile = this_gpus_profile(args.profile, script)
    row = measure()
    if row is None:
        sys.exit(f"{script}: nothing measured (a CUDA GPU, and the profiler's kernels, needed)")
    print(describe(profile, row))
    if args.dry_run:
        return
    place(profile, row)
    write_stamped(profile, args.output or args.profile, f"{stamp}_measured_at", f"{stamp}_command")
