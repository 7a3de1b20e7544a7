"""Every fused kernel's forward and backward, once each, on small awkward shapes: the workload
compute-sanitizer checks for out-of-bounds and misaligned accesses (memcheck) and shared-memory
hazards (racecheck), which the Triton interpreter in CI cannot find (it runs programs one at a
time and on CPU memory).

Run it under the sanitizer with PyTorch's caching allocator off, so that a read past a tensor's
end leaves its allocation rather than landing in a pooled neighbour:

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 9 \
        python benchmarks/kernels/sanitize_kernels.py --out sanitize.json
    (gpu_run.sh sanitize: memcheck, then racecheck)

Each case is also checked against plain PyTorch in float32 (forward and input gradients; the
dropout cases with p > 0 only run; the residual-gradient hand-over against the same chain
without it), so a case that runs clean under the tool also computed the right thing.
`--device cpu` with TRITON_INTERPRET=1 runs it in Triton's interpreter.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _bench_common, beside this script

import _bench_common as common  # first: it puts this working tree's src/ on the path

from gpushape.bench import write_results
from gpushape.kernels import (
    FusedQKV,
    add_layer_norm,
    batch_norm_act,
    dropout_add_layer_norm,
    global_response_norm,
    group_norm_act,
    layer_norm_gelu,
    max_pool2d,
    rms_norm,
    softmax_dropout,
)
from gpushape.kernels.attention.fused_qkv import _split_heads

BF16 = torch.bfloat16


def _leaf(*shape, dtype=BF16, device="cuda", channels_last=False):
    t = torch.randn(*shape, device=device, dtype=torch.float32) * 0.5 - 0.3
    if channels_last:
        t = t.contiguous(memory_format=torch.channels_last)
    return t.to(dtype).requires_grad_()


def _run(ours: Callable, ref: Callable, inputs: list[torch.Tensor]) -> float:
    """ours(*inputs) and ref(*inputs) forward and backward with one random output gradient,
    the reference on float32 copies: the largest difference of the outputs and the input
    gradients, over the reference's scale (at least 1: a gradient that is zero in exact
    arithmetic, a one-wide norm's, is then held to an absolute bound)."""
    out = ours(*inputs)
    grad = torch.randn_like(out)
    got = [out, *torch.autograd.grad(out, inputs, grad)]
    copies = [t.detach().float().requires_grad_() for t in inputs]
    want_out = ref(*copies)
    want = [want_out, *torch.autograd.grad(want_out, copies, grad.float())]
    return max(
        ((g.float() - w).abs().max() / w.abs().max().clamp_min(1.0)).item()
        for g, w in zip(got, want, strict=True)
    )


def _bn(dev):
    def case(channels_last: bool, residual: bool, activation: str) -> Callable[[], float]:
        def run() -> float:
            x = _leaf(3, 19, 7, 5, device=dev, channels_last=channels_last)
            w, b = (
                _leaf(19, dtype=torch.float32, device=dev),
                _leaf(19, dtype=torch.float32, device=dev),
            )
            r = _leaf(3, 19, 7, 5, device=dev, channels_last=channels_last) if residual else None
            inputs = [x, w, b] + ([r] if residual else [])

            def ours(x, w, b, r=None):
                return batch_norm_act(x, w, b, None, None, True, activation=activation, residual=r)

            def ref(x, w, b, r=None):
                y = F.batch_norm(x, None, None, w, b, True)
                y = y + r if r is not None else y
                return F.relu(y) if activation == "relu" else y

            return _run(ours, ref, inputs)

        return run

    def chain() -> float:
        """A block's output fed to the next block's residual, the whole graph's backward: the
        residual's gradient is handed over to the first norm's kernels. Checked against the
        same chain given a copy of the output (no hand-over): a float reference would differ at
        the second ReLU wherever the first output's rounding moves an input across zero."""
        x1, x2 = (_leaf(4, 16, 6, 6, device=dev, channels_last=True) for _ in range(2))
        w, b = (_leaf(16, dtype=torch.float32, device=dev) for _ in range(2))
        grad = torch.randn(4, 16, 6, 6, device=dev, dtype=BF16)

        def grads(handed: bool) -> list[torch.Tensor]:
            for t in (x1, x2, w, b):
                t.grad = None
            a = batch_norm_act(x1, w, b, None, None, True)
            r = a if handed else a.clone()  # a copy is no fused output: nothing to hand over
            (batch_norm_act(x2, w, b, None, None, True, residual=r) + a).backward(grad)
            return [t.grad.float() for t in (x1, x2, w, b)]

        return max(
            ((g - w).abs().max() / w.abs().max().clamp_min(1.0)).item()
            for g, w in zip(grads(True), grads(False), strict=True)
        )

    return {
        "batch_norm_act nchw relu": case(False, False, "relu"),
        "batch_norm_act channels_last residual relu": case(True, True, "relu"),
        "batch_norm_act channels_last no activation": case(True, False, "none"),
        "batch_norm_act hand-over chain": chain,
    }


