"""batch_norm_act's launch configurations, per-shape table and plans (CPU lane, interpreter).

Every configuration the tuner (benchmarks/kernels/tune_batch_norm_act.py) may pick must compute
the same op: channel blocks narrower and wider than C, one-row tiles, programs looping over row
blocks (with and without the prefetch), the partial sums added by the last program or by the
separate finalize kernel, several waves.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from gpushape.kernels import _launch
from gpushape.kernels.batch_norm import _launch as launch
from gpushape.kernels.batch_norm import _runtime as runtime
from gpushape.kernels.batch_norm import _tuning as tuning
from gpushape.kernels.batch_norm._tuning import (
    ApplyConfig,
    BatchNormTuning,
    ReduceConfig,
    batch_norm_tuning,
)

from ._batch_norm_cases import CF, CL, _gate, _inputs, _run_fwd_bwd

# min_rows=1: several programs a channel block even at these tiny shapes (the interpreter runs 3)
EDGE = {
    "narrow": BatchNormTuning(
        stats=ReduceConfig(block_c=8, tile_bytes=256, min_rows=1, waves=2),
        apply=ApplyConfig(block_c=8, tile_bytes=256, waves=1),
        bwd_reduce=ReduceConfig(block_c=16, tile_bytes=512, min_rows=1, fuse_max=0),
        bwd_apply=ApplyConfig(block_c=16, tile_bytes=512, waves=1, prefetch=True),
    ),
    "wide": BatchNormTuning(
        stats=ReduceConfig(block_c=1024, tile_bytes=128, min_rows=1, fuse_max=0),
        apply=ApplyConfig(block_c=1024, tile_bytes=4096, waves=2, prefetch=True),
        bwd_reduce=ReduceConfig(block_c=1024, tile_bytes=256, min_rows=1),
        bwd_apply=ApplyConfig(block_c=32, tile_bytes=128, waves=1),
    ),
}


@pytest.mark.parametrize("fmt", [CL, CF], ids=["channels_last", "nchw"])
@pytest.mark.parametrize("name", list(EDGE))
def test_edge_configurations_pass_the_gate(interpret, name, fmt):
    with batch_norm_tuning(EDGE[name]):
        _gate((3, 21, 5, 7), torch.float32, fmt)
        _gate((2, 13, 4, 5), torch.float32, fmt, training=False)


def test_looping_programs_equal_one_tile_each(interpret):
    """Programs that loop over row blocks (prefetching or not) give bit-identical results."""
    x, w, b, r = (t.detach() for t in _inputs((4, 24, 6, 5), torch.bfloat16, CL))
    dy = torch.randn_like(x)
    one = ApplyConfig(tile_bytes=512)
    with batch_norm_tuning(apply=one, bwd_apply=one):
        expected = _run_fwd_bwd(x, r, dy, w, b)
    for prefetch in (False, True):
        loop = dataclasses.replace(one, waves=1, prefetch=prefetch)
        with batch_norm_tuning(apply=loop, bwd_apply=loop):
            plan = launch.forward_plan(x, w, b, None, None, r, True, True)
            assert plan.apply_g < plan.apply_tiles.n_rb  # each program does several
            got = _run_fwd_bwd(x, r, dy, w, b)
        for a, c in zip(expected, got):
            assert torch.equal(a, c)


def test_fused_and_separate_finalize_agree(interpret):
    x, w, b, r = (t.detach() for t in _inputs((4, 16, 24, 20), torch.float32, CL))
    dy = torch.randn_like(x)
    results = {}
    for fuse_max in (1 << 16, 0):
        cfg = ReduceConfig(fuse_max=fuse_max)
        with batch_norm_tuning(stats=cfg, bwd_reduce=cfg):
            plan = launch.forward_plan(x, w, b, None, None, r, True, True)
            assert plan.reduction.P > 1 and plan.reduction.fused == (fuse_max > 0)
            assert (plan.finalize is None) == plan.reduction.fused
            results[fuse_max] = _run_fwd_bwd(x, r, dy, w, b)
    for a, c in zip(*results.values()):
        torch.testing.assert_close(a, c, rtol=1e-6, atol=1e-6)


def test_last_program_counters_return_to_zero(interpret):
    """The last program of each channel block resets its count: the buffer is reused."""
    x, w, b, r = (t.detach() for t in _inputs((4, 16, 24, 20), torch.float32, CL))
    with batch_norm_tuning(stats=ReduceConfig(block_c=8), bwd_reduce=ReduceConfig(block_c=8)):
        first = _run_fwd_bwd(x, r, torch.ones_like(x), w, b)
        again = _run_fwd_bwd(x, r, torch.ones_like(x), w, b)
    counts = runtime.counters(x, 1)
    assert counts.numel() >= 2 and not counts.any()
    for a, c in zip(first, again):
        assert torch.equal(a, c)


def test_table_lookup_exact_nearest_and_default(monkeypatch):
    small, large = (
        BatchNormTuning(apply=ApplyConfig(warps=4)),
        BatchNormTuning(apply=ApplyConfig(warps=16)),
    )
    monkeypatch.setattr(tuning, "TUNED", {(64, 1000): small, (64, 100_000): large})
    assert tuning.tuning_for(64, 1000, True) is small
    assert tuning.tuning_for(64, 3000, True) is small  # nearest N*H*W (log scale), same C
    assert tuning.tuning_for(64, 50_000, True) is large
    assert tuning.tuning_for(128, 1000, True) is tuning.DEFAULT  # no entry for this C
    assert tuning.tuning_for(64, 1000, False) is tuning.DEFAULT  # NCHW: its own tiles
    with batch_norm_tuning(large, stats=ReduceConfig(waves=2)) as forced:
        assert tuning.tuning_for(7, 5, False) == forced
        assert forced.apply == large.apply and forced.stats.waves == 2
    assert tuning.tuning_for(7, 5, True) is tuning.DEFAULT


def test_load_table_reads_the_tuner_json(tmp_path, monkeypatch):
    monkeypatch.setattr(tuning, "TUNED", {})
    tuned = BatchNormTuning(
        stats=ReduceConfig(tile_bytes=2048, waves=2), bwd_apply=ApplyConfig(waves=2, prefetch=True)
    )
    path = tmp_path / "tune.json"
    path.write_text(
        json.dumps({"table": [{"C": 512, "rows": 200704, "tuning": dataclasses.asdict(tuned)}]})
    )
    generation = tuning.generation
    assert tuning.load_table(path) == {(512, 200704): tuned}
    assert tuning.tuning_for(512, 200704, True) == tuned and tuning.generation > generation


def test_the_environment_variable_loads_several_tables(tmp_path, monkeypatch):
    """GPUSHAPE_BATCH_NORM_TUNING: files joined by os.pathsep, each added; a bad one is named."""
    import os
    import subprocess
    import sys

    monkeypatch.setattr(tuning, "TUNED", {})
    a = BatchNormTuning(stats=ReduceConfig(warps=8))
    b = BatchNormTuning(apply=ApplyConfig(warps=4))
    paths = []
    for i, (c, t) in enumerate([(256, a), (512, b)]):
        paths.append(tmp_path / f"t{i}.json")
        paths[-1].write_text(
            json.dumps({"table": [{"C": c, "rows": 1000, "tuning": dataclasses.asdict(t)}]})
        )
    assert tuning.load_env_tables(os.pathsep.join(map(str, paths))) == {
        (256, 1000): a,
        (512, 1000): b,
    }
    assert tuning.tuning_for(512, 1000, True) == b
    assert tuning.load_env_tables("") == {}
    with pytest.raises(ValueError, match=r"GPUSHAPE_BATCH_NORM_TUNING.*missing\.json"):
        tuning.load_env_tables(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text('{"rows": 3}')
    with pytest.raises(ValueError, match=r"bad\.json"):
        tuning.load_env_tables(str(tmp_path / "bad.json"))
    # at import, in a fresh interpreter
    code = (
        "from gpushape.kernels.batch_norm import _tuning as t; "
        "print(t.tuning_for(256, 1000, True).stats.warps)"
    )
    env = dict(os.environ, GPUSHAPE_BATCH_NORM_TUNING=str(paths[0]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "8", out.stderr


def test_plans_are_cached_per_signature_and_tuning(interpret):
    x, w, b, r = (t.detach() for t in _inputs((2, 8, 3, 4), torch.float32, CL))
    plan = launch.forward_plan(x, w, b, None, None, r, True, True)
    assert launch.forward_plan(x, w, b, None, None, r, True, True) is plan
    assert launch.forward_plan(x.contiguous(), w, b, None, None, r, True, True) is not plan
    assert launch.forward_plan(x, w, None, None, None, r, True, True) is not plan
    with batch_norm_tuning(apply=ApplyConfig(warps=4)):
        assert launch.forward_plan(x, w, b, None, None, r, True, True) is not plan
    assert launch.forward_plan(x, w, b, None, None, r, True, True) is not plan  # new generation


def test_aligned_checks_every_tensor_and_skips_none():
    t = torch.zeros(64)
    assert _launch.aligned(t, None, torch.nn.Parameter(torch.zeros(4)))
    assert not _launch.aligned(t, t[1:])  # 4 bytes past a 16-byte boundary
    assert not _launch.aligned(torch.nn.Parameter(torch.zeros(8))[2:])


def test_the_tuner_runs_end_to_end_on_the_cpu(interpret, tmp_path):
    """benchmarks/kernels/tune_batch_norm_act.py --device cpu (its smoke mode), with the backward
    taking its gradient in two parts: every kernel timed, checked and written to the JSON."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"
    args = ["--device", "cpu", "--quick", "--shapes", "2x16x4x4", "--workers", "0"]
    done = subprocess.run(
        [sys.executable, str(script / "tune_batch_norm_act.py"), *args, "--budget-s", "3",
         "--handover"],
        env={**os.environ, "OUT": str(tmp_path), "TRITON_INTERPRET": "1"},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    table = json.loads((tmp_path / "tune_batch_norm_act.json").read_text())["table"]
    assert [(e["C"], e["rows"]) for e in table] == [(16, 32)]
    assert "tuned gate: pass" in done.stdout
