"""Re-derive a profile's fused-attention rates from the GPU times it already holds, after the
cost model changed what they are taken against. No GPU needed.

    python benchmarks/hardware/rederive_attention.py [--profile P] [-o OUT] [--why TEXT] [--dry-run]

A rate is the GEMM model's compute time for one SDPA call (its attention factor left at 1)
over the call's measured time less the model's time for the kernels it runs beside its main
one, per pass (`gpushape.probe.attention.model_s`, `passes_s`). Each row the
probe measured keeps those measured times (`measured_fwd_s`, `measured_bwd_s`) and the call's
shape (`workload`, "B x H x T x D"): this recomputes the model's side with the current code
and the rates from the stored times, and marks the row "rederived" (when, why, the rates it
had). Rows that other scripts derive from committed runs are theirs to redo:
`attention_from_runs.py --write` (SDPA's default rows from timed H200 steps) and
`benchmarks/kernels/fit_masked_sdpa.py` (the masked rows from probe_masked_sdpa.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))  # this working tree's gpushape, installed or not

from gpushape.hardware.lookup import get_gpu  # noqa: E402
from gpushape.hardware.profile import apply_profile, read_profile  # noqa: E402
from gpushape.probe.attention import AttentionConfig, model_s, passes_s  # noqa: E402
from gpushape.probe.memory import capped  # noqa: E402
from gpushape.probe.profile import write_profile  # noqa: E402

DEFAULT = ROOT / "src" / "gpushape" / "hardware" / "profiles" / "h200-sxm.json"
WHY = (
    "rates taken against the GEMM model's compute time (they scale that side alone), the "
    "kernels beside the main one priced apart (attention_pass)"
)
# rows derived by another script from committed runs (see the docstring)
OTHERS = ("attention_from_runs.py", "probe_masked_sdpa.py")
_KEY = re.compile(r"^(\w+)/(fwd|bwd)((?:/(?:dropout|causal|gqa))*)/d(\d+)(?:@t(\d+))?$")
_SHAPE = re.compile(r"(\d+)x(\d+)x(\d+)x(\d+)")


def config_of(key: str) -> tuple[AttentionConfig, bool]:
    """The configuration and pass (backward?) a rate's key names ("default/bwd/causal/d64")."""
    m = _KEY.match(key)
    if m is None:
        raise ValueError(f"{key!r}: not an attention rate's key")
    backend, stage, flags, head, seq = m.groups()
    named = set(flags.split("/"))
    cfg = AttentionConfig(
        backend,
        int(head),
        dropout=0.1 if "dropout" in named else 0.0,  # the probe's; the model reads only > 0
        causal="causal" in named,
        gqa="gqa" in named,
        seq=int(seq or 0),
    )
    return cfg, stage == "bwd"


def rederive(row: dict[str, Any], spec, why: str = WHY) -> dict[str, Any] | None:
    """`row` with its rates and model times recomputed from its measured times (`row` itself
    where no rate moves), or None where it is not the probe's to redo (another script's, or
    without a call's shape and times)."""
    source = f"{row.get('source', '')} {row.get('workload', '')}"
    shape = _SHAPE.findall(str(row.get("workload", "")))
    if any(o in source for o in OTHERS) or not shape or "measured_fwd_s" not in row:
        return None
    keys = [k for k in row if _KEY.match(k)]
    if not keys:
        return None
    b, h, t, _ = (int(x) for x in shape[-1])
    cfg, _ = config_of(keys[0])
    model_fwd, model_bwd, _, _ = model_s(spec, cfg, (b, h, t), torch.bfloat16)
    beside_fwd, beside_bwd = passes_s(spec, cfg, (b, h, t), torch.bfloat16)
    rates = {
        k: capped(*((model_bwd, row["measured_bwd_s"] - beside_bwd) if config_of(k)[1] else
                    (model_fwd, row["measured_fwd_s"] - beside_fwd)))
        for k in keys
    }  # fmt: skip
    before = {k: row[k] for k in keys}
    if rates == before:
        return row
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    earlier = dict(row["rederived"]) if "rederived" in row else None
    return {
        **row,
        **rates,
        "model_fwd_s": model_fwd,
        "model_bwd_s": model_bwd,
        "passes_bwd_s": beside_bwd,
        "rederived": {
            "at": stamp,
            "from": before,
            "why": why,
            **({"before": [earlier, *earlier.pop("before", [])]} if earlier else {}),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, default=DEFAULT)
    parser.add_argument("-o", "--output", type=Path, default=None, help="default: over --profile")
    parser.add_argument("--why", default=WHY, help="the reason, kept in each row")
    parser.add_argument("--dry-run", action="store_true", help="print the rates, write nothing")
    args = parser.parse_args(argv)
    profile = read_profile(args.profile)
    spec = apply_profile(get_gpu(profile["gpu"]), profile, origin=str(args.profile))
    rows = profile.get("attention") or {}
    for name in list(rows):
        new = rederive(dict(rows[name]), spec, args.why)
        if new is None:
            print(f"{name:<28} left (another script's, or no measured call)")
            continue
        changes = "  ".join(
            f"{k.split('/')[1]} {rows[name][k]:.4f} -> {new[k]:.4f}"
            for k in rows[name]
            if _KEY.match(k)
        )
        print(f"{name:<28} {changes}")
        rows[name] = new
    if not args.dry_run:
        print(f"wrote {write_profile(profile, args.output or args.profile)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
