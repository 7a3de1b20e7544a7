"""kv-cache-in-training: a Hugging Face decoder fills its key/value cache in every training step.

transformers' decoders default to `use_cache=True`, and a training forward builds the cache as
inference does: each attention layer copies its keys and values into a DynamicCache (in the
5.x releases a `cat` onto an empty tensor: a copy of K and of V a layer), the backward copies
their gradients back, and nothing reads the cache. The trace shows the copies as forward
`cat`s with an empty input; and where a cached tensor is its projection's output reshaped by
views alone, the gradient that comes back through the cache is contiguous in the heads'
layout, which the view that made the heads then copies (`_gradient_copies`).
Saving: those ops and the backward ops autograd ran for them, as the cost model prices them
(the cache's `cat` reads its strided input with the cat kernel's strided path: the
permuted_cat family, whose H200 rate comes from GPT-2's own step, `benchmarks/hardware/
permuted_cat_from_runs.py`, until the probe measures it), GPU and host, in every mode:
compiled, the cache is an output of the graph and the gradient's copy stays too (measured on
the H200, GPT-2 at 8 x 1024: 1.48 ms of GPU work saved eagerly, 1.16 compiled, 1.25 priced;
at 32 x 1024, compiled, the kernel assembling the projection's gradient took 4.5 ms with the
cache's copy in it, `case-gpt2-*.json`, and 70 us a layer without, `probe_compile_qkv.json`).
The `no-kv-cache` fix runs training forwards with `use_cache=False` and transformers'
packed-sequence check answered as the model's own positions are (no host sync eagerly; no
causal mask compiled or captured: materialized-attention-mask). Training only; quiet once
fixed.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...models.hf_masks import cache_setting, decoder, is_hf_model, trains_without_cache
from ..context import AuditContext
from ..finding import Finding
from ..patterns import module_pattern
from ..registry import register_rule

RULE = "kv-cache-in-training"


def cache_copies(ctx: AuditContext) -> list:
    """The forward `cat`s that start a layer's cache: one input empty, the other K or V."""
    return [
        r
        for r in ctx.forward_compute()
        if r.name == "cat" and len(r.inputs) == 2 and any(t.numel == 0 for t in r.inputs)
    ]


def _gradient_copies(ctx: AuditContext, copies: list) -> list:
    """The backward copies the cache adds. A cached tensor that is its projection's output
    reshaped into heads by views alone (GPT-2's keys and values) reaches SDPA without a
    cache as that strided view, and its gradient comes back in the same strides; through the
    cache's `cat` it comes back contiguous, and the view that made the heads copies it (a
    `clone` under ViewBackward0 in the module). A tensor computed on after the views (keys
    after a rotary embedding: LLaMA's) is not counted, and with it the values cached after
    it: the trace cannot tell which of the same-shaped tensors a computation read, so those
    copies are not attributed. Against the GPU work the step traced without the cache saves
    (two layers, 8 x 1024, the H200's profile), this prices all of it for GPT-2, OPT and
    GPT-NeoX, and 0.87x for Qwen2 and a small LLaMA, 0.57x for Phi."""
    ops, cache_cats = ctx.trace.ops, {c.index for c in copies}
    direct: dict[str, int] = {}
    for cat in copies:
        numel = next(t.numel for t in cat.inputs if t.numel)
        for rec in reversed(ops[: cat.index]):
            if rec.phase != "forward":
                continue
            mine = rec.module == cat.module
            if mine and rec.name == "view" and rec.outputs and rec.outputs[0].numel == numel:
                direct[cat.module] = direct.get(cat.module, 0) + 1
                break
            computed = rec.kind == "compute" and rec.index not in cache_cats
            if computed and rec.outputs and rec.outputs[0].numel == numel:
                break
    clones: dict[str, list] = {}
    for r in ops:
        if r.phase == "backward" and r.name == "clone" and r.grad_fn == "ViewBackward0":
            clones.setdefault(r.module, []).append(r)
    numels = {c.module: next(t.numel for t in c.inputs if t.numel) for c in copies}
    return [
        r
        for module, count in direct.items()
        for r in [c for c in clones.get(module, ()) if c.outputs[0].numel == numels[module]][:count]
    ]


@register_rule(RULE, title="a decoder fills its key/value cache in training")
def check(ctx: AuditContext) -> Iterable[Finding]:
    model = ctx.model
    if not ctx.train or model is None or not is_hf_model(model) or trains_without_cache(model):
        return
    if not cache_setting(model) or not decoder(model):
        return
    copies = cache_copies(ctx)
    if not copies:
        return
    cats = [o for r in copies for o in ctx.with_backward(r)]
    cats_s, gradients_s = ctx.time_s(cats), ctx.time_s(_gradient_copies(ctx, copies))
    saving_s = cats_s + gradients_s
    moved = sum(r.outputs[0].nbytes for r in copies)
    layers = len({r.module for r in copies})
    evidence = {
        "copies": len(copies),
        "layers": layers,
        "bytes_copied_forward": moved,
        "time_copies_s": cats_s,
        "time_gradient_copies_s": gradients_s,
        "sites": layers,
    }
    message = (
        f"{layers} attention layer(s) copy their keys and values into a key/value cache in "
        f"every training step (use_cache=True, transformers' default for decoders): "
        f"{moved / 1e9:,.2f} GB written forward, copied back in the backward, never read; "
        "no-kv-cache trains without it (evaluation and generation keep it)"
    )
    yield ctx.finding(
        RULE,
        module_pattern(r.module for r in copies),
        message,
        evidence,
        saving_s=saving_s,
        fix="no-kv-cache",
        replaces=copies,
    )
