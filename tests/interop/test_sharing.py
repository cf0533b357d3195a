"""Sharing that follows the Hugging Face conventions (issue 31, item 6): from_pretrained returns the
model (config on it, the old tuple deprecated), save_pretrained / push_to_hub as methods, a model
card with model-index / datasets / arXiv / license, and timm's hub loaders refusing a resdecay folder readably."""

import copy
import json
import pickle
import warnings
from pathlib import Path

import pytest
import timm
import torch
import yaml

import resdecay
from helpers.interop import tiny_timm
from resdecay import decayify
from resdecay.interop import from_pretrained, save_pretrained
from resdecay.interop.model_card import model_card
from resdecay.models import build_model, tiny_config
from resdecay.models.mae import TINY_MAE, MAEConfig

X = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))


def tiny_mae(seed=0):
    torch.manual_seed(seed)
    return build_model(MAEConfig(**TINY_MAE, zero_init=False)).eval()


def test_from_pretrained_returns_the_model_with_its_config(tmp_path):
    model = tiny_mae()
    save_pretrained(model, tmp_path / "m")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new form warns about nothing
        back = from_pretrained(tmp_path / "m")
    assert isinstance(back, type(model)) and type(back).__name__ == "MaskedAutoencoder"
    assert back.resdecay_config == json.loads((tmp_path / "m" / "config.json").read_text())
    assert torch.equal(back.forward_features(X), model.forward_features(X))
    # the former (model, config) tuple still unpacks, for one release, with a DeprecationWarning naming the new form
    with pytest.warns(DeprecationWarning, match="model.resdecay_config"):
        old_model, old_config = from_pretrained(tmp_path / "m")
    assert old_config == back.resdecay_config and torch.equal(old_model.forward_features(X), model.forward_features(X))


def test_models_from_resdecay_have_save_pretrained_and_survive_copy_and_pickle(tmp_path):
    back = from_pretrained(save_pretrained(tiny_mae(), tmp_path / "m"))
    assert back.save_pretrained(tmp_path / "again") == tmp_path / "again"
    assert torch.equal(from_pretrained(tmp_path / "again").forward_features(X), back.forward_features(X))
    created = resdecay.create_model("mae-tiny-digits", alpha_min=0.7)
    created.save_pretrained(tmp_path / "created")
    assert from_pretrained(tmp_path / "created").resdecay_config["alpha"]["alpha_min"] == 0.7
    # the generated class pickles as the original one (found by name), and a deep copy keeps the methods
    restored = pickle.loads(pickle.dumps(back))
    assert type(restored) is type(back)._resdecay_base and torch.equal(restored.forward_features(X), back.forward_features(X))
    twin = copy.deepcopy(back)
    assert type(twin) is type(back) and twin is not back and twin.blocks[0] is not back.blocks[0]
    # a classifier loaded back is saved again as a classifier, not as its encoder's MAE (both configs ride on it)
    clf = from_pretrained(save_pretrained(build_model(tiny_config("classifier")), tmp_path / "clf"))
    clf.save_pretrained(tmp_path / "clf2")
    assert json.loads((tmp_path / "clf2" / "config.json").read_text())["family"] == "classifier"


def test_push_to_hub_method_saves_and_uploads_through_huggingface_hub(tmp_path, monkeypatch):
    import huggingface_hub

    uploads = []

    class FakeApi:  # nothing leaves this machine
        def __init__(self, token=None):
            pass

        def create_repo(self, repo_id, **kw):
            return f"https://hub.invalid/{repo_id}"

        def upload_folder(self, **kw):
            uploads.append({p.name: p.read_bytes() for p in Path(kw["folder_path"]).iterdir()})

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    model = from_pretrained(save_pretrained(tiny_mae(), tmp_path / "m"))
    assert model.push_to_hub("me/tiny", license="mit") == "https://hub.invalid/me/tiny"
    assert {"config.json", "model.safetensors", "README.md"} <= set(uploads[0])
    assert "license: mit" in uploads[0]["README.md"].decode()
    assert model.save_pretrained(tmp_path / "p", push_to_hub=True, repo_id="me/p") == "https://hub.invalid/me/p"
    assert len(uploads) == 2 and (tmp_path / "p" / "config.json").is_file()


