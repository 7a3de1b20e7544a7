"""Fused Triton kernels, one op per file, each registered as a torch.library custom op."""

from .add_layer_norm import AddLayerNorm as AddLayerNorm
from .add_layer_norm import add_layer_norm as add_layer_norm
from .batch_norm_act import BatchNormAct2d as BatchNormAct2d
from .batch_norm_act import batch_norm_act as batch_norm_act
from .fused_qkv import FusedQKV as FusedQKV
from .kv_cache import KVCache as KVCache
from .layer_norm_gelu import LayerNormGELU as LayerNormGELU
from .layer_norm_gelu import layer_norm_gelu as layer_norm_gelu
from .rms_norm import RMSNorm as RMSNorm
from .rms_norm import rms_norm as rms_norm
from .softmax_dropout import SoftmaxDropout as SoftmaxDropout
from .softmax_dropout import softmax_dropout as softmax_dropout
