"""Group normalization with an optional activation (GroupNorm -> ReLU / SiLU / ...) in a few
passes over the tensor.

The public op is `group_norm.py` (`group_norm_act`, `GroupNormAct`, exported by
`gpushape.kernels`); the Triton kernels (`_kernels.py`), their launchers (`_launch.py`) and the
plain-PyTorch reference (`_reference.py`) are private modules.
"""
