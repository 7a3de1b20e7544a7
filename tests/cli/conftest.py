"""Small user models for the CLI tests, written into a temporary folder."""

from __future__ import annotations

import textwrap

import pytest

NETS = textwrap.dedent("""
    import sys

    import torch
    from torch import nn


    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.fc = nn.Linear(8, 10)

        def forward(self, x):
            return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))


    class Tokens(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(100, 32)
            self.head = nn.Linear(32, 100)

        def forward(self, ids):
            return self.head(self.embed(ids))


    class Bracketed(nn.Module):
        def __init__(self):
            super().__init__()
            self.add_module("[red]x", nn.Linear(64, 64))

        def forward(self, x):
            return getattr(self, "[red]x")(x)


    def tiny(batch=2):
        return Tiny(), (torch.randn(batch, 3, 8, 8),)


    def tokens():
        return Tokens(), (torch.zeros(2, 16, dtype=torch.long),)


    class Vocab(nn.Module):  # a BERT-sized vocabulary: its head's GEMM sets the pace
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(30522, 768)
            self.head = nn.Linear(768, 30522)

        def forward(self, ids):
            return self.head(self.embed(ids))


    def vocab():
        return Vocab(), (torch.zeros(16, 512, dtype=torch.long),)


    def bracketed():
        return Bracketed(), (torch.randn(4, 64),)


    def exits():
        sys.exit(3)


    def broken():
        raise ValueError("no width given")
""")


@pytest.fixture
def nets(tmp_path) -> str:
    """Path of a file of factories: tiny, tokens, vocab, bracketed, exits, broken."""
    path = tmp_path / "nets.py"
    path.write_text(NETS)
    return str(path)
