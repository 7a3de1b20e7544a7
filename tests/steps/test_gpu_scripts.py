"""The GPU scripts the next device session runs, run on the CPU with tiny shapes: they build,
time, check and write their JSON (their numbers here say nothing about a GPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(monkeypatch, folder: str, module: str, argv: list[str]):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / folder))
    mod = __import__(module)
    monkeypatch.setattr(sys, "argv", [module, *argv])
    return mod


def test_guide_resnet_times_both_networks_and_counts_their_macs(monkeypatch, tmp_path):
    out = tmp_path / "guide.json"
    mod = _run(monkeypatch, "steps", "guide_resnet", [
        "--device", "cpu", "--batch", "4", "--image", "32", "--rounds", "1", "--block", "1",
        "--variant", "channels-last", "--loss-steps", "6", "--out", str(out)])  # fmt: skip
    mod.main()
    r = json.loads(out.read_text())["results"]
    assert set(r["models"]) == {"resnet50", "resnet50-gpu"}
    assert r["guide_over_resnet50"]["forward_gmacs_per_image"] == pytest.approx(1.93, abs=0.02)
    assert all(len(m["losses"]) == 6 for m in r["models"].values())


def test_roofline_step_classes_a_variant_and_bounds_the_step(monkeypatch, tmp_path):
    out = tmp_path / "roof.json"
    args = ["resnet50", "--batch", "2", "--input", "2x3x32x32", "--device", "cpu", "--vs",
            "channels-last", "--rounds", "1", "--target", "100", "--out", str(out)]  # fmt: skip
    mod = _run(monkeypatch, "steps", "roofline_step", args)
    mod.main()
    r = json.loads(out.read_text())["results"]
    v = r["variants"]["channels-last"]
    assert v["bounds_s"]["all at roofline"] > 0 and "convolution" in v["classes"]


def test_probe_compile_qkv_checks_each_setting_against_eager(monkeypatch, tmp_path):
    out = tmp_path / "qkv.json"
    mod = _run(monkeypatch, "kernels", "probe_compile_qkv", [
        "--device", "cpu", "--tiny", "--rounds", "1", "--out", str(out)])  # fmt: skip
    monkeypatch.setattr(
        mod, "CONFIGS", {"default": {}, "nd-tiling": dict(mod.CONFIGS["nd-tiling"])}
    )
    mod.main()
    rows = json.loads(out.read_text())["results"]["rows"]
    assert set(rows) == {"eager", "default", "nd-tiling"}
    assert rows["default"]["worst_grad_error"] < 1e-3


def test_compile_cache_times_gpt2_with_and_without_its_cache(monkeypatch, tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "cache.json"
    args = ["--device", "cpu", "--tiny", "--batch", "2", "--rounds", "1", "--out", str(out)]
    mod = _run(monkeypatch, "steps", "compile_cache", args)
    mod.main()
    r = json.loads(out.read_text())["results"]
    kinds = ("cache", "no cache", "no-kv-cache")
    assert set(r["rows"]) == {f"{m}, {c}" for m in ("eager", "compiled") for c in kinds}
    assert r["predicted"]["no cache"]["compile"]["materialized-attention-mask_ms"] > 0
    assert "materialized-attention-mask_ms" not in r["predicted"]["cache"]["compile"]
    assert r["predicted"]["cache"]["eager"]["kv-cache-in-training_ms"] > 0


def test_probe_masked_sdpa_times_every_mask_eager_and_compiled(monkeypatch, tmp_path):
    out = tmp_path / "masked.json"
    shapes = "1,2,32,16;2,2,16,16"
    args = ["--device", "cpu", "--shapes", shapes, "--rounds", "1", "--out", str(out)]
    mod = _run(monkeypatch, "kernels", "probe_masked_sdpa", args)
    mod.main()
    rows = json.loads(out.read_text())["results"]["rows"]
    # (decoder's masks + encoder's) x dropout x eager/compiled
    assert len(rows) == (len(mod.MASKS) + len(mod.ENCODER_MASKS)) * 2 * 2
    assert any(name.startswith("2x2x16x16 compiled, bool all-true b1tt") for name in rows)
    assert all(r["median_ms"] > 0 for r in rows.values())


def test_fit_masked_sdpa_puts_cudnn_rates_that_predict_the_causal_calls(monkeypatch, tmp_path):
    """The committed H200 probe: rates fitted on BERT's shape, checked on GPT-2's."""
    probe = ROOT / "benchmarks" / "results" / "kernels-h200" / "probe_masked_sdpa.json"
    out = tmp_path / "profile.json"
    mod = _run(monkeypatch, "kernels", "fit_masked_sdpa", [])
    assert mod.main([str(probe), "-o", str(out)]) == 0
    rows = json.loads(out.read_text())["attention"]
    rates = rows["cudnn_masked/d64"]
    assert 0 < rates["cudnn_masked/fwd/d64"] < 1 and 0 < rates["cudnn_masked/bwd/d64"] < 1
    _, lines = mod.fit(json.loads(probe.read_text()), json.loads(out.read_text()))
    causal = [line for line in lines if "bool causal" in line]
    assert causal and all(0.8 < float(line.rsplit("(", 1)[1].rstrip(")")) < 1.25 for line in causal)


def test_fit_max_pool_rates_inductors_pool_against_the_eager_family(monkeypatch, tmp_path):
    """The committed H200 timings: Inductor's pool between PyTorch's eager kernels and the copy
    rate, and the eager family's rate re-derived from the same run within 10%."""
    bench = json.loads((ROOT / "benchmarks/results/kernels-h200/bench_max_pool.json").read_text())
    out = tmp_path / "profile.json"
    mod = _run(monkeypatch, "kernels", "fit_max_pool", [])
    path = ROOT / "benchmarks/results/kernels-h200/bench_max_pool.json"
    assert mod.main([str(path), "-o", str(out)]) == 0
    rows = json.loads(out.read_text())["memory_efficiency"]
    compiled, eager = rows["pool_compiled"]["efficiency"], rows["pool"]["efficiency"]
    assert eager < compiled < 1
    eager_s = next(r["median_ms"] for r in bench["results"] if r["variant"] == "eager"
                   and r["layout"] == "cl" and r["direction"] == "fwd+bwd"
                   and r["shape"] == mod.SHAPE) * 1e-3  # fmt: skip
    roofline = rows["pool_compiled"]["family_roofline_s"]
    assert roofline / eager_s == pytest.approx(eager, rel=0.1)


