"""Global response normalization (ConvNeXt-V2's GRN) in a few passes over the tensor.

The public op is `grn.py` (`global_response_norm`, `GlobalResponseNorm`, exported by
`gpushape.kernels`); the Triton kernels (`_kernels.py`), their launchers (`_launch.py`) and the
plain-PyTorch reference (`_reference.py`) are private modules.
"""
