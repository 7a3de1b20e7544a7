"""The transposed_copy_nchw family's efficiency on the H100 from per-module kernel times.

An NCHW convolution whose output was permuted to NHWC and normed there (ConvNeXt-T's and
Swin-T's patch embedding) gets its gradient back with channels_last strides, and PyTorch's cuDNN
backward first copies it to the input's layout (`tracing/layout.py` `hidden_copies`): a
transposed copy into NCHW, the family `transposed_copy_nchw` (`tracing/copies.py`). The probe
measures the family (`probe/workloads`: NHWC to NCHW of 64x56x56x96): on the H100, 0.1681 of the
copy rate (2026-12-07, the profile's row since). Before that run, the H100 probe's profile took
the number from the committed per-module profile of those two models there
(correlate-h100/correlate-ops.json), and this script derives it still, as a check (0.1703):
each patch embedding's `aten::copy_` device time (the only copy its module runs: the forward
convolution reads a contiguous image) against the trace's bytes of that copy at the profile's
copy rate. The same run's LayerNorm copies the other way (the stem norm's, NCHW to NHWC) come
out at the probe's transposed_copy figure, which checks the reading. A row written with --write
says where it came from; a probe run replaces it.

    python benchmarks/hardware/transposed_copy_nchw_from_runs.py [--write]   # --write: the profile
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from _family_row import derived_row, family_row_main  # noqa: E402

from gpushape.models import resolve_model  # noqa: E402
from gpushape.probe.memory import capped  # noqa: E402
from gpushape.tracing.copies import COPY_FAMILIES, TRANSPOSED_TO_NCHW, copy_family  # noqa: E402
from gpushape.tracing.layout import hidden_copies  # noqa: E402
from gpushape.tracing.tracer import trace  # noqa: E402

PROFILE = ROOT / "benchmarks/results/probe-h100/h100-sxm.json"
RUN = "correlate-h100/correlate-ops.json"
# each model's patch embedding (its gradient copied into NCHW) and the norm after it (its input,
# the permuted NCHW output, copied to NHWC forward and backward: the check)
MODULES = {
    "timm:convnext_tiny": ("stem.0", "stem.1"),
    "timm:swin_tiny_patch4_window7_224": ("patch_embed.proj", "patch_embed.norm"),
}
COPY = "aten::copy_"


def copy_bytes(ops, module: str, family: str) -> tuple[int, str]:
    """(bytes read and written, shape) of the copies of `family` `module`'s kernels make first,
    as the trace sees them."""
    total, shape = 0, ""
    for rec in ops:
        if rec.module != module:
            continue
        for t, kind in hidden_copies(rec):
            if copy_family(t, kind) == family:
                total += 2 * t.numel * t.itemsize
                shape = "x".join(str(n) for n in t.shape)
    if not total:
        raise SystemExit(f"the trace has no {family} in {module}")
    return total, shape


def row(spec) -> dict:
    data = json.loads((ROOT / "benchmarks/results" / RUN).read_text())
    if "H100" not in data["environment"]["gpu"] or spec.name != "h100-sxm":
        raise SystemExit(f"{RUN}: an H100 run, for the H100 profile")
    bandwidth = spec.attainable_bandwidth_bytes_per_s()
    measured = family_s = norm_measured = norm_s = 0.0
    shapes = []
    for result in data["results"]:
        if result["model"] not in MODULES:
            continue
        conv, norm = MODULES[result["model"]]
        r = resolve_model(result["model"], batch=result["batch"])
        ops = trace(r.model, r.example_inputs, train=True).ops
        measured += result["ops"][conv]["measured_s"][COPY]
        nbytes, shape = copy_bytes(ops, conv, TRANSPOSED_TO_NCHW)
        family_s += nbytes / bandwidth
        shapes.append(f"{result['model'].removeprefix('timm:')} {conv} ({shape})")
        norm_measured += result["ops"][norm]["measured_s"][COPY]
        norm_s += copy_bytes(ops, norm, COPY_FAMILIES["transposed"])[0] / bandwidth
    if len(shapes) != len(MODULES):
        raise SystemExit(f"{RUN}: not every model of {sorted(MODULES)} is in it")
    print(f"the check, the norms' copies into NHWC in the same run: efficiency "
          f"{capped(norm_s, norm_measured):.4f} against the profile's transposed_copy "
          f"{spec.achievable.memory(COPY_FAMILIES['transposed']):.4f}")  # fmt: skip
    return derived_row(
        family_s,
        measured,
        "the patch embedding's gradient copied into NCHW before cuDNN's backward: "
        + ", ".join(shapes),
        f"benchmarks/results/{RUN}, each module's {COPY} device time a step "
        "(transposed_copy_nchw_from_runs.py)",
    )


def main() -> None:
    family_row_main(TRANSPOSED_TO_NCHW, row, __doc__.splitlines()[0], PROFILE)


if __name__ == "__main__":
    main()
