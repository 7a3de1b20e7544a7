"""Pooling with a backward that reads a 1-byte window position instead of PyTorch's int64 index.

The public op is `max_pool.py` (`max_pool2d`, `MaxPool2d`, exported by `gpushape.kernels`); the
window arithmetic and argument checks (`_geometry.py`), the Triton kernels (`_kernels.py`), their
launchers (`_launch.py`) and the plain-PyTorch reference (`_reference.py`) are private modules.
"""
