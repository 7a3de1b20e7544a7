"""Do the audit's estimated savings hold on this GPU? Each rule's textbook case, as is and
fixed, timed side by side against the saving the audit predicts for it.

    python benchmarks/audit/validate_savings.py [--quick] [--cases tc-align,nchw-conv]
    python benchmarks/audit/validate_savings.py --model hf:bert [--mode compile]

For each case:
1. correctness first: the fixed variant computes what the original does (outputs compared, in
   eval mode where dropout would differ; a padded layer's extra columns sliced away);
2. the audit runs on the original (meta trace, this GPU's catalog spec calibrated by its
   shipped profile when there is one) and gives est_saving_s for the rule;
3. the original and the fixed variant are timed alternately (gpushape.bench.compare, CUDA
   events, medians), one training step each: forward, then torch.autograd.grad of the output
   (a fixed random gradient) with respect to every parameter and input that needs one;
4. measured saving = median(original) - median(fixed); on CUDA also with both steps replayed
   from CUDA graphs ("graph": GPU time alone, which is what the cost model prices; the eager
   figure adds the host's Python, launch and autograd cost, which decides single-op steps).
Writes $OUT/validate_savings.json (default ./out) and prints the table last: predicted and
measured saving in ms and as a share of the original step, and their ratio.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))  # this working tree's gpushape, installed or not

from gpushape.auditing import audit  # noqa: E402
from gpushape.auditing.context import BackendFlags  # noqa: E402
from gpushape.auditing.target import resolve_target  # noqa: E402
from gpushape.bench import compare, cuda_graph, write_results  # noqa: E402
from gpushape.hardware import current_gpu  # noqa: E402
from gpushape.models import create_model  # noqa: E402

BF16 = torch.bfloat16


@dataclass
class Variant:
    model: nn.Module
    inputs: tuple[torch.Tensor, ...]
    check: Callable[[torch.Tensor], torch.Tensor] = lambda y: y  # maps output to compare


@dataclass
class Case:
    rule: str
    build: Callable[[str, int], tuple[Variant, Variant]]  # (device, scale) -> (as is, fixed)
    flags: BackendFlags | None = None
    atol: float = 3e-2  # outputs compared relative to the original's largest magnitude
    cuda_only: bool = False
    check_train: bool = False  # compare in train mode (BatchNorm's batch statistics)
    label: str = ""  # a second case of one rule: "rule (what)"

    @property
    def name(self) -> str:
        return f"{self.rule} ({self.label})" if self.label else self.rule


def _div(n: int, scale: int) -> int:
    return max(1, n // scale)


def _x(*shape, device, dtype=BF16, grad=True, channels_last=False):
    t = torch.randn(*shape, device=device, dtype=dtype)
    if channels_last:
        t = t.to(memory_format=torch.channels_last)
    return t.requires_grad_(grad)


def head(device, s):  # tc-align: BERT's vocabulary 30522 against 30528
    k, n, m = 768, 30522, _div(4096, s)
    a = nn.Linear(k, n).to(device, BF16)
    b = nn.Linear(k, n + 6).to(device, BF16)
    with torch.no_grad():
        b.weight.zero_(), b.bias.zero_()
        b.weight[:n].copy_(a.weight), b.bias[:n].copy_(a.bias)
    x = _x(m, k, device=device)
    return Variant(a, (x,)), Variant(b, (x,), lambda y: y[:, :n])


class Projections(nn.Module):
    def __init__(self, width: int, fused: bool) -> None:
        super().__init__()
        self.fused = fused
        self.qkv = nn.Linear(width, 3 * width) if fused else None
        self.query, self.key, self.value = (nn.Linear(width, width) for _ in range(3))

    def forward(self, x):
        if self.fused:
            return self.qkv(x)
        return torch.cat([self.query(x), self.key(x), self.value(x)], dim=-1)


def qkv(device, s):  # separate-qkv, one BERT-base layer's projections
    a = Projections(768, fused=False).to(device, BF16)
    b = Projections(768, fused=True).to(device, BF16)
    with torch.no_grad():
        b.qkv.weight.copy_(torch.cat([a.query.weight, a.key.weight, a.value.weight]))
        b.qkv.bias.copy_(torch.cat([a.query.bias, a.key.bias, a.value.bias]))
    x = _x(_div(8, s), _div(512, s), 768, device=device)
    return Variant(a, (x,)), Variant(b, (x,))


def bert(device, s):  # manual-attention (and unfused-softmax-dropout) in BERT-base
    a, (ids,) = create_model(
        "bert-base", batch=_div(8, s), seq_len=_div(512, s), attention="manual", device=device
    )
    b, _ = create_model("bert-base", batch=_div(8, s), seq_len=_div(512, s), device=device)
    b.load_state_dict(a.state_dict())
    return Variant(a, (ids,)), Variant(b, (ids,))


class SoftmaxThen(nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return self.drop(torch.softmax(x, dim=-1))


def softmax_dropout(device, s):
    from gpushape.kernels import SoftmaxDropout

    x = _x(_div(32, s), 12, _div(512, s), _div(512, s), device=device)
    return Variant(SoftmaxThen(0.1), (x,)), Variant(SoftmaxDropout(0.1), (x,))


class NormGELU(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.norm(x))


def norm_act(device, s):
    from gpushape.kernels import LayerNormGELU

    a = NormGELU(4096).to(device, BF16)
    b = LayerNormGELU(4096).to(device, BF16)
    b.load_state_dict(a.norm.state_dict())
    x = _x(_div(16384, s), 4096, device=device)
    return Variant(a, (x,)), Variant(b, (x,))


class BatchNormAddReLU(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x, residual):
        return F.relu(self.bn(x) + residual)


def batch_norm_act(device, s):  # unfused-norm-act on ResNet-50's 56x56 stage
    from gpushape.kernels import BatchNormAct2d

    a = BatchNormAddReLU(256).to(device, BF16)
    b = BatchNormAct2d.from_batchnorm(copy.deepcopy(a.bn))
    x, r = (_x(_div(64, s), 256, 56, 56, device=device, channels_last=True) for _ in range(2))
    return Variant(a, (x, r)), Variant(b, (x, r))


def resnet(device, s):  # nchw-conv
    a, (x,) = create_model("resnet50", batch=_div(64, s), device=device)
    b, _ = create_model("resnet50", batch=_div(64, s), device=device)
    b.load_state_dict(a.state_dict())
    b = b.to(memory_format=torch.channels_last)
    return Variant(a, (x,)), Variant(b, (x.to(memory_format=torch.channels_last),))


class ConvBN(nn.Module):
    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(64, 64, 3, padding=1, bias=bias)
        self.bn = nn.BatchNorm2d(64)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


def conv_bias(device, s):  # conv-bias-before-bn: BatchNorm cancels the bias exactly
    a = ConvBN(bias=True).to(device, BF16).to(memory_format=torch.channels_last)
    b = ConvBN(bias=False).to(device, BF16).to(memory_format=torch.channels_last)
    with torch.no_grad():
        b.conv.weight.copy_(a.conv.weight)
    x = _x(_div(64, s), 64, 56, 56, device=device, channels_last=True)
    return Variant(a, (x,)), Variant(b, (x,))


class Autocast(nn.Module):
    def __init__(self, inner: nn.Module, device: str) -> None:
        super().__init__()
        self.inner, self.device = inner, device

    def forward(self, x):
        with torch.autocast(self.device, dtype=BF16):
            return self.inner(x)


def fp32(device, s):  # fp32-math: fp32 without TF32 against autocast bf16
    a = nn.Linear(4096, 4096).to(device)
    x = _x(_div(8192, s), 4096, device=device, dtype=torch.float32)
    return Variant(a, (x,)), Variant(Autocast(a, device), (x,), lambda y: y.float())


class ManyTiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(40))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def tiny(device, s):  # launch-bound: eager against a CUDA graph of forward and backward
    a = ManyTiny().to(device, BF16)
    x = _x(16, 64, device=device)
    b = torch.cuda.make_graphed_callables(copy.deepcopy(a), (x,))  # replaces its forward
    return Variant(a, (x,)), Variant(b, (x,))


CASES = {
    c.name: c
    for c in (
        Case("tc-align", head),
        Case("separate-qkv", qkv),
        Case("manual-attention", bert),
        Case("unfused-softmax-dropout", softmax_dropout),
        Case("unfused-norm-act", norm_act),
        Case("unfused-norm-act", batch_norm_act, check_train=True, label="BN"),
        Case("nchw-conv", resnet),
        Case("conv-bias-before-bn", conv_bias, check_train=True),
        Case("fp32-math", fp32, BackendFlags(matmul_tf32=False, cudnn_tf32=False), atol=0.1),
        Case("launch-bound", tiny, cuda_only=True, check_train=True),
    )
}


def check(case: Case, a: Variant, b: Variant) -> float:
    """Largest difference between the two outputs, relative to the original's largest value."""
    for v in (a, b):
        v.model.train(case.check_train)
    with torch.no_grad():
        ya, yb = a.check(a.model(*a.inputs)).float(), b.check(b.model(*b.inputs)).float()
    for v in (a, b):
        v.model.train(True)
    err = ((ya - yb).abs().max() / ya.abs().max().clamp_min(1e-6)).item()
    if not err <= case.atol:
        raise AssertionError(f"{case.name}: the fixed variant differs by {err:.3g} (relative)")
    return err


