"""pad-channels: misaligned output sizes padded with zero rows and sliced back; same function,
same gradients, tied weights still tied, original state_dict, reversible, idempotent, refused
where unsafe."""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpushape.hardware import get_gpu
from gpushape.transforms import TransformContext, applied, get_transform, optimize, revert
from gpushape.transforms._core import remember
from gpushape.transforms.pad_channels import PaddedConv2d, PaddedEmbedding, PaddedLinear

PAD = ["pad-channels"]
VOCAB, WIDTH = 1001, 64


class TinyLM(nn.Module):
    """Token embedding tied to the lm_head, an MLP whose hidden size (100) misses 8."""

    def __init__(self, vocab: int = VOCAB, width: int = WIDTH):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.up = nn.Linear(width, 100)
        self.down = nn.Linear(100, width)
        self.norm = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        h = h + self.down(F.gelu(self.up(h)))
        return self.lm_head(self.norm(h))


class ConvNet63(nn.Module):
    """A conv with 63 output channels into BatchNorm, a conv reading them, a 10-class head."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 63, 3, padding=1)
        self.bn = nn.BatchNorm2d(63)
        self.conv2 = nn.Conv2d(63, 32, 3, padding=1, bias=False)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn(self.conv1(x)))
        return self.head(F.relu(self.conv2(x)).mean((2, 3)))


def _ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(seed))


def _images() -> torch.Tensor:
    return torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))


def _lm() -> TinyLM:
    torch.manual_seed(0)
    return TinyLM()


def _optimize(model: nn.Module, inputs, **options):
    return optimize(model, inputs, gpu="h200", dtype=torch.float32, transforms=PAD, **options)


def _apply(model: nn.Module, inputs, **options):
    """The transform alone (no audit, no numeric check)."""
    ctx = TransformContext(example_inputs=inputs, gpu=get_gpu("h200"), **options)
    outcome = get_transform("pad-channels").apply(model, ctx)
    root = outcome.root or model
    remember(root, outcome.changes)
    return root, outcome


def _shapes(state: dict) -> dict:
    return {k: tuple(v.shape) for k, v in state.items()}


@pytest.fixture(scope="module")
def lm():
    """TinyLM optimized once: (original copy, optimized model, report)."""
    model = _lm()
    original = copy.deepcopy(model)
    padded, report = _optimize(model, (_ids(),))
    return original, padded, report


# ---- the language model --------------------------------------------------------------------
def test_lm_padded_and_verified(lm):
    original, model, report = lm
    assert report.verified["pad-channels"].passed and not report.rolled_back
    assert sorted(c.module for c in report.applied) == ["embed", "lm_head", "up"]
    assert type(model.lm_head) is PaddedLinear and type(model.embed) is PaddedEmbedding
    assert type(model.up) is PaddedLinear and type(model.down) is nn.Linear  # K not padded
    assert model.lm_head.weight.shape == (1008, WIDTH) and model.up.weight.shape == (104, WIDTH)
    assert model.up.bias.shape == (104,)
    assert all("create the optimizer after optimize()" in c.detail for c in report.applied)
    ids = _ids(1)
    with torch.no_grad():
        out, ref = model(ids), original(ids)
    assert out.shape == ref.shape == (2, 16, VOCAB)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_lm_tied_weight_is_one_padded_parameter(lm):
    _, model, _ = lm
    assert model.lm_head.weight is model.embed.weight
    assert len(list(model.parameters())) == len(list(_lm().parameters()))
    assert torch.count_nonzero(model.lm_head.weight[VOCAB:]) == 0
    assert model.lm_head.out_features == model.embed.num_embeddings == VOCAB


def test_lm_state_dict_keeps_original_keys_and_shapes(lm):
    original, model, _ = lm
    state = model.state_dict()
    assert list(state) == list(original.state_dict())
    assert _shapes(state) == _shapes(original.state_dict())
    torch.testing.assert_close(state["lm_head.weight"], model.lm_head.weight[:VOCAB].detach())


def test_original_checkpoint_loads_strict_into_the_padded_model(lm):
    original, model, _ = lm
    model = copy.deepcopy(model)
    trained = copy.deepcopy(original)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(1.0)
    model.load_state_dict(trained.state_dict(), strict=True)
    assert model.lm_head.weight is model.embed.weight and model.lm_head.weight.shape[0] == 1008
    assert torch.count_nonzero(model.lm_head.weight[VOCAB:]) == 0
    assert torch.count_nonzero(model.up.bias[100:]) == 0
    ids = _ids(2)
    with torch.no_grad():
        torch.testing.assert_close(model(ids), trained(ids), rtol=1e-5, atol=1e-5)


def test_padded_checkpoint_round_trips_into_a_fresh_original(lm):
    _, model, _ = lm
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    fresh = TinyLM()
    fresh.load_state_dict(torch.load(buffer), strict=True)
    ids = _ids(3)
    with torch.no_grad():
        torch.testing.assert_close(fresh(ids), model(ids), rtol=1e-5, atol=1e-5)
    assert fresh.lm_head.weight is fresh.embed.weight


def test_gradients_of_padded_rows_are_zero_and_the_rest_match(lm):
    original, model, _ = lm
    model, original = copy.deepcopy(model), copy.deepcopy(original)
    ids = _ids(4)
    for m in (model, original):
        F.cross_entropy(m(ids).reshape(-1, VOCAB), _ids(5).reshape(-1)).backward()
    for (name, p), q in zip(model.named_parameters(), original.parameters(), strict=True):
        rows = q.shape[0]
        torch.testing.assert_close(p.grad[:rows], q.grad, rtol=1e-5, atol=1e-6, msg=name)
        assert torch.count_nonzero(p.grad[rows:]) == 0, name


def test_sgd_tracks_the_unpadded_model():
    """Optimizer made after optimize(): the same losses step by step; padded rows stay zero
    under momentum and weight decay."""
    model = _lm()
    original = copy.deepcopy(model)
    model, _ = _optimize(model, (_ids(),))
    losses = {}
    for key, m in (("padded", model), ("original", original)):
        opt = torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.9, weight_decay=1e-2)
        losses[key] = []
        for step in range(5):
            ids, targets = _ids(10 + step), _ids(20 + step)
            loss = F.cross_entropy(m(ids).reshape(-1, VOCAB), targets.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[key].append(loss.item())
    assert losses["padded"] == pytest.approx(losses["original"], rel=1e-5)
    assert losses["padded"][-1] < losses["padded"][0]
    assert torch.count_nonzero(model.lm_head.weight[VOCAB:]) == 0
    assert torch.count_nonzero(model.up.weight[100:]) == 0


def test_revert_restores_modules_and_parameters_with_trained_values():
    model = _lm()
    modules = dict(model.named_modules())
    params = dict(model.named_parameters(remove_duplicate=False))
    model, _ = _optimize(model, (_ids(),))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    F.cross_entropy(model(_ids()).reshape(-1, VOCAB), _ids(5).reshape(-1)).backward()
    opt.step()
    trained = {k: v.detach()[: params[k].shape[0]].clone() for k, v in model.state_dict().items()}
    restored = revert(model)
    assert restored is model and applied(model) == []
    assert all(restored.get_submodule(k) is m for k, m in modules.items() if k)
    now = dict(restored.named_parameters(remove_duplicate=False))
    assert all(now[k] is p for k, p in params.items())
    assert restored.lm_head.weight is restored.embed.weight
    for k, v in restored.state_dict().items():
        torch.testing.assert_close(v, trained[k], rtol=0, atol=0)
    assert _shapes(restored.state_dict()) == _shapes(_lm().state_dict())


def test_twice_equals_once(lm):
    _, model, _ = lm
    model = copy.deepcopy(model)
    _, outcome = _apply(model, (_ids(),))
    assert outcome.changes == [] and outcome.refusals == []
    _, report = _optimize(model, (_ids(),))
    assert report.applied == []


def test_filter_fn():
    model = _lm()
    _, outcome = _apply(model, (_ids(),), filter_fn=lambda m, fqn: fqn != "up")
    assert sorted(c.module for c in outcome.changes) == ["embed", "lm_head"]
    assert type(model.up) is nn.Linear
    model = _lm()
    _, outcome = _apply(model, (_ids(),), filter_fn=lambda m, fqn: fqn != "embed")
    assert [c.module for c in outcome.changes] == ["up"]
    (refusal,) = outcome.refusals
    assert refusal.module == "lm_head" and "filter_fn excludes" in refusal.reason


# ---- the conv net --------------------------------------------------------------------------
def test_convnet_padded_and_verified():
    torch.manual_seed(0)
    model = ConvNet63()
    original = copy.deepcopy(model)
    model, report = _optimize(model, (_images(),))
    assert report.verified["pad-channels"].passed and not report.rolled_back
    assert sorted(c.module for c in report.applied) == ["conv1", "head"]
    assert type(model.conv1) is PaddedConv2d and model.conv1.weight.shape == (64, 3, 3, 3)
    assert type(model.conv2) is nn.Conv2d  # 63 input channels: K, not padded
    assert model.conv1.out_channels == 63 and model.conv1.bias.shape == (64,)
    x = _images()
    with torch.no_grad():
        assert model.conv1(x).shape == original.conv1(x).shape == (2, 63, 8, 8)
        torch.testing.assert_close(model(x), original(x), rtol=1e-5, atol=1e-5)
    assert _shapes(model.state_dict()) == _shapes(original.state_dict())
    fresh = ConvNet63()
    fresh.load_state_dict(model.state_dict(), strict=True)
    model.load_state_dict(original.state_dict(), strict=True)
    revert(model)
    assert type(model.conv1) is nn.Conv2d and model.conv1.weight.shape == (63, 3, 3, 3)


def test_a_channels_last_weight_stays_channels_last():
    model = nn.Sequential(nn.Conv2d(8, 63, 3)).to(memory_format=torch.channels_last)
    _apply(model, (torch.randn(1, 8, 6, 6),))
    assert model[0].weight.shape == (64, 8, 3, 3)
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)


def test_padded_conv_in_channels_last_and_unbatched():
    conv = PaddedConv2d(3, 63, 3, padding=1)
    conv.weight = nn.Parameter(
        torch.randn(64, 3, 3, 3).contiguous(memory_format=torch.channels_last)
    )
    conv.bias = nn.Parameter(torch.randn(64))
    x = torch.randn(3, 8, 8)
    assert conv(x).shape == (63, 8, 8)
    assert conv(x[None].contiguous(memory_format=torch.channels_last)).shape == (1, 63, 8, 8)


# ---- refusals ------------------------------------------------------------------------------
class QuantLinear(nn.Linear):
    """Stands in for a quantized or adapter Linear: a subclass with its own forward."""


class LoraLinear(nn.Module):
    """peft's shape: the wrapped Linear held as `base_layer`, the adapters beside it."""

    def __init__(self, base: nn.Linear, rank: int = 4):
        super().__init__()
        self.base_layer = base
        self.lora_A = nn.Linear(base.in_features, rank, bias=False)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False)

    def forward(self, x):
        return self.base_layer(x) + self.lora_B(self.lora_A(x))