def _norms(dev):
    def row(n: int, fn: str) -> Callable[[], float]:
        def run() -> float:
            x, r = _leaf(5, 3, n, device=dev), _leaf(5, 3, n, device=dev)
            w, b = _leaf(n, device=dev), _leaf(n, device=dev)
            if fn == "rms_norm":
                return _run(
                    lambda x, w: rms_norm(x, w), lambda x, w: F.rms_norm(x, (n,), w, 1e-6), [x, w]
                )
            if fn == "layer_norm_gelu":
                return _run(
                    lambda x, w, b: layer_norm_gelu(x, w, b),
                    lambda x, w, b: F.gelu(F.layer_norm(x, (n,), w, b)),
                    [x, w, b],
                )
            if fn == "add_layer_norm":
                return _run(
                    lambda x, r, w, b: add_layer_norm(x, r, w, b)[0],
                    lambda x, r, w, b: F.layer_norm(x + r, (n,), w, b),
                    [x, r, w, b],
                )
            return _run(  # p = 0: the dropout path's kernels, with an exact reference
                lambda x, r, w, b: dropout_add_layer_norm(x, r, w, b, p=0.0),
                lambda x, r, w, b: F.layer_norm(x + r, (n,), w, b),
                [x, r, w, b],
            )

        return run

    cases = {}
    for fn in ("rms_norm", "layer_norm_gelu", "add_layer_norm", "dropout_add_layer_norm"):
        for n in (1, 65, 1025, 4097):
            cases[f"{fn} n={n}"] = row(n, fn)

    def dropout() -> float:  # p > 0 runs the Philox path: checked for its kept fraction alone
        x, r = _leaf(7, 1500, device=dev), _leaf(7, 1500, device=dev)
        y = dropout_add_layer_norm(x, r, p=0.17)
        y.backward(torch.randn_like(y))
        return 0.0

    cases["dropout_add_layer_norm p=0.17"] = dropout
    return cases


def _attention(dev):
    def soft(t: int, causal: bool, masked: bool) -> Callable[[], float]:
        def run() -> float:
            x = _leaf(2, 3, t, t, device=dev)
            mask = torch.randn(1, 3, t, t, device=dev, dtype=BF16) if masked else None

            def ref(x):
                y = x + (mask.float() if masked else 0)
                if causal:
                    keep = torch.ones(t, t, dtype=torch.bool, device=dev).tril()
                    y = y.masked_fill(~keep, float("-inf"))
                return torch.softmax(y, -1)

            return _run(
                lambda x: softmax_dropout(x, 0.0, attn_mask=mask, is_causal=causal), ref, [x]
            )

        return run

    def qkv() -> float:  # grouped-query heads; the backward assembles dQ, dK, dV in a kernel
        m = FusedQKV(96, 6, 2, device=dev, dtype=BF16)
        sizes = (m.num_heads, m.num_kv_heads, m.num_kv_heads)

        def ref(x):
            qkv = F.linear(x, m.weight.float(), m.bias.float())
            return torch.cat([t.reshape(-1) for t in _split_heads(qkv, sizes, m.head_dim)])

        return _run(
            lambda x: torch.cat([t.reshape(-1) for t in m(x)]), ref, [_leaf(3, 17, 96, device=dev)]
        )

    return {
        "softmax_dropout t=33": soft(33, False, False),
        "softmax_dropout t=129 causal": soft(129, True, False),
        "softmax_dropout t=49 additive mask": soft(49, False, True),
        "softmax_dropout p=0.5": lambda: (
            softmax_dropout(_leaf(2, 3, 65, 65, device=dev), 0.5).sum().backward(),
            0.0,
        )[1],
        "FusedQKV grouped-query": qkv,
    }


