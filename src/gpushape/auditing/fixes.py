"""The transforms a finding can name as its fix, each with one line saying what it does.

`gpushape.transforms` registers a transform under the same id (`gpushape optimize` applies
them); ids without one yet are reported as such by optimize, so reports and CI gates built on
the JSON keep working as transforms land. A rule may only name an id listed here (a test checks).
"""

from __future__ import annotations

FIXES: dict[str, str] = {
    "pad-channels": "pad a layer's channels / features to the tensor-core granularity "
    "(zero weights, output sliced back)",
    "pad-head-dim": "pad the attention head size to what the fused SDPA kernels take (zero "
    "q/k/v columns per head, output sliced back)",
    "channels-last": "convert the model and its inputs to channels_last (NHWC) memory format",
    "autocast-bf16": "run matmuls and convolutions in bf16 under autocast (fp16 where the chip "
    "has no bf16), or enable TF32",
    "fuse-norm-act": "replace a normalization and the elementwise ops after it with one fused "
    "kernel (gpushape.kernels)",
    "fuse-qkv": "merge projections that read the same input into one Linear (state_dict kept)",
    "sdpa": "replace hand-written softmax(QK^T)V with F.scaled_dot_product_attention",
    "skip-attention-mask": "pass SDPA no attention mask where the model is given no padding "
    "mask, also under torch.compile and CUDA graph capture (Hugging Face models)",
    "fuse-activation": "replace an activation written as several elementwise ops (the tanh GELU "
    "formula, x * sigmoid(x)) with PyTorch's one-kernel function",
    "fuse-dropout-add-norm": "replace dropout, the residual add and LayerNorm after a block's "
    "output projection with one fused kernel that regenerates the mask in backward "
    "(gpushape.kernels.dropout_add_layer_norm; Hugging Face BERT-style blocks)",
    "fuse-softmax-dropout": "replace softmax followed by dropout with one fused kernel that "
    "regenerates the mask in backward (gpushape.kernels.softmax_dropout)",
    "no-kv-cache": "run a Hugging Face decoder's training forwards without the key/value cache "
    "they fill and never read (evaluation and generation keep it; config untouched)",
    "masked-lm-head": "compute a masked LM's head and its loss only on a fixed quarter of the "
    "positions, those that carry a label first (the logits then hold those rows)",
    "fast-max-pool": "replace nn.MaxPool2d with gpushape's max-pool kernel, whose backward reads "
    "a 1-byte window position instead of PyTorch's int64 index (gpushape.kernels.MaxPool2d)",
    "safe-avg-pool": "take a padded nn.AvgPool2d's input gradient for channels_last CUDA "
    "tensors from PyTorch's NCHW backward where its NHWC one is wrong (pytorch#188344; "
    "gpushape.kernels.LayoutSafeAvgPool2d): a correctness guard optimize applies unasked "
    "where a check on the device finds the bug",
    "fuse-grn": "replace a global response norm (ConvNeXt-V2's GRN, timm or Hugging Face) with "
    "gpushape's kernels: 3 passes over the tensor forward and 5 backward (same Parameters)",
    "fuse-group-norm": "replace group norms (nn.GroupNorm, timm's GroupNorm, GroupNorm1 and "
    "GroupNormAct) with gpushape's kernels, which use every SM, folding in an activation that "
    "only reads the norm's output (same Parameters)",
    "s2d-stem": "compute a strided convolution on few input channels (an RGB stem) as a "
    "stride-1 convolution over its input folded into the channels (space-to-depth; same "
    "Parameters)",
    "fold-conv-bias": "drop a convolution's bias that the following BatchNorm cancels",
    "graph-layers": "replay each repeated layer's forward and backward from CUDA graphs while "
    "the training loop stays eager (kept by optimize where a timed step says it pays)",
    "cuda-graphs": "capture the step in a CUDA graph (or torch.compile mode='reduce-overhead')",
    "fused-optimizer": "construct the optimizer with fused=True (or foreach=True where no fused "
    "implementation exists)",
    "dataloader-workers": "give the DataLoader worker processes, pinned memory and persistent "
    "workers",
    "activation-checkpoint": "recompute cheap modules' activations in backward instead of "
    "storing them",
}


def describe(fix: str | None) -> str:
    return FIXES.get(fix, "") if fix else ""
