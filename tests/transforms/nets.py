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
