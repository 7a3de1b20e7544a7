"""Fused Triton kernels, one op per file, each registered as a torch.library custom op."""

from .attention.fused_qkv import FusedQKV as FusedQKV
from .attention.kv_cache import KVCache as KVCache
from .attention.softmax_dropout import SoftmaxDropout as SoftmaxDropout
from .attention.softmax_dropout import softmax_dropout as softmax_dropout
from .batch_norm.batch_norm_act import BatchNormAct2d as BatchNormAct2d
from .batch_norm.batch_norm_act import batch_norm_act as batch_norm_act
from .grn.grn import GlobalResponseNorm as GlobalResponseNorm
from .grn.grn import global_response_norm as global_response_norm
from .group_norm.group_norm import GroupNormAct as GroupNormAct
from .group_norm.group_norm import group_norm_act as group_norm_act
from .norms.add_layer_norm import AddLayerNorm as AddLayerNorm
from .norms.add_layer_norm import add_layer_norm as add_layer_norm
from .norms.dropout_add_layer_norm import dropout_add_layer_norm as dropout_add_layer_norm
from .norms.layer_norm_gelu import LayerNormGELU as LayerNormGELU
from .norms.layer_norm_gelu import layer_norm_gelu as layer_norm_gelu
from .norms.rms_norm import RMSNorm as RMSNorm
from .norms.rms_norm import rms_norm as rms_norm
from .pooling.avg_pool import LayoutSafeAvgPool2d as LayoutSafeAvgPool2d
from .pooling.max_pool import MaxPool2d as MaxPool2d
from .pooling.max_pool import max_pool2d as max_pool2d
