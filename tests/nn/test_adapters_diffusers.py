"""decayify on diffusers' MM-DiTs (SD3, SD3.5, Flux) and U-Nets (UNet2DModel, UNet2DConditionModel)
(tests/helpers/adapter_models_diffusers.py). Tests a and c of the one-add-count models run in tests/nn/test_adapters.py;
here: (a) and (c) of the mixed-add models, the replaced forwards at alpha 1 bit for bit, (b) each block kind against
its hand-written adds on the library's own (hook-free) modules, both readings of the two keywords
(``context_stream``, ``unet_depth``), (d) no new graph break and (e) threads that do not mix."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import adapter_checks as shared  # checks d and e of tests/nn/test_adapters.py, run here on these models
from helpers import adapter_models_diffusers as dm
from helpers.adapter_models import from_threads
from resdecay import alpha_schedule, alphas_of, decayify
from resdecay.nn.adapters import diffusers_blocks, diffusers_mmdit, diffusers_unet, hooks
from resdecay.nn.decayify import block_factors, residual_blocks
from resdecay.nn.residual import ShortcutScale

SD3, UNET = list(dm.MODELS_DIFFUSERS)
SD35, FLUX, UNETC = list(dm.MIXED_DIFFUSERS)


def build(name):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the libraries' own deprecation notes
        return {**dm.MODELS_DIFFUSERS, **dm.MIXED_DIFFUSERS}[name][0]()


def flat(model):
    return [a for _, alphas in alphas_of(model) for a in alphas]


def rand(*shape, seed=4):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- (a), (c) of the mixed-add models
@pytest.mark.parametrize("name", list(dm.MIXED_DIFFUSERS))
@pytest.mark.covers("a", *dm.MIXED_DIFFUSERS)
@pytest.mark.covers("c", *dm.MIXED_DIFFUSERS)
def test_mixed_models_alpha_one_is_the_library_and_the_table_is_one_schedule_over_the_adds(name):
    model, call = build(name)
    keys = list(model.state_dict())
    with torch.no_grad():
        before = call(model)
        assert torch.equal(call(decayify(copy.deepcopy(model), alpha_min=1.0)), before)
        decayed = decayify(copy.deepcopy(model), alpha_min=0.4)
        assert not torch.allclose(call(decayed), before)
    assert list(decayed.state_dict()) == keys
    decayed.load_state_dict(model.state_dict(), strict=True)
    assert len({len(a) for _, a in alphas_of(decayed)}) == 2  # mixed add counts, one schedule over every add
    assert torch.allclose(torch.tensor(flat(decayed), dtype=torch.float64),
                          alpha_schedule(len(flat(decayed)), 0.4, adds_per_block=1).flatten())


FORWARDS = {"JointTransformerBlock": diffusers_mmdit.joint_block_forward,
            "FluxTransformerBlock": diffusers_mmdit.flux_double_forward,
            "FluxSingleTransformerBlock": diffusers_mmdit.flux_single_forward,
            "Attention": diffusers_unet.residual_attention_forward,
            "BasicTransformerBlock": diffusers_blocks.basic_block_forward}


@pytest.mark.parametrize("stream", ["decay", "plain"])
@pytest.mark.parametrize("name", [SD3, SD35, FLUX, UNET, UNETC])
def test_replaced_forwards_at_alpha_one_are_the_library_bit_for_bit(name, stream):
    """decayify installs nothing at alpha 1; here every replaced forward is installed at alpha 1 by hand (each
    context_stream reading), and the whole model's output is the library's, bit for bit."""
    model, call = build(name)
    with torch.no_grad():
        want = call(model)
        n = 0
        for _, block, _ in residual_blocks(model):
            fwd = FORWARDS.get(type(block).__name__)
            if fwd is not None:
                adds = len(block_factors(block)[0])
                hooks.replace_forward(block, fwd, (1.0,) * adds, (1.0,) * adds)
                block.__dict__["resdecay_options"] = {"context_stream": stream}
                n += 1
        assert n >= 2 and torch.equal(call(model), want)


# ----------------------------------------------------------------------------- (b) the MM-DiT blocks by hand
def _sd3_image(b, x, temb, h_attn, alphas):
    """The image stream's adds of a JointTransformerBlock (attention, SD3.5's attn2, feed-forward)."""
    mod = b.norm1(x, emb=temb)
    h, g_msa, sh_mlp, sc_mlp, g_mlp = mod[:5]
    x = alphas[0] * x + g_msa.unsqueeze(1) * h_attn
    if b.use_dual_attention:
        x = alphas[1] * x + mod[6].unsqueeze(1) * b.attn2(hidden_states=mod[5])
    return alphas[-1] * x + g_mlp.unsqueeze(1) * b.ff(b.norm2(x) * (1 + sc_mlp[:, None]) + sh_mlp[:, None])


def _context(b, c, c_mod, c_attn, a1, a2):
    """The context stream's attention and feed-forward adds (SD3 and Flux double blocks)."""
    _, g_msa, sh_mlp, sc_mlp, g_mlp = c_mod
    c = a1 * c + g_msa.unsqueeze(1) * c_attn
    return a2 * c + g_mlp.unsqueeze(1) * b.ff_context(b.norm2_context(c) * (1 + sc_mlp[:, None]) + sh_mlp[:, None])


