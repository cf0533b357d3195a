"""decayify: decayed shortcuts in timm ViTs, torchvision ResNets and resdecay blocks, by composition."""

import copy

import pytest
import timm
import torch
import torchvision

from resdecay import alpha_schedule, alphas_of, decayify
from resdecay.nn.blocks import Block
from resdecay.nn.decayify import ShortcutScale


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(0)
    return timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=10).eval()


@pytest.fixture(scope="module")
def resnet():
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10).eval()


@pytest.mark.parametrize("which", ["vit", "resnet"])
def test_alpha_one_is_exactly_the_original_model(which, request):
    model = request.getfixturevalue(which)
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(x)
        keys = list(model.state_dict())
        d = decayify(copy.deepcopy(model), alpha_min=1.0)
        assert torch.equal(d(x), before)
    assert list(d.state_dict()) == keys
    d.load_state_dict(model.state_dict(), strict=True)  # pretrained weights load without missing/unexpected keys
    assert d.resdecay_spec == {"alpha_min": 1.0, "schedule": "linear", "branches": "both"}


def test_timm_vit_decay_is_alpha_x_plus_branch(vit):
    d = decayify(copy.deepcopy(vit), alpha_min=0.7)
    table = alphas_of(d)
    assert len(table) == 12 and table[0][0] == "blocks.0"
    assert torch.allclose(torch.tensor([a for _, a in table], dtype=torch.float64), alpha_schedule(12, 0.7))
    blk = d.blocks[5]
    a_attn, a_mlp = table[5][1]
    x = torch.randn(2, 197, 384)
    with torch.no_grad():
        h = a_attn * x + blk.attn(blk.norm1(x))
        expected = a_mlp * h + blk.mlp(blk.norm2(h))
        assert torch.allclose(blk(x), expected, atol=1e-5)
    assert list(d.state_dict()) == list(vit.state_dict())


def test_timm_zero_init_maps_x_to_product_of_alphas(vit):
    d = decayify(copy.deepcopy(vit), alpha_min=0.6, zero_init=True)
    a_attn, a_mlp = alphas_of(d)[-1][1]
    x = torch.randn(1, 197, 384)
    with torch.no_grad():
        assert torch.allclose(d.blocks[-1](x), a_attn * a_mlp * x, atol=1e-6)


def test_resnet_scales_identity_and_downsample_paths(resnet):
    d = decayify(copy.deepcopy(resnet), alpha_min=0.5)
    table = alphas_of(d)
    assert [n for n, _ in table] == [f"layer{i}.{j}" for i in range(1, 5) for j in range(2)]
    assert torch.allclose(torch.tensor([a[0] for _, a in table], dtype=torch.float64),
                          alpha_schedule(8, 0.5, adds_per_block=1)[:, 0])
    plain_block, ds_block = d.layer1[1], d.layer2[0]  # identity path / downsample path
    assert isinstance(plain_block.downsample, ShortcutScale) and not isinstance(ds_block.downsample, ShortcutScale)
    x = torch.randn(2, 64, 16, 16)
    with torch.no_grad():
        for blk, a, ref in ((plain_block, table[1][1][0], resnet.layer1[1]), (ds_block, table[2][1][0], resnet.layer2[0])):
            branch = ref.bn2(ref.conv2(ref.relu(ref.bn1(ref.conv1(x)))))
            identity = ref.downsample(x) if ref.downsample is not None else x
            assert torch.allclose(blk(x), torch.relu(branch + a * identity), atol=1e-5)
    assert list(d.state_dict()) == list(resnet.state_dict())
    # decayify again: settings are replaced, not stacked
    again = decayify(d, alpha_min=1.0)
    with torch.no_grad():
        assert torch.equal(again.layer2[0](x), resnet.layer2[0](x))


def test_branches_and_resdecay_blocks():
    model = torch.nn.Sequential(*[Block(16, 2) for _ in range(3)])
    decayify(model, alpha_min=0.5, branches="mlp")
    assert [a for _, a in alphas_of(model)] == [tuple(r) for r in alpha_schedule(3, 0.5, branches="mlp").tolist()]
    assert all(a[0] == 1.0 for _, a in alphas_of(model)) and model[2].alpha_mlp == 0.5


def test_unsupported_models_get_one_clear_error(resnet):
    with pytest.raises(TypeError, match="no supported residual block in Linear; supported kinds: docs/coverage.md"):
        decayify(torch.nn.Linear(3, 3), 0.6)
    with pytest.raises(ValueError, match="one residual add"):
        decayify(copy.deepcopy(resnet), 0.6, branches="attn")
    with pytest.raises(ValueError, match="alpha_min must lie in"):
        decayify(copy.deepcopy(resnet), 1.5)
