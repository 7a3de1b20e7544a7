"""Row norms fused with their neighbours: LayerNorm+GELU, residual add+LayerNorm, RMSNorm.

One family of Triton row kernels (`_kernels.py`) specialised by constexpr flags; the public ops
are `layer_norm_gelu.py`, `add_layer_norm.py` and `rms_norm.py`, exported by `gpushape.kernels`.
"""