def _sd3_block(b, x, c, temb, alphas, context_alphas):
    h = b.norm1(x, emb=temb)[0]
    if b.context_pre_only:
        attn, _ = b.attn(hidden_states=h, encoder_hidden_states=b.norm1_context(c, temb))
        return None, _sd3_image(b, x, temb, attn, alphas)
    c_mod = b.norm1_context(c, emb=temb)
    attn, c_attn = b.attn(hidden_states=h, encoder_hidden_states=c_mod[0])
    return _context(b, c, c_mod, c_attn, *context_alphas), _sd3_image(b, x, temb, attn, alphas)


@pytest.mark.covers("b", SD3, SD35)
@pytest.mark.parametrize("stream", ["decay", "plain"])
@pytest.mark.parametrize("name, path", [(SD3, "transformer_blocks.1"), (SD3, "transformer_blocks.2"),
                                        (SD35, "transformer_blocks.0")])
def test_sd3_block_both_streams_by_hand(name, path, stream):
    """Image stream: alpha * x + gate * f(x) per add. Context stream: the alphas of the image adds of the same block
    (attention, feed-forward), or 1 under context_stream="plain". The last block (context_pre_only) has image adds
    only."""
    plain, _ = build(name)
    model = decayify(copy.deepcopy(plain), alpha_min=0.3, context_stream=stream)
    block, lib = model.get_submodule(path), plain.get_submodule(path)
    alphas = block_factors(block)[0]
    assert all(a < 1 for a in alphas[1:]) and len(alphas) == (3 if lib.use_dual_attention else 2)
    x, c, temb = rand(2, 16, 16), rand(2, 5, 16, seed=5), rand(2, 16, seed=6)
    context_alphas = (alphas[0], alphas[-1]) if stream == "decay" else (1.0, 1.0)
    with torch.no_grad():
        (got_c, got_x), (want_c, want_x) = block(x, c, temb), _sd3_block(lib, x, c, temb, alphas, context_alphas)
        assert torch.allclose(got_x, want_x, atol=1e-5), (got_x - want_x).abs().max()
        if lib.context_pre_only:
            assert got_c is None and want_c is None
            return
        assert torch.allclose(got_c, want_c, atol=1e-5), (got_c - want_c).abs().max()
        library_c = lib(x, c, temb)[0]
        assert torch.equal(got_c, library_c) if stream == "plain" else not torch.allclose(got_c, library_c)