def step(v: Variant, grad_out: torch.Tensor) -> Callable[[], None]:
    """One training step: forward, then gradients of every parameter and input needing one."""
    leaves = [p for p in v.model.parameters() if p.requires_grad]
    leaves += [t for t in v.inputs if t.requires_grad]

    def run() -> None:
        out = v.model(*v.inputs)
        torch.autograd.grad(out, leaves, grad_out, allow_unused=True)

    return run


def predicted(case: Case, a: Variant, target) -> tuple[float | None, float]:
    flags = case.flags or BackendFlags.current()
    inputs = tuple(
        torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta").requires_grad_(
            t.requires_grad
        )
        for t in a.inputs
    )  # keep requires_grad
    report = audit(a.model, inputs, target, dtype=None, train=True, flags=flags, rules=[case.rule])
    savings = [f.est_saving_s for f in report.findings if f.est_saving_s is not None]
    return (sum(savings) if savings else None), report.totals.roofline_time_s


def set_flags(flags: BackendFlags | None) -> tuple[bool, bool]:
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    if flags is not None:
        torch.backends.cuda.matmul.allow_tf32 = flags.matmul_tf32
        torch.backends.cudnn.allow_tf32 = flags.cudnn_tf32
    return old


def run_case(case: Case, args, target) -> dict:
    a, b = case.build(args.device, args.scale)
    err = check(case, a, b)
    saving_s, step_s = predicted(case, a, target)
    old = set_flags(case.flags)
    try:
        steps = {
            name: step(v, torch.randn_like(v.model(*v.inputs)))  # a gradient of each
            for name, v in (("as_is", a), ("fixed", b))
        }  # output's own shape
        timings = compare(
            steps, rounds=args.rounds, repeats_per_round=args.repeats, warmup=3, device=args.device
        )
        graph = None
        if args.device.startswith("cuda") and case.rule != "launch-bound":  # that one IS graphs
            try:
                replays = {name: cuda_graph(fn) for name, fn in steps.items()}
                graph = compare(
                    replays,
                    rounds=args.rounds,
                    repeats_per_round=args.repeats,
                    warmup=3,
                    device=args.device,
                )
            except Exception as exc:  # a step that cannot be captured keeps its eager figure
                torch.cuda.synchronize()
                print(
                    f"  {case.rule}: no CUDA-graph timing ({type(exc).__name__}: {str(exc)[:100]})",
                    file=sys.stderr,
                )
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
    as_is, fixed = timings["as_is"].median_s, timings["fixed"].median_s
    row = {
        "rule": case.rule,
        "case": case.name,
        "max_rel_error": err,
        "predicted_saving_s": saving_s,
        "predicted_step_s": step_s,
        "measured_as_is_s": as_is,
        "measured_fixed_s": fixed,
        "measured_saving_s": as_is - fixed,
        "timings_s": {k: list(t.times_s) for k, t in timings.items()},
        "method": timings["as_is"].method,
    }
    if graph is not None:
        row.update(
            graph_as_is_s=graph["as_is"].median_s,
            graph_fixed_s=graph["fixed"].median_s,
            graph_saving_s=graph["as_is"].median_s - graph["fixed"].median_s,
        )
    return row


