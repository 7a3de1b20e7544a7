"""Pooling: a max pool whose backward reads a 1-byte window position instead of PyTorch's int64
index, and an average pool guarded against PyTorch's wrong channels_last backward.

The public ops are `max_pool.py` (`max_pool2d`, `MaxPool2d`) and `avg_pool.py`
(`LayoutSafeAvgPool2d`, `avg_pool_nhwc_backward_ok`: pytorch#188344, no kernel of its own),
exported by `gpushape.kernels`; max pooling's window arithmetic and argument checks
(`_geometry.py`), Triton kernels (`_kernels.py`), their launchers (`_launch.py`) and the
plain-PyTorch reference (`_reference.py`) are private modules.
"""
