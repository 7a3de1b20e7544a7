"""Attention's pieces: softmax+dropout (Philox mask, never stored), FusedQKV, KVCache.

Public ops (`softmax_dropout.py`, `fused_qkv.py`, `kv_cache.py`) are exported by
`gpushape.kernels`.
"""