def table(rows: list[dict]) -> str:
    head = (
        f"{'rule':<24} {'pred ms':>9} {'meas ms':>9} {'pred/meas':>9} "
        f"{'pred share':>10} {'meas share':>10} {'graph ms':>9} {'pred/graph':>10}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r.get('case', r['rule']):<24} {r['error'][:70]}")
            continue
        pred, meas = r["predicted_saving_s"], r["measured_saving_s"]
        ratio = f"{pred / meas:9.2f}" if pred is not None and meas > 0 else f"{'-':>9}"
        pshare = f"{pred / r['predicted_step_s']:10.1%}" if pred is not None else f"{'-':>10}"
        g = r.get("graph_saving_s")
        graph = f"{g * 1e3:9.3f}" if g is not None else f"{'-':>9}"
        gratio = (
            f"{pred / g:10.2f}" if g is not None and pred is not None and g > 0 else f"{'-':>10}"
        )
        lines.append(
            f"{r.get('case', r['rule']):<24} {(pred or 0) * 1e3:9.3f} "
            f"{meas * 1e3:9.3f} {ratio} {pshare} "
            f"{meas / r['measured_as_is_s']:10.1%} {graph} {gratio}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument(
        "--cases",
        help="comma-separated case names: rule ids, or 'unfused-norm-act (BN)' (default: all)",
    )
    parser.add_argument("--device", default="cuda", help="cpu smoke-tests the script")
    parser.add_argument("--scale", type=int, default=1, help="divide batch sizes by this")
    parser.add_argument(
        "--model",
        help="any MODEL (zoo, file.py:factory, hf:, timm:): every fix the audit names for it, "
        "applied one by one and measured (gpushape bench MODEL --optimize) instead of the cases",
    )
    parser.add_argument("--mode", default="eager", choices=("eager", "compile"))
    args = parser.parse_args()
    if args.model:  # the loop, as `gpushape bench MODEL --optimize` runs it
        from gpushape.cli.main import main as gpushape

        out = Path(os.environ.get("OUT", "./out")) / "validate_savings.json"
        cli = ["bench", args.model, "--device", args.device, "--optimize", "--mode", args.mode]
        raise SystemExit(gpushape([*cli, "-o", str(out)]))
    args.rounds, args.repeats = (3, 5) if args.quick else (5, 10)
    cuda = args.device.startswith("cuda")
    spec = current_gpu() if cuda else None
    target = resolve_target(spec.name if spec else "h100", "auto")
    spec, calibration = target.spec, target.calibration
    wanted = args.cases.split(",") if args.cases else list(CASES)
    rows = []
    for name in wanted:
        case = CASES[name]
        if case.cuda_only and not cuda:
            continue
        print(f"... {name}", file=sys.stderr, flush=True)
        try:
            rows.append(run_case(case, args, target))
        except Exception as exc:  # one broken case must not hide the others' results
            rows.append({"rule": case.rule, "case": name, "error": f"{type(exc).__name__}: {exc}"})
        torch.cuda.empty_cache() if cuda else None
    out = Path(os.environ.get("OUT", "./out")) / "validate_savings.json"
    write_results(
        out, rows, gpu_spec=spec.name, calibration=calibration, quick=args.quick, scale=args.scale
    )
    method = next((r["method"] for r in rows if "method" in r), "-")
    print(
        f"audit savings predicted for {spec.full_name} ({calibration or 'datasheet'}) and "
        f"measured here, one training step, medians of {args.rounds * args.repeats} "
        f"({method}):"
    )
    print(table(rows))


if __name__ == "__main__":
    main()
