"""gpushape: make PyTorch networks fit the GPU they run on."""

__version__ = "0.1.0"