def _refusals(model: nn.Module, inputs) -> dict[str, str]:
    _, outcome = _apply(model, inputs)
    return {r.module: r.reason for r in outcome.refusals}


def test_refused_with_the_reason():
    shared = nn.Sequential(nn.Linear(16, 100), nn.Linear(16, 100))
    shared[1].weight = shared[0].weight
    assert "shared with 1 (Linear)" in _refusals(shared, (torch.randn(2, 16),))["0"]
    hooked = nn.Sequential(nn.Linear(16, 100))
    hooked[0].register_forward_hook(lambda m, i, o: None)
    assert "hook" in _refusals(hooked, (torch.randn(2, 16),))["0"]
    subclass = nn.Sequential(QuantLinear(16, 100))
    assert "not a plain nn.Linear" in _refusals(subclass, (torch.randn(2, 16),))["0"]
    lora = nn.Sequential(LoraLinear(nn.Linear(16, 100)))
    assert "wrapped by a LoraLinear" in _refusals(lora, (torch.randn(2, 16),))["0.base_layer"]
    convs = nn.Sequential(nn.Conv2d(8, 36, 3, groups=2), nn.Conv2d(36, 3, 1))
    reasons = _refusals(convs, (torch.randn(1, 8, 6, 6),))
    assert "grouped convolution" in reasons["0"] and "fewer than 8" in reasons["1"]
    for model in (shared, hooked, subclass, lora, convs):
        assert not any(isinstance(m, (PaddedLinear, PaddedConv2d)) for m in model.modules())


