"""The paper's U-Net MAE inside transformers (resdecay.interop.hf_unet): resdecay's U-Net MAE and a
decayified + skipped HF ViTMAEForPreTraining holding the same weights give the same loss, predictions
and gradients for the same masking noise (float64: round-off only); with decoder_start="encoder" and
alpha 1 the skipped model is exactly HF's; save_pretrained + from_pretrained + restore round-trips."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from helpers.interop import TINY_UNET as TINY
from helpers.interop import hf_model
from resdecay.errors import UserError
from resdecay.interop.hf_unet import restore, unet_skips
from resdecay.models.mae import MaskedAutoencoder

transformers = pytest.importorskip("transformers")


def _block(prefix_rd: str, prefix_hf: str, sd: dict) -> dict:
    q, k, v = sd[f"{prefix_rd}.attn.qkv.weight"].chunk(3)
    qb, kb, vb = sd[f"{prefix_rd}.attn.qkv.bias"].chunk(3)
    out = {f"{prefix_hf}.attention.q_proj.weight": q, f"{prefix_hf}.attention.k_proj.weight": k,
           f"{prefix_hf}.attention.v_proj.weight": v, f"{prefix_hf}.attention.q_proj.bias": qb,
           f"{prefix_hf}.attention.k_proj.bias": kb, f"{prefix_hf}.attention.v_proj.bias": vb}
    for rd, hf in (("attn.proj", "attention.o_proj"), ("norm1", "layernorm_before"), ("norm2", "layernorm_after"),
                   ("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2")):
        for p in ("weight", "bias"):
            out[f"{prefix_hf}.{hf}.{p}"] = sd[f"{prefix_rd}.{rd}.{p}"]
    return out


def resdecay_to_hf(sd: dict, depth: int, decoder_depth: int, hf_state: dict) -> dict:
    """resdecay U-Net MAE keys -> HF ViTMAE keys + resdecay_unet.* (HF keys resdecay has no use for kept)."""
    out = dict(hf_state)
    out.update({"vit.embeddings.cls_token": sd["cls_token"], "vit.embeddings.position_embeddings": sd["pos_embed"],
                "vit.embeddings.patch_embeddings.projection.weight": sd["patch_embed.proj.weight"],
                "vit.embeddings.patch_embeddings.projection.bias": sd["patch_embed.proj.bias"],
                "decoder.decoder_pos_embed": sd["decoder_pos_embed"]})
    for i in range(depth):
        out.update(_block(f"blocks.{i}", f"vit.layers.{i}", sd))
    for j in range(decoder_depth):
        out.update(_block(f"decoder_blocks.{j}", f"decoder.decoder_layers.{j}", sd))
    for name in ("decoder_norm.weight", "decoder_norm.bias", "decoder_pred.weight", "decoder_pred.bias"):
        out[f"decoder.{name}"] = sd[name]
    for key, value in sd.items():
        if key.startswith(("skip_fusions.", "decoder_cls_token", "decoder_embed.")):
            out[f"resdecay_unet.{key}"] = value
    return out


def run(model, imgs, noise, hf: bool):
    if hf:
        out = model(pixel_values=imgs, noise=noise)
        loss, pred = out.loss, out.logits
    else:
        torch.manual_seed(7)  # random_masking's torch.rand(B, N) is the first draw: the same noise as below
        loss, pred, _ = model(imgs)
    loss.backward()
    return loss.detach(), pred.detach()


def test_resdecay_unet_mae_and_the_skipped_hf_vitmae_are_the_same_model():
    torch.manual_seed(0)
    ours = MaskedAutoencoder(dataclasses.replace(TINY, alpha_min=0.6, skips=True, zero_init=False)).double().eval()
    with torch.no_grad():  # no zero layer anywhere: every path counts
        for p in ours.parameters():
            p.add_(0.05 * torch.randn_like(p))
    hf = unet_skips(hf_model(), alpha_min=0.6).double()
    hf.load_state_dict(resdecay_to_hf(ours.state_dict(), 4, 2, hf.state_dict()), strict=True)
    imgs = torch.randn(3, 3, 16, 16, dtype=torch.float64)
    torch.manual_seed(7)
    noise = torch.rand(3, 16).double()
    la, pa = run(ours, imgs, noise, hf=False)
    lb, pb = run(hf, imgs, noise, hf=True)
    # predictions: float64 round-off; the loss and so the gradients: resdecay's forward_loss computes in float32
    # (pred.float(), for bf16 training), so they agree to float32 round-off
    assert (pa - pb).abs().max() / pa.abs().max() < 1e-12 and abs(la - lb) / abs(la) < 1e-6
    mapped = resdecay_to_hf({k: p.grad for k, p in ours.named_parameters() if p.grad is not None}
                            | {k: torch.zeros_like(v) for k, v in ours.state_dict().items() if "pos_embed" in k}, 4, 2, {})
    grads = dict(hf.named_parameters())
    keys = [k for k in mapped if grads[k].grad is not None]  # (key biases' gradients are 0 up to round-off)
    ref, got = (torch.cat([t.flatten() for t in ts]) for ts in ([mapped[k] for k in keys], [grads[k].grad for k in keys]))
    assert len(keys) == sum(p.grad is not None for p in hf.parameters())
    assert (got - ref).norm() / ref.norm() < 1e-6
    print(f"pred {((pa - pb).abs().max() / pa.abs().max()).item():.1e} loss {(abs(la - lb) / abs(la)).item():.1e} "
          f"grad {((got - ref).norm() / ref.norm()).item():.1e}")
    assert hf.resdecay_unet.sources == ours.skip_sources == [3, 1]


def test_encoder_start_at_alpha_one_is_exactly_the_hf_model():
    plain = hf_model()
    skipped = unet_skips(copy.deepcopy(plain), decoder_start="encoder")
    imgs, noise = torch.randn(2, 3, 16, 16), torch.rand(2, 16)
    with torch.no_grad():
        assert torch.equal(skipped(pixel_values=imgs, noise=noise).logits, plain(pixel_values=imgs, noise=noise).logits)
    assert all(k.startswith("resdecay_unet.") for k in set(skipped.state_dict()) - set(plain.state_dict()))


def test_save_pretrained_then_transformers_from_pretrained_plus_restore(tmp_path):
    from transformers import ViTMAEForPreTraining
    model = unet_skips(hf_model(), alpha_min=0.5)
    with torch.no_grad():
        for p in model.resdecay_unet.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(tmp_path)
    loaded = restore(ViTMAEForPreTraining.from_pretrained(tmp_path).eval(), tmp_path)
    imgs, noise = torch.randn(2, 3, 16, 16), torch.rand(2, 16)
    with torch.no_grad():
        assert torch.equal(loaded(pixel_values=imgs, noise=noise).logits, model(pixel_values=imgs, noise=noise).logits)
    import resdecay
    assert resdecay.alphas_of(loaded.vit) == resdecay.alphas_of(model.vit)


def test_a_copy_is_independent_and_bad_input_is_one_line():
    model = unet_skips(hf_model(), alpha_min=0.5)
    twin = copy.deepcopy(model)
    imgs, noise = torch.randn(2, 3, 16, 16), torch.rand(2, 16)
    with torch.no_grad():
        twin.resdecay_unet.skip_fusions[0].fc2.weight.add_(1.0)
        assert not torch.equal(twin(pixel_values=imgs, noise=noise).logits, model(pixel_values=imgs, noise=noise).logits)
    with pytest.raises(UserError, match="takes a transformers ViTMAEForPreTraining, not Linear"):
        unet_skips(torch.nn.Linear(2, 2))
    with pytest.raises(UserError, match="already has its skips"):
        unet_skips(model)
    with pytest.raises(UserError, match="decoder_start must be"):
        unet_skips(hf_model(), decoder_start="middle")


def test_zero_position_tables_of_a_config_built_model_are_filled_as_transformers_lays_them_out():
    """transformers 5.x builds ViTMAEForPreTraining(config) with zero sin-cos tables; the content-free decoder
    start is made of them, so unet_skips fills them (in transformers' own layout) and says so."""
    model = hf_model(zero_positions=True)  # as transformers 5.24 leaves them (another release may fill them)
    with pytest.warns(UserWarning, match="position tables were all zero"):
        unet_skips(model)
    mine = model.decoder.decoder_pos_embed.detach().clone()
    model.decoder.initialize_weights(model.vit.embeddings.patch_embeddings.num_patches)  # transformers' own table
    assert torch.equal(model.decoder.decoder_pos_embed, mine) and bool(model.vit.embeddings.position_embeddings.any())


def test_restore_of_a_folder_without_resdecay_settings_or_weights_is_one_line(tmp_path):
    from resdecay.errors import CheckpointError
    plain = hf_model()
    plain.save_pretrained(tmp_path / "plain")
    with pytest.raises(UserError, match=r"nothing to restore: neither ViTMAEForPreTraining.config nor .*plain/config.json "
                                        "has a 'resdecay' section"):
        restore(plain, tmp_path / "plain")
    model = unet_skips(hf_model(), alpha_min=0.5)
    model.save_pretrained(tmp_path / "skipped")
    (tmp_path / "skipped" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no model.safetensors \(nor model.safetensors.index.json\) beside config.json"):
        restore(hf_model_with_config(model), tmp_path / "skipped")


def hf_model_with_config(model):
    """A fresh ViTMAE carrying ``model``'s config (as transformers' from_pretrained would give it)."""
    from transformers import ViTMAEForPreTraining
    return ViTMAEForPreTraining(model.config).eval()


def test_encoder_start_with_zero_init_on_zero_tables_trains_every_branch():
    """Issue 38, item 2: with transformers 5.x's zero tables (and zero mask token) every masked token was the zero
    vector, so the zero pixel head never got a gradient and nothing before it ever trained (exactly 0 after 150
    AdamW steps). unet_skips fills the tables for either decoder start and says so."""
    model = hf_model(zero_positions=True).train()
    with pytest.warns(UserWarning, match="position tables were all zero"):
        unet_skips(model, alpha_min=0.6, decoder_start="encoder", zero_init=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    imgs = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    for _ in range(4):  # the gradient reaches one more stage each step: pixel head, decoder, skips, encoder
        loss = model(pixel_values=imgs).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    still = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.any())]
    assert still == []
    assert all(bool(p.any()) for n, p in model.named_parameters() if n.endswith(("o_proj.weight", "fc2.weight")))


def test_a_refused_unet_skips_leaves_the_model_as_it_was():
    """Issue 38, item 9: a bad alpha_min was refused after the position tables had been filled."""
    model = hf_model(zero_positions=True)
    for bad in ({"alpha_min": 1.5}, {"alpha_min": 0.5, "schedule": "zigzag"}, {"skip_sources": [9]}):
        with pytest.raises((UserError, ValueError)):
            unet_skips(model, **bad)
        assert not model.vit.embeddings.position_embeddings.any() and not model.decoder.decoder_pos_embed.any()
        assert not hasattr(model, "resdecay_unet") and getattr(model.config, "resdecay", None) is None
        assert not hasattr(model.vit, "resdecay_spec")
    with pytest.raises(UserError, match=r"unet_skips: skip_sources \[9\] must be distinct encoder block indices"):
        unet_skips(model, skip_sources=[9])
