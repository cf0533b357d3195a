"""One record of what resdecay did to a transformers / diffusers model, in that model's own config
(resdecay.nn.config_record; issue 38, items 1-5, 8, 9): every way resdecay changes the model is kept by the
library's own save_pretrained, and from_pretrained + restore gives back exactly the saved model."""

from __future__ import annotations

import json

import pytest
import torch

from helpers.interop import hf_model, resdecay_checkpoint
from resdecay.errors import CheckpointError, UserError
from resdecay.interop.hf_unet import restore, unet_skips
from resdecay.interop.hf_vitmae import export_to_vitmae
from resdecay.nn.decayify import alphas_of, decayify

transformers = pytest.importorskip("transformers")
from transformers import ViTMAEForPreTraining  # noqa: E402

IMGS, NOISE = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1)), torch.rand(2, 16)


def logits(model, imgs=IMGS, noise=NOISE):
    with torch.no_grad():
        return model(pixel_values=imgs, noise=noise[:, :(imgs.shape[-1] // model.config.patch_size) ** 2]).logits


def jiggle(model):
    """Every new weight away from its init (the skips' zero Linear too), so a lost one would show."""
    with torch.no_grad():
        for p in getattr(model, "resdecay_unet", torch.nn.Module()).parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def save_load_restore(model, folder):
    model.save_pretrained(folder)
    return restore(ViTMAEForPreTraining.from_pretrained(folder).eval(), folder)


def whole_then_vit_then_skips(m):
    decayify(m, alpha_min=0.5)  # encoder and decoder in one schedule, then the encoder alone again: order matters
    decayify(m.vit, alpha_min=0.7)
    return unet_skips(m)


CHANGES = {
    "decayify": lambda m: decayify(m, alpha_min=0.5),
    "unet_skips": lambda m: unet_skips(m, alpha_min=0.6, skip_sources=[3, 2]),
    "decayify-then-unet_skips": lambda m: unet_skips(decayify(m, alpha_min=0.5, schedule="cosine"), decoder_start="encoder"),
    "unet_skips-then-decayify": lambda m: decayify(unet_skips(m), alpha_min=0.4, branches="mlp"),
    "whole-then-vit-then-skips": whole_then_vit_then_skips,
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_every_change_round_trips_through_transformers_own_save_pretrained(tmp_path, change):
    model = jiggle(CHANGES[change](hf_model()))
    assert model.config.resdecay["version"] == 1
    loaded = save_load_restore(model, tmp_path / "a")
    assert torch.equal(logits(loaded), logits(model))
    assert alphas_of(loaded) == alphas_of(model) and loaded.config.resdecay == model.config.resdecay
    # and once more: a restored model saves the same record, so a second generation is the same model
    again = save_load_restore(loaded, tmp_path / "b")
    assert torch.equal(logits(again), logits(model))


def test_decayify_then_unet_skips_records_both_and_the_decoder_keeps_its_decay(tmp_path):
    """Item 3: the decoder's decay (from decayify of the whole model) was kept by the model but not by its record."""
    model = jiggle(unet_skips(decayify(hf_model(), alpha_min=0.5), zero_init=True))
    steps = model.config.resdecay["steps"]
    assert [(s["op"], s.get("on")) for s in steps] == [("decayify", "ViTMAEForPreTraining"), ("unet_skips", None)]
    assert alphas_of(model.decoder)[-1][1] == (1 - 0.5 * 10 / 11, 0.5)  # zero_init left the decoder's factors alone
    loaded = save_load_restore(model, tmp_path)
    assert torch.equal(logits(loaded), logits(model)) and alphas_of(loaded.decoder) == alphas_of(model.decoder)


def test_transformers_save_pretrained_of_a_decayified_model_keeps_alpha(tmp_path):
    """Item 4: config.json carries the decay; from_pretrained + restore (no folder needed) brings it back."""
    model = decayify(hf_model(), alpha_min=0.3, schedule="paper")
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())["resdecay"]
    assert saved == {"version": 1, "steps": [{"op": "decayify", "on": "ViTMAEForPreTraining", "alpha_min": 0.3,
                                              "schedule": "paper", "branches": "both"}]}
    loaded = ViTMAEForPreTraining.from_pretrained(tmp_path).eval()
    assert not torch.equal(logits(loaded), logits(model))  # transformers alone runs it without the decay
    assert torch.equal(logits(restore(loaded)), logits(model)) and alphas_of(loaded) == alphas_of(model)


def test_resdecay_save_pretrained_of_a_transformers_model_points_to_its_own(tmp_path):
    from resdecay.interop import save_pretrained
    with pytest.raises(UserError, match=r"its own model.save_pretrained\(folder\), whose config.json keeps the decay"):
        save_pretrained(decayify(hf_model(), alpha_min=0.5), tmp_path / "x")


def test_a_later_decayify_of_one_module_replaces_its_step_and_parts_are_recorded_by_class():
    model = decayify(hf_model(), alpha_min=0.5)
    decayify(model.vit, alpha_min=0.8)
    decayify(model, alpha_min=0.6, branches="attn")
    assert [(s["on"], s["alpha_min"]) for s in model.config.resdecay["steps"]] == [("ViTMAEModel", 0.8),
                                                                                    ("ViTMAEForPreTraining", 0.6)]
    from resdecay.nn.config_record import NotRecordedWarning
    with pytest.warns(NotRecordedWarning, match="ViTMAEDecoder is a part of a transformers model"):
        decayify(model.decoder, alpha_min=0.9)  # its config is a copy that save_pretrained never writes


@pytest.mark.parametrize("decoder_decay", [False, True])
def test_restore_of_an_hf_vitmae_export_of_a_decayed_mae_sets_alpha(tmp_path, decoder_decay):
    """Item 1: restore read unet_skips' schema only and left the export's decay at alpha 1, silently."""
    overrides = ["model.decoder_num_heads=4", "alpha_min=0.6", "model.schedule=cosine", f"model.decoder_decay={decoder_decay}"]
    ours, _ = resdecay_checkpoint(tmp_path / "d.pt", "mae-tiny-digits-plain", overrides)
    with pytest.warns(UserWarning, match="restore"):
        export_to_vitmae(tmp_path / "d.pt", tmp_path / "hf")
    loaded = restore(ViTMAEForPreTraining.from_pretrained(tmp_path / "hf").eval(), tmp_path / "hf")
    enc = [a for _, a in alphas_of(loaded.vit)]
    assert torch.equal(torch.tensor(enc, dtype=torch.float64), ours.alphas.double().reshape(len(enc), 2))
    assert alphas_of(loaded.decoder)[-1][1][1] == (0.6 if decoder_decay else 1.0)
    imgs = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.manual_seed(3)
        out = loaded(imgs, noise=torch.rand(3, 16))
        torch.manual_seed(3)
        loss, pred, _ = ours(imgs)
    assert (pred - out.logits).abs().max() < 1e-5 and abs(loss - out.loss) < 1e-6
    again = save_load_restore(loaded, tmp_path / "again")  # the export's record survives transformers' save
    noise = torch.rand(3, 16)
    with torch.no_grad():
        assert torch.equal(again(imgs, noise=noise).logits, loaded(imgs, noise=noise).logits)


def test_folders_written_by_earlier_versions_still_restore(tmp_path):
    model = jiggle(unet_skips(hf_model(), alpha_min=0.5))
    model.save_pretrained(tmp_path / "unet")
    config = json.loads((tmp_path / "unet" / "config.json").read_text())
    config["resdecay"] = {"unet": {"skip_sources": [3, 1], "decoder_start": "content_free"},
                          "encoder": {"alpha_min": 0.5, "schedule": "linear", "branches": "both"}}  # unet_skips' old schema
    (tmp_path / "unet" / "config.json").write_text(json.dumps(config))
    loaded = restore(ViTMAEForPreTraining.from_pretrained(tmp_path / "unet").eval(), tmp_path / "unet")
    assert torch.equal(logits(loaded), logits(model)) and loaded.config.resdecay["version"] == 1
    plain = hf_model()
    plain.config.resdecay = {"alpha_min": 0.6, "schedule": "linear", "decay_branches": "both", "decoder_decay": False,
                             "note": "export's old schema"}
    restore(plain)
    assert alphas_of(plain.vit)[-1][1] == (0.6 + 0.4 / 7, 0.6) and alphas_of(plain.decoder)[-1][1] == (1.0, 1.0)


@pytest.mark.parametrize("section, words", [
    ({"version": 2, "steps": []}, "schema version 2; this resdecay reads version 1; upgrade resdecay"),
    ({"version": 1, "steps": [], "extra": 1}, "has keys ['extra', 'steps', 'version']"),
    ({"version": 1, "steps": [{"op": "prune"}]}, "not a resdecay step"),
    ({"version": 1, "steps": [{"op": "decayify", "on": "ViTMAEModel", "alpha_min": 0.5, "zero_init": True}]},
     "unknown key(s) zero_init"),
    ({"version": 1, "steps": [{"op": "decayify", "on": "ViTMAEModel", "alpha_min": 7}]}, "alpha_min must lie in (0, 1]"),
    ({"version": 1, "steps": [{"op": "decayify", "on": "Dinov2Model", "alpha_min": 0.5}]}, "holds no such module"),
    ({"version": 1, "steps": [{"op": "unet_skips", "skip_sources": [3], "decoder_start": "encoder"}]}, "pass the folder too"),
    ({"alpha": 0.5}, "no version"),
    ("garbage", "its 'resdecay' section is str 'garbage', not a JSON object"),
    ([1, 2], "its 'resdecay' section is list [1, 2], not a JSON object"),
    ({"version": 99, "steps": []}, "schema version 99; this resdecay reads version 1; upgrade resdecay"),
    ({"version": True, "steps": []}, "schema version True; this resdecay reads version 1"),
    ({"version": 1, "steps": "decayify"}, "(steps a list, note a string)"),
    ({"version": 1, "steps": [], "note": 5}, "(steps a list, note a string)"),
    ({"version": 1, "steps": ["decayify"]}, "step 0: 'decayify' is not a resdecay step"),
    ({"version": 1, "steps": [{"op": ["decayify"]}]}, "is not a resdecay step (op must be one of decayify, unet_skips)"),
    ({"unet": "x"}, "its 'resdecay' section's 'unet' is 'x', not a JSON object"),
    ({"encoder": 5}, "its 'resdecay' section's 'encoder' is 5, not a JSON object"),
])
def test_what_restore_cannot_restore_is_one_line_and_changes_nothing(section, words):
    model = hf_model()
    model.config.resdecay = section
    before = logits(model)
    with pytest.raises(UserError, match=None) as info:
        restore(model)
    assert words in str(info.value) and "\n" not in str(info.value)
    assert torch.equal(logits(model), before) and not hasattr(model, "resdecay_unet")


@pytest.mark.parametrize("section, words", [
    ("garbage", "config.json: its 'resdecay' section is str 'garbage', not a JSON object"),
    ({"version": 99, "steps": []}, "config.json: its 'resdecay' section is schema version 99"),
    ({"version": 1, "steps": [{"op": "prune"}]}, "config.json step 0: {'op': 'prune'} is not a resdecay step"),
])
def test_a_garbage_record_in_the_folders_config_json_is_one_line(tmp_path, section, words):
    """A model without a record reads the folder's config.json: a section there that is not resdecay's is refused
    in one UserError line naming that file, and the model is left as it was."""
    hf_model().save_pretrained(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "resdecay": section}))
    model = hf_model()
    before = logits(model)
    with pytest.raises(UserError) as info:
        restore(model, tmp_path / "m")
    assert words in str(info.value) and "\n" not in str(info.value)
    assert torch.equal(logits(model), before) and not hasattr(model.vit, "resdecay_spec")


def test_restore_names_the_right_place(tmp_path):
    """Item 8: a missing folder was blamed on its config.json; a record in the folder's config.json (the
    model built another way) was said not to be there."""
    with pytest.raises(UserError, match=r"restore: .*nowhere does not exist"):
        restore(hf_model(), tmp_path / "nowhere")
    saved = jiggle(unet_skips(hf_model(), alpha_min=0.5))
    saved.save_pretrained(tmp_path / "m")
    built = ViTMAEForPreTraining(hf_model().config).eval()  # without the record: read from the folder's config.json
    built.load_state_dict({k: v for k, v in saved.state_dict().items() if not k.startswith("resdecay_unet.")})
    assert torch.equal(logits(restore(built, tmp_path / "m")), logits(saved))
    with pytest.raises(UserError, match="nothing to restore: ViTMAEForPreTraining.config has no 'resdecay' section"):
        restore(hf_model())
    loaded = ViTMAEForPreTraining.from_pretrained(tmp_path / "m")
    with pytest.raises(UserError, match=r"records skips this model does not have .*restore\(model, folder\)"):
        unet_skips(loaded)  # instead of restore: the record would name the skips twice
    # skips the weights do not fit, or a model class without a decoder: refused before anything changes
    loaded = ViTMAEForPreTraining.from_pretrained(tmp_path / "m")
    loaded.config.resdecay = {"version": 1, "steps": [{"op": "decayify", "on": "ViTMAEModel", "alpha_min": 0.5},
                                                      {"op": "unet_skips", "skip_sources": [3], "decoder_start": "encoder"}]}
    with pytest.raises(CheckpointError, match="resdecay_unet. weights do not fit the skips ViTMAEForPreTraining.config"):
        restore(loaded, tmp_path / "m")
    assert not hasattr(loaded.vit, "resdecay_spec") and not hasattr(loaded, "resdecay_unet")
    encoder = transformers.ViTMAEModel.from_pretrained(tmp_path / "m")
    with pytest.raises(UserError, match="only a ViTMAEForPreTraining has; load the folder with ViTMAEForPreTraining"):
        restore(encoder, tmp_path / "m")
    assert not hasattr(encoder, "resdecay_spec")
    plain = hf_model()
    plain.save_pretrained(tmp_path / "p")
    plain.config.resdecay = saved.config.resdecay  # a record of skips beside weights without them
    with pytest.raises(CheckpointError, match="its weights hold no resdecay_unet. tensors"):
        restore(plain, tmp_path / "p")


def test_a_diffusers_model_records_its_decay_too(tmp_path):
    from diffusers import DiTTransformer2DModel

    from resdecay.interop import restore  # the same function, for any library model
    torch.manual_seed(0)
    model = DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4, num_layers=2, sample_size=8,
                                  patch_size=2, num_embeds_ada_norm=10).eval()
    decayify(model, alpha_min=0.5)
    model.save_pretrained(tmp_path)
    loaded = restore(DiTTransformer2DModel.from_pretrained(tmp_path).eval())
    x, t, y = torch.randn(2, 4, 8, 8), torch.tensor([3, 700]), torch.tensor([1, 7])
    with torch.no_grad():
        assert torch.equal(loaded(x, timestep=t, class_labels=y).sample, model(x, timestep=t, class_labels=y).sample)
    assert alphas_of(loaded) == alphas_of(model) != alphas_of(DiTTransformer2DModel.from_pretrained(tmp_path))


def test_the_docs_example_runs_as_written(tmp_path, monkeypatch, capsys):
    """docs/interop.md's block on the record (decayify, then unet_skips, transformers' save_pretrained, restore)."""
    import re
    from pathlib import Path

    page = (Path(__file__).parent.parent.parent / "docs" / "interop.md").read_text()
    section = page.split("## transformers and diffusers models")[1]
    code = re.findall(r"^```python\n(.*?)^```", section, re.S | re.M)[0]
    printed = re.findall(r"^```text\n(.*?)^```", section, re.S | re.M)[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "interop.md", "exec"), {"__name__": "docs"})
    assert capsys.readouterr().out == printed