def test_fit_bias_grad_writes_each_column_sum_width_the_h200_timed(monkeypatch, tmp_path):
    """The committed H200 timings of PyTorch's sum(0) at 16384 rows: one "reduction@<width>"
    row per width, its efficiency the timing over the cost model's copy-rate price (the probe's
    own fraction of its copy rate within 2%), narrower columns slower."""
    path = ROOT / "benchmarks/results/kernels-h200/probe_bias_grad.json"
    probe = json.loads(path.read_text())["results"]
    out = tmp_path / "profile.json"
    mod = _run(monkeypatch, "kernels", "fit_bias_grad", [])
    assert mod.main([str(path), "-o", str(out)]) == 0
    rows = json.loads(out.read_text())["memory_efficiency"]
    widths = [768, 2304, 3072]
    effs = [rows[f"reduction@{w}"]["efficiency"] for w in widths]
    assert effs == sorted(effs) and effs[0] < rows["reduction"]["efficiency"]
    for w, eff in zip(widths, effs):
        timed = next(r for r in probe if r["shape"] == [16384, w] and r["variant"] == mod.VARIANT)
        assert eff == pytest.approx(timed["graph_of_copy_rate"], rel=0.02)


def test_probe_optimizer_kernels_times_both_classes_and_implementations(monkeypatch, tmp_path):
    out = tmp_path / "opt.json"
    args = ["--device", "cpu", "--steps", "1", "--out", str(out)]
    mod = _run(monkeypatch, "steps", "probe_optimizer_kernels", args)
    mod.main()
    r = json.loads(out.read_text())["results"]
    assert {(s["class"], s["impl"]) for s in r["steps"]} == {
        (c, i) for c in ("SGD", "AdamW") for i in ("foreach", "fused")
    }
    assert all(s["probe_fit_s"] > 0 and s["shipped_s"] > 0 for s in r["steps"])
    assert {"foreach", "fused"} <= set(r["fit"])