def _flux_rotary(model):
    ids = torch.cat([torch.zeros(5, 3), torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(4.0), torch.arange(4.0),
                                                                   indexing="ij"), -1).reshape(16, 3)])
    return model.pos_embed(ids)


@pytest.mark.covers("b", FLUX)
@pytest.mark.parametrize("stream", ["decay", "plain"])
def test_flux_double_and_single_blocks_by_hand(stream):
    plain, _ = build(FLUX)
    model = decayify(copy.deepcopy(plain), alpha_min=0.3, context_stream=stream)
    rot = _flux_rotary(plain)
    x, c, temb = rand(2, 16, 16), rand(2, 5, 16, seed=5), rand(2, 16, seed=6)
    with torch.no_grad():
        block, b = model.transformer_blocks[1], plain.transformer_blocks[1]
        a1, a2 = block_factors(block)[0]
        mod, c_mod = b.norm1(x, emb=temb), b.norm1_context(c, emb=temb)
        attn, c_attn = b.attn(hidden_states=mod[0], encoder_hidden_states=c_mod[0], image_rotary_emb=rot)
        _, g_msa, sh_mlp, sc_mlp, g_mlp = mod
        h = a1 * x + g_msa.unsqueeze(1) * attn
        want_x = a2 * h + g_mlp.unsqueeze(1) * b.ff(b.norm2(h) * (1 + sc_mlp[:, None]) + sh_mlp[:, None])
        want_c = _context(b, c, c_mod, c_attn, *((a1, a2) if stream == "decay" else (1.0, 1.0)))
        got_c, got_x = block(x, c, temb, image_rotary_emb=rot)
        assert torch.allclose(got_x, want_x, atol=1e-5) and torch.allclose(got_c, want_c, atol=1e-5)

        block, b = model.single_transformer_blocks[0], plain.single_transformer_blocks[0]
        (a,) = block_factors(block)[0]
        joint = torch.cat([c, x], dim=1)
        h, gate = b.norm(joint, emb=temb)
        branch = gate.unsqueeze(1) * b.proj_out(torch.cat([b.attn(hidden_states=h, image_rotary_emb=rot),
                                                           b.act_mlp(b.proj_mlp(h))], dim=2))
        scale = torch.full((1, 21, 1), a)
        if stream == "plain":
            scale[:, :5] = 1.0  # the text tokens are the context stream
        want = scale * joint + branch
        got_c, got_x = block(x, c, temb, image_rotary_emb=rot)
        assert torch.allclose(torch.cat([got_c, got_x], 1), want, atol=1e-5)
    names = [n for n, _ in alphas_of(model)]
    assert names == ["transformer_blocks.0", "transformer_blocks.1", "single_transformer_blocks.0",
                     "single_transformer_blocks.1"]  # double blocks first, as the forward runs them


# ----------------------------------------------------------------------------- (b) the U-Net blocks by hand
def _resnet(b, x, temb, a):
    h = b.conv1(b.nonlinearity(b.norm1(x))) + b.time_emb_proj(b.nonlinearity(temb))[:, :, None, None]
    h = b.conv2(b.dropout(b.nonlinearity(b.norm2(h))))
    s = x if b.conv_shortcut is None else b.conv_shortcut(x)
    return (a * s + h) / b.output_scale_factor