def test_card_has_model_index_datasets_arxiv_and_license():
    config = json.loads(json.dumps({"format": "resdecay-pretrained-v1", "kind": "resdecay", "family": "mae", "resdecay_version": "0",
                                    "data": {"name": "digits"}, "model": {}, "alpha": {"alpha_min": 0.6, "alpha_eff": 0.1, "factors": []}}))
    # two rows as resdecay eval writes them (protocols trimmed to what the card reads)
    split = {"train": {"data": "digits", "split": "train", "images": 300}, "test": {"data": "digits", "split": "test", "images": 100}}
    row = {"metric": "knn", "layer": 3, "feature": "mean", "values": {"top1": 0.91, "top5": 0.99},
           "protocol": {**split, "norm": "none", "layer": 3, "feature": "mean", "k": 20, "temperature": 0.07, "vote": "exp(cos/T)"}}
    rank = {"metric": "rank", "layer": 3, "feature": "cls", "values": {"effective_rank": 2.5},
            "protocol": {**split, "norm": "none", "layer": 3, "feature": "cls", "form": "entropy (paper eq. 6)", "split": "test"}}
    card = model_card(config, {"results": [row, rank], "step": 7}, "me/tiny")
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["license"] == "unknown" and meta["datasets"] == ["digits"] and "arxiv:2404.10947" in meta["tags"]
    assert "https://arxiv.org/abs/2404.10947" in card
    knn, rk = meta["model-index"][0]["results"]
    assert meta["model-index"][0]["name"] == "me/tiny"
    assert knn["task"]["type"] == "image-classification" and knn["dataset"] == {"name": "digits", "type": "digits", "split": "test"}
    assert [(m["type"], m["value"]) for m in knn["metrics"]] == [("knn_top1", 0.91), ("knn_top5", 0.99)]
    assert rk["metrics"][0]["type"] == "rank_effective_rank" and rk["metrics"][0]["value"] == 2.5
    # huggingface_hub reads it back as evaluation results
    from huggingface_hub import ModelCard

    results = ModelCard(card).data.eval_results
    assert [(r.metric_type, r.metric_value, r.dataset_name) for r in results][:2] == [("knn_top1", 0.91, "digits"),
                                                                                      ("knn_top5", 0.99, "digits")]
    assert yaml.safe_load(model_card(config, None, "x", "apache-2.0").split("---\n")[1])["license"] == "apache-2.0"


def test_timm_hub_loader_refuses_a_resdecay_folder_in_its_own_words(tmp_path):
    """timm.create_model('local-dir:...') reads config.json's "architecture" as a timm model name: resdecay's
    names none, so timm says 'Unknown model (resdecay:...: load it with resdecay.from_pretrained)' instead of
    crashing on a dict, and never loads a decayed model as a plain one. 'hf-hub:' reads the same file."""
    save_pretrained(tiny_mae(), tmp_path / "mae")
    save_pretrained(decayify(tiny_timm(), alpha_min=0.6), tmp_path / "vit", model_kwargs={"img_size": 32, "patch_size": 8,
                                                                                             "depth": 4})
    for folder, named in (("mae", "resdecay:mae"), ("vit", "resdecay:timm/vit_tiny_patch16_224")):
        with pytest.raises(RuntimeError) as info:
            timm.create_model(f"local-dir:{tmp_path / folder}")
        message = str(info.value)
        assert message.startswith(f"Unknown model ({named}") and "resdecay.from_pretrained" in message
    assert from_pretrained(tmp_path / "vit").resdecay_config["resdecay_architecture"]["name"] == "vit_tiny_patch16_224"


def test_a_folder_saved_before_the_architecture_moved_still_loads(tmp_path):
    """Folders written before this change keep the architecture dict under "architecture" (config.json and
    the weights' metadata alike): they load as they did."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    vit = decayify(tiny_timm(), alpha_min=0.6)
    folder = save_pretrained(vit, tmp_path / "vit", model_kwargs={"img_size": 32, "patch_size": 8, "depth": 4})
    config = json.loads((folder / "config.json").read_text())
    config["architecture"] = config.pop("resdecay_architecture")
    (folder / "config.json").write_text(json.dumps(config))
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        meta = f.metadata()
    meta["resdecay_config"] = json.dumps(config)
    save_file(load_file(folder / "model.safetensors"), folder / "model.safetensors", metadata=meta)
    back = from_pretrained(folder)
    with torch.no_grad():
        assert torch.equal(back(torch.ones(1, 3, 32, 32)), vit(torch.ones(1, 3, 32, 32)))
