"""Small networks written the way users write them, for the transform tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Bottleneck(nn.Module):
    """torchvision's pattern: one ReLU module called three times, `out += identity`."""

    def __init__(self, c: int = 16):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.conv3 = nn.Conv2d(c, c, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += identity
        return self.relu(out)


class DownsampleLast(Bottleneck):
    """torchvision's order: the shortcut's projection runs after the main branch's last BN."""

    def __init__(self, c: int = 16):
        super().__init__(c)
        self.downsample = nn.Sequential(nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ConvNet(nn.Module):
    """A stem (BN -> F.relu) and two bottlenecks (the second with a projection shortcut computed
    last, as torchvision does): seven BN+ReLU sites, two with a residual."""

    def __init__(self, c: int = 16, classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.blocks = nn.Sequential(Bottleneck(c), DownsampleLast(c))
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        return self.head(self.blocks(x).mean((2, 3)))


class TwoUsers(nn.Module):
    """BatchNorm's output feeds the ReLU and the sum: fusing would lose what the sum reads."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        y = self.bn(self.conv(x))
        return torch.relu(y) + y


class DataDependent(nn.Module):
    """Control flow on values: torch.fx cannot trace it."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        y = self.bn(x)
        return y.relu() if y.sum() > 0 else y


class MLPBlock(nn.Module):
    """A transformer MLP: LayerNorm -> GELU (tanh) -> Linear."""

    def __init__(self, d: int = 32):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.act = nn.GELU(approximate="tanh")
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(self.act(self.norm(x)))


def tiny_gpt2(layers: int = 2, attn: str = "sdpa"):
    """A Hugging Face GPT-2 small enough for the CPU (vocabulary 128, width 64, 64 positions);
    the caller skips when transformers is missing."""
    import transformers

    config = transformers.GPT2Config(
        n_layer=layers,
        n_embd=64,
        n_head=2,
        vocab_size=128,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    config._attn_implementation = attn
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def _heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, T, heads * d) -> (B, heads, T, d)."""
    b, n, width = t.shape
    return t.view(b, n, heads, width // heads).transpose(1, 2)


class BertStyleLayer(nn.Module):
    """A BERT layer written by hand: separate query/key/value Linear layers, softmax(QK^T)V
    written out, LayerNorm after each residual."""

    def __init__(self, d: int = 64, heads: int = 4, hidden: int = 128):
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.out = nn.Linear(d, d)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.up, self.down = nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x):
        q, k, v = (_heads(p(x), self.heads) for p in (self.query, self.key, self.value))
        scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
        a = (scores.softmax(-1) @ v).transpose(1, 2).flatten(2)
        x = self.norm1(x + self.out(a))
        return self.norm2(x + self.down(F.gelu(self.up(x))))


class GQABlock(nn.Module):
    """A LLaMA decoder block flattened into one module: RMSNorm, grouped-query attention (8 query
    heads, 2 key/value heads), RMSNorm, SiLU-gated MLP (gate/up/down)."""

    def __init__(self, d: int = 64, heads: int = 8, kv_heads: int = 2, hidden: int = 128):
        super().__init__()
        self.heads, self.kv_heads, kv = heads, kv_heads, d // heads * kv_heads
        self.norm1, self.norm2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.q_proj, self.o_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.k_proj, self.v_proj = nn.Linear(d, kv, bias=False), nn.Linear(d, kv, bias=False)
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        h = self.norm1(x)
        q = _heads(self.q_proj(h), self.heads)
        rep = self.heads // self.kv_heads
        k = _heads(self.k_proj(h), self.kv_heads).repeat_interleave(rep, 1)
        v = _heads(self.v_proj(h), self.kv_heads).repeat_interleave(rep, 1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(a.transpose(1, 2).flatten(2))
        h = self.norm2(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class CrossAttention(nn.Module):
    """Queries from the decoder, keys and values from the encoder's memory."""

    def __init__(self, d: int = 64, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.out = nn.Linear(d, d)

    def forward(self, x, memory):
        q = _heads(self.q(x), self.heads)
        k, v = _heads(self.k(memory), self.heads), _heads(self.v(memory), self.heads)
        return self.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))


def tiny_bert(layers: int = 2):
    """A Hugging Face BERT for the CPU (width 64, 4 heads, vocabulary 128), dropout off."""
    import transformers

    config = transformers.BertConfig(
        num_hidden_layers=layers,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    return transformers.BertModel(config)


def tiny_llama(layers: int = 2):
    """A Hugging Face LLaMA for the CPU with grouped-query attention (8 query heads, 2 key/value
    heads, head size 8) and a gated MLP of 128."""
    import transformers

    config = transformers.LlamaConfig(
        num_hidden_layers=layers,
        hidden_size=64,
        num_attention_heads=8,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=128,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def autograd_node_names(out: torch.Tensor) -> list[str]:
    """The type names of every node in `out`'s autograd graph."""
    seen, todo = set(), [out.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and node not in seen:
            seen.add(node)
            todo += [n for n, _ in node.next_functions]
    return [type(n).__name__ for n in seen]