@pytest.mark.covers("b", UNET, UNETC)
def test_resnet_block_by_hand_with_and_without_conv_shortcut():
    from diffusers.models.resnet import ResnetBlock2D
    torch.manual_seed(0)
    plain = nn.ModuleList([ResnetBlock2D(in_channels=c_in, out_channels=c_out, temb_channels=12, groups=4,
                                         output_scale_factor=math.sqrt(2))
                           for c_in, c_out in ((8, 8), (8, 16), (16, 16))])
    dm._jitter(plain)
    keys = list(plain.state_dict())
    model = decayify(copy.deepcopy(plain), alpha_min=0.3)
    assert list(model.state_dict()) == keys
    assert model[0].conv_shortcut is None  # the first add: alpha 1, nothing installed
    assert isinstance(model[1].conv_shortcut, nn.Conv2d) and isinstance(model[2].conv_shortcut, ShortcutScale)
    temb = rand(2, 12, seed=6)
    with torch.no_grad():
        for block, lib, x in ((model[1], plain[1], rand(2, 8, 4, 4)), (model[2], plain[2], rand(2, 16, 4, 4))):
            (a,) = block_factors(block)[0]
            got, want = block(x, temb), _resnet(lib, x, temb, a)
            assert a < 1 and torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
        assert torch.equal(decayify(copy.deepcopy(plain), alpha_min=1.0)[2](x, temb), plain[2](x, temb))
    # and inside the U-Net: a block with a conv_shortcut (the skip concatenated) and one with an empty place
    plain, _ = build(UNET)
    model = decayify(copy.deepcopy(plain), alpha_min=0.3)
    temb = rand(2, 32, seed=6)
    with torch.no_grad():
        for path, x in (("up_blocks.1.resnets.1", rand(2, 16, 8, 8)), ("mid_block.resnets.1", rand(2, 16, 4, 4))):
            block, lib = model.get_submodule(path), plain.get_submodule(path)
            (a,) = block_factors(block)[0]
            assert isinstance(block.conv_shortcut, nn.Conv2d if "up" in path else ShortcutScale)
            assert torch.allclose(block(x, temb), _resnet(lib, x, temb, a), atol=1e-5)


def _attention(attn, x, a):
    B, C, H, W = x.shape
    h = attn.group_norm(x.view(B, C, H * W)).transpose(1, 2)
    q, k, v = (t.view(B, -1, attn.heads, C // attn.heads).transpose(1, 2) for t in (attn.to_q(h), attn.to_k(h),
                                                                                   attn.to_v(h)))
    o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, H * W, C)
    o = attn.to_out[1](attn.to_out[0](o)).transpose(1, 2).reshape(B, C, H, W)
    return (a * x + o) / attn.rescale_output_factor


@pytest.mark.covers("b", UNET)
@pytest.mark.parametrize("rescale", [1.0, 2.0])
def test_residual_attention_by_hand(rescale):
    """UNet2DModel's Attention(residual_connection=True): (alpha * x + f(x)) / rescale_output_factor."""
    from diffusers.models.attention_processor import Attention
    torch.manual_seed(0)
    plain = nn.ModuleList([Attention(16, heads=2, dim_head=8, norm_num_groups=4, residual_connection=True, bias=True,
                                     rescale_output_factor=rescale, upcast_softmax=True,
                                     _from_deprecated_attn_block=True) for _ in range(2)])
    dm._jitter(plain)
    model = decayify(copy.deepcopy(plain), alpha_min=0.3)
    x = rand(2, 16, 4, 4)
    with torch.no_grad():
        (a,) = block_factors(model[1])[0]
        assert a == pytest.approx(0.3) and torch.allclose(model[1](x), _attention(plain[1], x, a), atol=1e-5)
        assert torch.allclose(plain[1](x), _attention(plain[1], x, 1.0), atol=1e-6)  # the oracle is the library's


@pytest.mark.covers("b", UNET)
def test_unet_attention_by_hand():
    """The mid block's attention inside the U-Net."""
    plain, _ = build(UNET)
    model = decayify(copy.deepcopy(plain), alpha_min=0.3)
    x = rand(2, 16, 4, 4)
    with torch.no_grad():
        (a,) = block_factors(model.mid_block.attentions[0])[0]
        want = _attention(plain.mid_block.attentions[0], x, a)
        assert torch.allclose(model.mid_block.attentions[0](x), want, atol=1e-5)


