"""Advice that holds on library models: transformers' and timm's attention, audited in bf16 as
they run on CUDA. With SDPA ("sdpa", timm's fused_attn) the trace holds the fused kernels and
neither fp32-math nor manual-attention fires; hand-written attention ("eager") is what
manual-attention is for. Small configurations keep each audit quick."""

from __future__ import annotations

import json
import sys

import pytest

import gpushape
from gpushape.cli.main import main
from gpushape.models import resolve_model

pytest.importorskip("transformers")

SMALL = {
    "llama": "hf:llama?num_hidden_layers=2&hidden_size=256&num_attention_heads=4"
    "&num_key_value_heads=2&vocab_size=1000&intermediate_size=512&seq=256",
    "gpt2": "hf:gpt2?n_layer=2&n_embd=256&n_head=4&vocab_size=1000&seq=256",
    "bert": "hf:bert?num_hidden_layers=2&hidden_size=256&num_attention_heads=4"
    "&intermediate_size=512&vocab_size=1000&seq=256",
}
FALSE_ALARMS = {"fp32-math", "manual-attention"}
FUSED = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention")


def _audit_rules(spec: str, mode: str = "eager") -> set[str]:
    r = resolve_model(spec, batch=2)
    report = gpushape.audit(
        r.model, r.example_inputs, gpu="h200", dtype="bf16", train=True, mode=mode
    )
    return {f.rule for f in report.findings}


def _attention_ops(spec: str) -> list:
    r = resolve_model(spec, batch=2)
    t = gpushape.trace(r.model, r.example_inputs, train=True)
    return [op for op in t.ops if "attention" in op.name or op.name in ("bmm", "_softmax")]


@pytest.mark.parametrize("mode", ["eager", "compile", "graph"])
@pytest.mark.parametrize("model", SMALL)
def test_sdpa_attention_raises_no_false_alarm(model, mode):
    assert not _audit_rules(SMALL[model], mode) & FALSE_ALARMS


@pytest.mark.parametrize("model", SMALL)
def test_sdpa_attention_traces_as_the_fused_kernel(model):
    ops = _attention_ops(SMALL[model])
    names = {op.name for op in ops}
    assert names and names <= {*FUSED, *(f"{n}_backward" for n in FUSED)}


def test_llama_grouped_query_attention_runs_flash_on_the_kv_heads():
    """transformers passes enable_gqa=True: flash reads 2 K/V heads, no repeat_kv copies."""
    (fwd, *_) = [op for op in _attention_ops(SMALL["llama"]) if op.name == FUSED[0]]
    assert fwd.input("query").shape[1] == 4 and fwd.input("key").shape[1] == 2


@pytest.mark.parametrize("model", SMALL)
def test_eager_attention_is_manual_attention(model):
    assert "manual-attention" in _audit_rules(SMALL[model] + "&attn=eager")


@pytest.mark.parametrize("attn,fires", [("sdpa", False), ("eager", True)])
def test_timm_fused_attention_switch(attn, fires):
    try:
        import timm  # noqa: F401
    except Exception as exc:  # it needs a torchvision that imports with this torch
        pytest.skip(f"timm does not import here: {type(exc).__name__}: {exc}")
    spec = f"timm:vit_tiny_patch16_224?depth=2&attn={attn}"
    assert ("manual-attention" in _audit_rules(spec)) is fires


def test_cli_audits_gpt2_training(capsys):
    spec = "hf:gpt2?n_layer=2&n_embd=128&n_head=2&vocab_size=1024&seq=128"
    assert main(["audit", spec, "--train", "--batch", "2", "--format", "json"]) == 0
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert not {f["rule"] for f in findings} & FALSE_ALARMS