def test_probe_window_attention_prices_every_shape_and_bias(monkeypatch, tmp_path):
    out = tmp_path / "win.json"
    args = ["--device", "cpu", "--rounds", "1", "--out", str(out)]
    mod = _run(monkeypatch, "kernels", "probe_window_attention", args)
    mod.main()
    rows = json.loads(out.read_text())["results"]["rows"]
    assert len(rows) == 2 * len(mod.BIASES)
    assert all(r["predicted_fwd_us"] > 0 and r["predicted_bwd_us"] > 0 for r in rows.values())
    # a bias adds work beside the attention call (the materialized one most)
    one = {b: rows[f"4x2x9x8 {b}"]["predicted_all_us"] for b in mod.BIASES}
    assert one["none"] < one["bias 1hTT"] < one["bias BhTT"]


def test_fit_window_attention_recovers_the_rate_the_times_were_made_with(monkeypatch, tmp_path):
    """Kernel times made from the model's time at rate 1 over known rates: the fit gives those
    rates back per (head size, length), and the profile it writes prices the calls at them."""
    import torch

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "kernels"))
    fit_mod = __import__("fit_window_attention")
    from gpushape.hardware.lookup import get_gpu
    from gpushape.hardware.profile import apply_profile, read_profile
    from gpushape.probe.attention import AttentionConfig, model_s

    profile = read_profile(fit_mod.PROFILES["H200"])
    spec = apply_profile(get_gpu(profile["gpu"]), profile)
    made = {(32, 49): (0.05, 0.08), (64, 197): (0.12, 0.1)}
    rows = {}
    for b, h, t, d in [(4096, 3, 49, 32), (64, 24, 49, 32), (64, 12, 197, 64)]:
        fwd, bwd, _, _ = model_s(
            spec, AttentionConfig("efficient", d, seq=t), (b, h, t), torch.bfloat16
        )
        r_fwd, r_bwd = made[(d, t)]
        for bias in ("bias 1hTT", "none"):
            slower = 1.0 if bias != "none" else 0.5  # cuDNN's kernel: not fitted
            rows[f"{b}x{h}x{t}x{d} {bias}"] = {
                "attention_fwd_us": fwd / r_fwd * 1e6 * slower,
                "attention_bwd_us": bwd / r_bwd * 1e6 * slower,
            }
    results = tmp_path / "win.json"
    results.write_text(
        json.dumps({"environment": {"gpu": "NVIDIA H200"}, "results": {"rows": rows}})
    )
    written = tmp_path / "profile.json"
    monkeypatch.setattr(sys, "argv", ["fit", str(results), "-o", str(written)])
    fit_mod.main()
    fitted = read_profile(written)["attention"]
    assert fitted["efficient/d32@t49"]["efficient/fwd/d32@t49"] == pytest.approx(0.05, rel=1e-3)
    assert fitted["efficient/d32@t49"]["efficient/bwd/d32@t49"] == pytest.approx(0.08, rel=1e-3)
    assert fitted["efficient/d64@t197"]["efficient/fwd/d64@t197"] == pytest.approx(0.12, rel=1e-3)
    priced = apply_profile(spec, {"attention": fitted}).achievable
    assert priced.attention_rate("efficient", True, False, False, 32, seq=49) == pytest.approx(
        0.08, rel=1e-3
    )
    # the probe's own row at 1024 tokens still prices a long call at head size 64
    assert priced.attention_rate("efficient", False, False, False, 64, seq=1024) == pytest.approx(
        spec.achievable.attention_rate("efficient", False, False, False, 64, seq=1024)
    )