@pytest.mark.covers("b", UNETC)
def test_cross_attention_unet_transformer_block_by_hand():
    """UNet2DConditionModel's BasicTransformerBlock (layer_norm): self-attention and feed-forward adds on the
    schedule, the cross-attention add at 1."""
    plain, _ = build(UNETC)
    model = decayify(copy.deepcopy(plain), alpha_min=0.3)
    path = "up_blocks.1.attentions.0.transformer_blocks.0"
    block, b = model.get_submodule(path), plain.get_submodule(path)
    a1, a2 = block_factors(block)[0]
    x, text = rand(2, 16, 8), rand(2, 5, 16, seed=5)
    with torch.no_grad():
        h = a1 * x + b.attn1(b.norm1(x))
        h = h + b.attn2(b.norm2(h), encoder_hidden_states=text)
        want = a2 * h + b.ff(b.norm3(h))
        assert torch.allclose(block(x, encoder_hidden_states=text), want, atol=1e-5)


# ----------------------------------------------------------------------------- the U-Net's depth order
UNET_ORDER = ["down_blocks.0.resnets.0", "down_blocks.1.resnets.0", "down_blocks.1.attentions.0",
              "mid_block.resnets.0", "mid_block.attentions.0", "mid_block.resnets.1",
              "up_blocks.0.resnets.0", "up_blocks.0.attentions.0", "up_blocks.0.resnets.1", "up_blocks.0.attentions.1",
              "up_blocks.1.resnets.0", "up_blocks.1.resnets.1"]
T = ".attentions.{}.transformer_blocks.0"
UNETC_ORDER = ["down_blocks.0.resnets.0", "down_blocks.0" + T.format(0), "down_blocks.1.resnets.0",
               "mid_block.resnets.0", "mid_block" + T.format(0), "mid_block.resnets.1",
               "up_blocks.0.resnets.0", "up_blocks.0.resnets.1",
               "up_blocks.1.resnets.0", "up_blocks.1" + T.format(0),
               "up_blocks.1.resnets.1", "up_blocks.1" + T.format(1)]


@pytest.mark.parametrize("name, order", [(UNET, UNET_ORDER), (UNETC, UNETC_ORDER)])
def test_unet_schedule_runs_down_mid_up_over_every_add(name, order):
    """diffusers registers down, up, mid (and each block's attentions before its resnets); the schedule runs as the
    forward: down -> mid -> up, resnet then attention, from 1 at the first add to alpha_min at the last up block's."""
    model = decayify(build(name)[0], alpha_min=0.4)
    assert [n for n, _ in model.named_children()].index("up_blocks") < [n for n, _ in model.named_children()].index(
        "mid_block")  # what the depth order is for
    assert [n for n, _ in alphas_of(model)] == order
    adds = len(flat(model))
    want = alpha_schedule(adds, 0.4, adds_per_block=1).flatten()
    assert torch.allclose(torch.tensor(flat(model), dtype=torch.float64), want)
    assert flat(model)[-1] == pytest.approx(0.4) and alphas_of(model)[-1][0].startswith("up_blocks.1")


@pytest.mark.parametrize("name, order", [(UNET, UNET_ORDER), (UNETC, UNETC_ORDER)])
def test_unet_depth_encoder_decays_down_and_mid_and_keeps_up_plain(name, order, tmp_path):
    plain, call = build(name)
    model = decayify(copy.deepcopy(plain), alpha_min=0.4, unet_depth="encoder")
    table = alphas_of(model)
    assert [n for n, _ in table] == order  # still listed in depth order: encoder, then the plain up blocks
    enc = [a for n, alphas in table if not n.startswith("up_blocks") for a in alphas]
    want = alpha_schedule(len(enc), 0.4, adds_per_block=1).flatten()
    assert torch.allclose(torch.tensor(enc, dtype=torch.float64), want) and enc[-1] == pytest.approx(0.4)
    assert [n for n, _ in table if not n.startswith("up")][-1] == "mid_block.resnets.1"  # ends in the mid block
    assert all(a == 1.0 for n, alphas in table if n.startswith("up_blocks") for a in alphas)
    with torch.no_grad():  # the up blocks run the library's code: nothing installed there
        for n, block, _ in residual_blocks(model):
            if n.startswith("up_blocks"):
                assert not block._forward_hooks and "forward" not in block.__dict__
    assert model.resdecay_spec["unet_depth"] == "encoder"
    # diffusers' save_pretrained keeps the keyword in the config; restore re-applies it after from_pretrained
    from resdecay.interop import restore
    model.save_pretrained(tmp_path)
    again = restore(type(plain).from_pretrained(tmp_path).eval())
    assert alphas_of(again) == table
    with torch.no_grad():
        assert torch.equal(call(again), call(model))