def test_cli_without_transformers_is_one_line_exit_2(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    assert main(["audit", "hf:gpt2", "--train"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "gpushape: error: hf: models need transformers: pip install 'gpushape[hf]'"


def _sdpa_masks(model, inputs) -> list[bool]:
    """Whether each SDPA call of a forward got an explicit mask."""
    import torch.nn.functional as F

    seen, sdpa = [], F.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, **kwargs):
        seen.append(attn_mask is not None)
        return sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

    F.scaled_dot_product_attention = recording
    try:
        model(*inputs)
    finally:
        F.scaled_dot_product_attention = sdpa
    return seen


@pytest.mark.parametrize("cache", [True, False])
def test_a_decoder_without_its_cache_is_told_of_the_compiled_mask(cache):
    """With use_cache=False and no padding mask, the installed transformers is asked whether
    it builds a causal mask while tracing (its packed-sequence check); what it answers is what
    a forward on the CPU does with `is_tracing()` true, and the audit's finding follows: in
    compile and graph mode it saves time with skip-attention-mask as its fix, eagerly it is
    info. (Not yet measured on a GPU.)"""
    sys.path.insert(0, "tests")
    from _hf_masks import tracing
    from gpushape.models.hf_masks import packed_mask_gap

    spec = SMALL["gpt2"] + f"&use_cache={cache}"
    r = resolve_model(spec, batch=2, device="cpu")
    with tracing():
        masked = _sdpa_masks(r.model.train(), r.example_inputs)
    assert masked and len(set(masked)) == 1
    gap = packed_mask_gap(r.model) is not None and not cache
    assert masked[0] == gap or (cache and masked[0])  # with the cache: the older releases' gap
    r = resolve_model(spec, batch=2)
    for mode in ("eager", "compile", "graph"):
        report = gpushape.audit(r.model, r.example_inputs, gpu="h200", train=True, mode=mode)
        found = [f for f in report.findings if f.rule == "materialized-attention-mask"]
        assert all(f.fix == "skip-attention-mask" for f in found)
        if not gap:
            continue
        (finding,) = found
        assert "packed sequences" in finding.message
        assert finding.evidence["saving_by_mode_s"]["compile"] > 0
        assert (finding.severity.label == "info") if mode == "eager" else finding.est_saving_s


def test_the_caches_price_is_what_the_step_without_it_saves():
    """kv-cache-in-training's eager saving is the GPU work the step traced without the cache
    does not do (its forward copies, their backward, the gradient's copy back), at a size
    whose step the GPU sets (a launch-bound one counts the copies' launches too)."""
    steps, saving = {}, None
    for cache in (True, False):
        r = resolve_model(f"hf:gpt2?n_layer=2&use_cache={cache}", batch=4)
        report = gpushape.audit(r.model, r.example_inputs, gpu="h200", train=True)
        steps[cache] = report.step.gpu_s
        found = [f for f in report.findings if f.rule == "kv-cache-in-training"]
        if cache:
            (finding,) = found
            saving = finding.est_saving_s
        else:
            assert found == []
    assert saving == pytest.approx(steps[True] - steps[False], rel=0.1)


def _qkv_findings(spec: str, mode: str) -> list:
    r = resolve_model(spec, batch=2)
    report = gpushape.audit(r.model, r.example_inputs, gpu="h200", dtype="bf16", train=True,
                            mode=mode)  # fmt: skip
    return [f for f in report.findings if f.rule == "separate-qkv"]


def test_rotary_attention_projections_are_quiet_under_compile():
    """LLaMA's q/k/v feed rotary embeddings: compiled, Inductor's rotary backward writing the
    fused gradient costs more than the merged GEMM saves, so the attention's finding is info
    there with the reason; eager keeps it, and so does the MLP's gate/up (no rotary)."""
    eager = {tuple(f.evidence["projections"]): f for f in _qkv_findings(SMALL["llama"], "eager")}
    compiled = {
        tuple(f.evidence["projections"]): f for f in _qkv_findings(SMALL["llama"], "compile")
    }
    attention = next(k for k in eager if "q_proj" in k)
    mlp = next(k for k in eager if "gate_proj" in k)
    assert eager[attention].est_saving_s > 0
    assert compiled[attention].est_saving_s == 0.0
    assert compiled[attention].severity.label == "info"
    assert "rotary embedding" in compiled[attention].message
    assert compiled[mlp].est_saving_s > 0


def test_attention_without_rotary_keeps_its_compiled_finding():
    (f,) = [
        f for f in _qkv_findings(SMALL["bert"], "compile") if "query" in f.evidence["projections"]
    ]
    assert f.est_saving_s > 0 and "rotary" not in f.message


def test_optimize_compile_leaves_rotary_attention_unfused():
    """optimize in compile mode fuses the gated MLP's gate/up but not the rotary attention's
    q/k/v, and says why; eager mode fuses both."""
    import copy

    import torch

    r = resolve_model(SMALL["llama"], batch=2)
    fused = {}
    for mode in ("eager", "compile"):
        _, report = gpushape.optimize(copy.deepcopy(r.model), r.example_inputs, gpu="h200",
                                      dtype=torch.bfloat16, train=True, mode=mode)  # fmt: skip
        fused[mode] = {c.module.rpartition(".")[2] for c in report.applied
                       if c.transform == "fuse-qkv"}  # fmt: skip
        if mode == "compile":
            assert any("rotary embedding" in s.reason for s in report.skipped)
    assert fused == {"eager": {"self_attn", "mlp"}, "compile": {"mlp"}}
