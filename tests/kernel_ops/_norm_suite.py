"""The test matrix every row-norm op shares (TESTING.md), written once.

A test file subclasses `NormSuite` with `case = NormCase(...)` as `TestSomething`; pytest then
runs every test below for that op. Op-specific tests (errors, modules, extra outputs) stay in
the op's own test file.
CPU lane: Triton kernels in the interpreter (TRITON_INTERPRET=1), small shapes.
GPU lane (`pytest -m gpu`): the full matrix on CUDA.
"""

from __future__ import annotations

import pytest
import torch

from gpushape.kernels.norms._common import norm_tuning
from gpushape.kernels.norms._tuning import BwdConfig

from . import _norm_cases as nc

CI_N = [1, 2, 3, 63, 64, 65, 127, 1023, 1025, 1500]
GPU_N = [
    1,
    2,
    3,
    63,
    64,
    65,
    127,
    1023,
    1024,
    1025,
    1500,
    4096,
    8191,
    8192,
    16384,
    16385,
    65536,
    65537,
]
LAYOUTS = {  # name -> (view of a contiguous tensor, that tensor's shape)
    "transposed": (lambda t: t.transpose(0, 1), (65, 6)),
    "sliced": (lambda t: t[..., ::2], (6, 130)),
    "offset": (lambda t: t[1:], (7, 65)),
}


class NormSuite:
    case: nc.NormCase

    @pytest.fixture(autouse=True)
    def _seed(self):
        torch.manual_seed(0)  # fresh inputs in every check, reproducible from run to run

    # ---- CPU lane ---------------------------------------------------------------------------
    @pytest.mark.parametrize("n", CI_N)
    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_gate_odd_sizes(self, interpret, dtype, n):
        nc.gate(self.case, (7, n), dtype)

    @pytest.mark.parametrize("n", [65, 1023])
    def test_gate_float16(self, interpret, n):
        nc.gate(self.case, (7, n), torch.float16)

    @pytest.mark.parametrize(
        "prefetch,block_m,reload_wb", [(0, 1, True), (1, 2, False), (2, 1, False)]
    )
    def test_persistent_backward_walks_many_tiles(self, interpret, prefetch, block_m, reload_wb):
        # 37 rows of 1500: more row tiles than backward programs, so each program loops and
        # prefetches (none, one or two tiles ahead), and several programs' dweight/dbias
        # partials are added; the last tile of a program may be past the last row.
        cfg = BwdConfig(
            block_m=block_m, num_warps=4, programs_per_sm=3, prefetch=prefetch, reload_wb=reload_wb
        )
        with norm_tuning(bwd=cfg, sum_block_p=4):
            nc.gate(self.case, (37, 1500), torch.bfloat16)

    @pytest.mark.parametrize("shape", [(0, 33), (1, 33), (2, 3, 33), (2, 2, 3, 33)])
    def test_leading_dims(self, interpret, shape):
        nc.gate(self.case, shape, torch.float32)

    @pytest.mark.parametrize("n,chunk", [(65, 32), (1500, 512)])
    def test_looped_path(self, interpret, n, chunk):
        # The multi-block path, reached at small N by lowering the single-block limits.
        with norm_tuning(fwd_max_block_n=32, bwd_max_block_n=32, looped_block_n=chunk):
            nc.gate(self.case, (5, n), torch.bfloat16)
            nc.gate(self.case, (3, n), torch.float32)

    def test_without_affine_parameters(self, interpret):
        nc.gate(self.case, (7, 65), torch.float32, affine=False)

    @pytest.mark.parametrize("layout", sorted(LAYOUTS))
    def test_strided_inputs_equal_contiguous(self, interpret, layout):
        make_view, base_shape = LAYOUTS[layout]
        nc.assert_same_as_contiguous(self.case, make_view, base_shape, torch.bfloat16)

    def test_expanded_grad_output_equals_contiguous(self, interpret):
        nc.assert_same_as_contiguous(
            self.case, lambda t: t, (4, 65), torch.float32, grad_view=lambda g: g[:1].expand_as(g)
        )

    def test_nan_propagates(self, interpret):
        nc.assert_nan_propagates(self.case, torch.float32)

    def test_constant_rows(self, interpret):
        nc.constant_rows(self.case, torch.float32)

    def test_values_near_float16_max(self, interpret):
        nc.near_float16_max(self.case)

    def test_gradcheck_float64(self, interpret):
        nc.gradcheck_float64(self.case, (3, 7))

    def test_torch_compile_fullgraph(self, interpret):
        nc.compiled_equals_eager(self.case, (2, 3, 65), torch.float32)

    def test_reference_path_without_interpreter(self, monkeypatch):
        # CPU tensors without TRITON_INTERPRET=1 take the plain-PyTorch path: gate it too.
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        for n in (1, 65, 1500):
            nc.gate(self.case, (7, n), torch.bfloat16)
        nc.gate(self.case, (2, 3, 65), torch.float32)

    # ---- GPU lane ---------------------------------------------------------------------------
    @pytest.mark.gpu
    @pytest.mark.parametrize("n", GPU_N)
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
    def test_gpu_gate(self, dtype, n):
        nc.gate(self.case, (7, n), dtype, device="cuda")

    @pytest.mark.gpu
    @pytest.mark.parametrize(
        "shape", [(0, 768), (1, 768), (65537, 64), (4, 33, 768), (2, 3, 5, 4096), (300, 16384)]
    )
    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_gpu_shapes(self, shape, dtype):
        nc.gate(self.case, shape, dtype, device="cuda")

    @pytest.mark.gpu
    def test_gpu_layouts_constant_rows_and_nan(self):
        cuda = nc.on_device(self.case, "cuda")
        nc.assert_same_as_contiguous(cuda, lambda t: t.transpose(0, 1), (4096, 8), torch.bfloat16)
        nc.assert_same_as_contiguous(cuda, lambda t: t[..., ::2], (8, 8192), torch.bfloat16)
        nc.constant_rows(cuda, torch.bfloat16, n=4096)
        nc.assert_nan_propagates(cuda, torch.float32, n=4096)
        nc.near_float16_max(cuda, n=4096)

    @pytest.mark.gpu
    @pytest.mark.parametrize("n", [768, 4096, 65537])
    def test_gpu_torch_compile(self, n):
        nc.compiled_equals_eager(self.case, (64, n), torch.bfloat16, device="cuda")

    @pytest.mark.gpu
    def test_gpu_cuda_graph_replay(self):
        nc.cuda_graph_matches_eager(self.case, (256, 4096), torch.bfloat16)

    @pytest.mark.gpu
    def test_gpu_backward_is_deterministic(self):
        nc.repeated_backward_is_bitwise_equal(self.case, (4096, 1024), torch.bfloat16, repeats=50)

    @pytest.mark.gpu
    def test_gpu_past_2_31_elements(self):
        nc.rows_past_2_31_elements(self.case, n=4096)