def test_keywords_are_checked_per_model():
    with pytest.raises(TypeError, match=r"unknown keyword\(s\) context_stream for UNet2DModel.*unet_depth"):
        decayify(build(UNET)[0], alpha_min=0.5, context_stream="plain")
    with pytest.raises(TypeError, match=r"unknown keyword\(s\) unet_depth for SD3Transformer2DModel.*context_stream"):
        decayify(build(SD3)[0], alpha_min=0.5, unet_depth="encoder")


def test_zero_init_makes_every_branch_zero():
    """The paper's init: a zero-initialised SD3 block maps (c, x) to (a1 a2 c, a1 a2 x); a ResnetBlock2D to
    alpha * shortcut(x) / output_scale_factor."""
    model = decayify(build(SD3)[0], alpha_min=0.5, zero_init=True)
    block = model.transformer_blocks[1]
    a1, a2 = block_factors(block)[0]
    x, c, temb = rand(2, 16, 16), rand(2, 5, 16, seed=5), rand(2, 16, seed=6)
    with torch.no_grad():
        got_c, got_x = block(x, c, temb)
        assert torch.allclose(got_x, a1 * a2 * x, atol=1e-6) and torch.allclose(got_c, a1 * a2 * c, atol=1e-6)
    plain = build(UNET)[0]
    unet = decayify(copy.deepcopy(plain), alpha_min=0.5, zero_init=True)
    block, lib = unet.up_blocks[1].resnets[1], plain.up_blocks[1].resnets[1]  # a conv_shortcut (skip concatenated)
    (a,) = block_factors(block)[0]
    x = rand(2, 16, 8, 8)
    with torch.no_grad():
        want = a * lib.conv_shortcut(x) / lib.output_scale_factor
        assert a < 1 and torch.allclose(block(x, rand(2, 32, seed=6)), want, atol=1e-6)


# ----------------------------------------------------------------------------- (d) compile, (e) threads
@pytest.mark.slow  # torch._dynamo.explain of two models: seconds each on 2 cores
@pytest.mark.parametrize("name", [SD3, UNET])
def test_compile_adds_no_graph_break(name):
    shared.compile_adds_no_graph_break(name)


@pytest.mark.parametrize("name", [SD3, UNET])
def test_threads_do_not_mix_inputs(name):
    shared.threads_do_not_mix_inputs(name)


@pytest.mark.slow  # torch._dynamo.explain of two models: seconds each on 2 cores
@pytest.mark.covers("d", FLUX, UNETC)
@pytest.mark.covers("e", FLUX, UNETC)
@pytest.mark.parametrize("name", [FLUX, UNETC])
def test_mixed_models_compile_without_new_graph_breaks_and_threads_do_not_mix(name):
    """(d) and (e) for the models of mixed add counts, the threads three calls each."""
    shared.compile_adds_no_graph_break(name)
    model, call = build(name)
    decayed = decayify(model, alpha_min=0.5)
    with torch.no_grad():
        want = call(decayed)
        outs, errors = from_threads(lambda: call(decayed), calls=3)
    assert not errors and len(outs) == 12 and all(torch.equal(o, want) for o in outs)