def _pool(dev):
    def case(channels_last: bool, side: int) -> Callable[[], float]:
        def run() -> float:
            x = _leaf(2, 5, side, side + 2, device=dev, channels_last=channels_last)
            return _run(
                lambda x: max_pool2d(x, 3, 2, 1),
                lambda x: F.max_pool2d(x, 3, 2, 1),
                [x],
            )

        return run

    return {
        "max_pool2d nchw 11x13": case(False, 11),
        "max_pool2d channels_last 8x10": case(True, 8),
    }


def _grn_ref(x, w, b, channels_last: bool):
    """timm's GlobalResponseNorm.forward on plain tensors."""
    dims, cdim, shape = ((1, 2), -1, (1, 1, 1, -1)) if channels_last else ((2, 3), 1, (1, -1, 1, 1))
    x_g = x.norm(p=2, dim=dims, keepdim=True)
    x_n = x_g / (x_g.mean(dim=cdim, keepdim=True) + 1e-6)
    return x + torch.addcmul(b.view(shape), w.view(shape), x * x_n)


def _grn(dev):
    """Channels off every tile, pixels split over several programs, both layouts."""

    def case(shape: tuple[int, ...], channels_last: bool, cl_memory: bool) -> Callable[[], float]:
        def run() -> float:
            x = _leaf(*shape, device=dev, channels_last=cl_memory)
            c = shape[3] if channels_last else shape[1]
            w, b = _leaf(c, device=dev), _leaf(c, device=dev)
            return _run(
                lambda x, w, b: global_response_norm(x, w, b, 1e-6, channels_last),
                lambda x, w, b: _grn_ref(x, w, b, channels_last),
                [x, w, b],
            )

        return run

    return {
        "global_response_norm nhwc 2x31x33x67": case((2, 31, 33, 67), True, False),
        "global_response_norm nchw 3x70x9x11": case((3, 70, 9, 11), False, False),
        "global_response_norm nchw channels_last 2x65x7x5": case((2, 65, 7, 5), False, True),
    }


def _group_norm(dev):
    """Pixels split over several programs, channel counts off every tile, both layouts, the
    flat elementwise pass (NCHW rows off 16-byte alignment) and an activation each."""

    def case(shape, groups: int, act: str, cl_memory: bool) -> Callable[[], float]:
        def run() -> float:
            x = _leaf(*shape, device=dev, channels_last=cl_memory)
            w, b = _leaf(shape[1], device=dev), _leaf(shape[1], device=dev)
            fn = {"relu": F.relu, "silu": F.silu, "none": lambda t: t}[act]
            return _run(
                lambda x, w, b: group_norm_act(x, groups, w, b, 1e-5, act),
                lambda x, w, b: fn(F.group_norm(x, groups, w, b, 1e-5)),
                [x, w, b],
            )

        return run

    return {
        "group_norm_act nchw 3x12x9x11 g4 silu": case((3, 12, 9, 11), 4, "silu", False),
        "group_norm_act nchw 2x70x16x16 g7 relu": case((2, 70, 16, 16), 7, "relu", False),
        "group_norm_act channels_last 2x65x7x5 g5 none": case((2, 65, 7, 5), 5, "none", True),
    }


def cases(device: str) -> dict[str, Callable[[], float]]:
    return {
        **_bn(device),
        **_norms(device),
        **_attention(device),
        **_pool(device),
        **_grn(device),
        **_group_norm(device),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_device_arg(parser)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if common.cuda_missing(args.device, "sanitize_kernels"):
        sys.exit(2)
    torch.manual_seed(0)
    results, failed = [], 0
    for name, run in cases(args.device).items():
        try:
            err = run()
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            ok = err < 0.05
            results.append({"case": name, "relative_error": err, "ok": ok})
        except Exception as exc:  # a case that raises is reported, the rest still run
            ok = False
            results.append(
                {"case": name, "error": f"{type(exc).__name__}: {exc}"[:300], "ok": False}
            )
        failed += not ok
        shown = results[-1].get("relative_error", results[-1].get("error"))
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {shown}")
    print(f"{len(results) - failed} of {len(results)} cases ran and matched PyTorch")
    if args.out:
        write_results(args.out, {"cases": results})
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
