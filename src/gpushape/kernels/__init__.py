"""Fused Triton kernels, one op per file, each registered as a torch.library custom op."""
