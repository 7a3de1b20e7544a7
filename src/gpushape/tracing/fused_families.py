"""gpushape's own fused kernels as memory families: the rates `gpushape probe` measures for
them price a fusion rule's fix (`FUSED`), and an optimized model's trace, which records their
custom ops, prices those ops the same way (`KERNEL_FAMILIES`). Re-exported by families.py."""

from __future__ import annotations

# gpushape's own fused kernels, which the audit's fusion rules propose: what they reach prices
# a fix's kernel (`AuditContext.fusion_saving_s`), not a traced op.
FUSED = (
    "fused_norm_act",
    "fused_batch_norm_act",
    "fused_softmax_dropout",
    "fused_max_pool",
    "fused_dropout_add_norm",  # no rule proposes it yet: its fix is applied by name
    "fused_grn",
    "fused_group_norm",
)
# ... and the same kernels where a model already runs them (an optimized model's trace records
# their custom ops, one op a pass, as torch.compile and CUDA graphs see them).
KERNEL_FAMILIES = {
    "gpushape.layer_norm_gelu": "fused_norm_act",
    "gpushape.layer_norm_gelu_backward": "fused_norm_act",
    "gpushape.add_layer_norm": "fused_norm_act",
    "gpushape.add_layer_norm_backward": "fused_norm_act",
    "gpushape.dropout_add_layer_norm": "fused_dropout_add_norm",
    "gpushape.dropout_add_layer_norm_backward": "fused_dropout_add_norm",
    "gpushape.rms_norm": "fused_norm_act",
    "gpushape.rms_norm_backward": "fused_norm_act",
    "gpushape.batch_norm_stats": "fused_batch_norm_act",
    "gpushape.batch_norm_act_apply": "fused_batch_norm_act",
    "gpushape.batch_norm_act_backward": "fused_batch_norm_act",
    "gpushape.softmax_dropout_fwd": "fused_softmax_dropout",
    "gpushape.softmax_dropout_bwd": "fused_softmax_dropout",
    "gpushape.max_pool2d": "fused_max_pool",
    "gpushape.max_pool2d_backward": "fused_max_pool",
    "gpushape.global_response_norm": "fused_grn",
    "gpushape.global_response_norm_backward": "fused_grn",
    "gpushape.group_norm_act": "fused_group_norm",
    "gpushape.group_norm_act_backward": "fused_group_norm",
}