def test_tied_to_a_hooked_embedding_is_refused():
    model = _lm()
    model.embed.register_forward_pre_hook(lambda m, i: None)
    assert "which has a hook" in _refusals(model, (_ids(),))["lm_head"]
    assert type(model.lm_head) is nn.Linear and model.lm_head.weight is model.embed.weight
    assert type(model.embed) is nn.Embedding and type(model.up) is PaddedLinear


def test_aligned_model_is_left_alone():
    model = nn.Sequential(nn.Linear(64, 128), nn.Conv2d(8, 16, 1))
    _, outcome = _apply(model, (torch.randn(2, 64),))
    assert outcome.changes == [] and outcome.refusals == []


# ---- Hugging Face GPT-2 --------------------------------------------------------------------
def test_hf_gpt2_tied_lm_head(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    original = copy.deepcopy(model)
    ids = _ids()
    model, report = _optimize(model, (ids,))
    assert report.verified["pad-channels"].passed and not report.rolled_back
    assert sorted(c.module for c in report.applied) == ["lm_head", "transformer.wte"]
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.lm_head.weight.shape == (1008, 64) and model.config.vocab_size == VOCAB
    with torch.no_grad():
        out, ref = model(ids, labels=ids), original(ids, labels=ids)
    assert out.logits.shape == ref.logits.shape == (2, 16, VOCAB)
    assert torch.isfinite(out.loss) and out.loss.item() == pytest.approx(ref.loss.item(), rel=1e-5)
    model.save_pretrained(tmp_path)
    fresh = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    assert fresh.lm_head.weight.shape == (VOCAB, 64)
    with torch.no_grad():
        torch.testing.assert_close(fresh(ids).logits, out.logits, rtol=1e-5, atol=1e-5)
