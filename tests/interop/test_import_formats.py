"""The import-format registry (``resdecay.train.import_formats``): ``finetune --from``, ``pretrain --from`` and
``import-weights --format`` take whatever it holds, checked when a command runs (not frozen as argparse choices);
an unknown ``--format`` is one line naming the registered ones; detection tries the formats in registration
order, resdecay's own first; an entry that cannot work is refused when registered, a detect or convert that fails
when it runs is one line naming it. (The example of docs/EXTENDING.md (g) runs end to end in
tests/eval/test_extending.py; the registry's naming convention in tests/test_registries.py.)"""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import torch

from helpers import assert_one_line_error, run
from helpers.interop import resdecay_checkpoint, same_mae_outputs
from resdecay.errors import RegistryError, UserError
from resdecay.interop import (
    IMPORT_FORMATS,
    ConvertedWeights,
    ImportFormat,
    SourceFile,
    register_import_format,
    unregister_import_format,
)
from resdecay.interop.foreign_vit import infer_decoder, infer_encoder
from resdecay.interop.import_weights import load_pretrained
from resdecay.train.checkpoint import load_checkpoint, load_model

BUILT_IN = ["resdecay", "mae", "unet-mae", "timm-vit", "hf-vitmae"]
HEADS = ["model.num_heads=2", "model.decoder_num_heads=2"]


@pytest.fixture
def scratch_formats():
    """The formats a test registers are gone afterwards."""
    before = set(IMPORT_FORMATS)
    yield
    for name in set(IMPORT_FORMATS) - before:
        unregister_import_format(name)


def is_toy(source: SourceFile) -> bool:
    return isinstance(source.contents, dict) and isinstance(source.contents.get("toy"), dict)


def convert_toy(source: SourceFile) -> ConvertedWeights:
    """A toy layout: an MAE's state_dict under ``toy`` with every name prefixed ``t.``, alpha 1."""
    weights = {k[2:]: v for k, v in source.contents["toy"].items()}
    sizes = {**infer_encoder(weights, source.given), **infer_decoder(weights, source.given)}
    return ConvertedWeights({**sizes, "skips": False, "encoder_norm": "norm.weight" in weights}, weights,
                            stated={"alpha_min": (1.0, "its toy layout")})


TOY = ImportFormat("toy", "toy MAE", is_toy, convert_toy)


@pytest.fixture
def toy_file(tmp_path):
    """(a plain MAE, the file holding it in the toy layout)."""
    src, _ = resdecay_checkpoint(tmp_path / "src.pt", "mae-tiny-digits-plain")
    torch.save({"toy": {f"t.{k}": v for k, v in src.state_dict().items()}}, tmp_path / "toy.pt")
    return src, tmp_path / "toy.pt"


def test_the_built_ins_are_entries_tried_first_in_their_order():
    assert list(IMPORT_FORMATS)[:5] == BUILT_IN
    assert [f.native for f in IMPORT_FORMATS.values()][:5] == [True, False, False, False, False]
    assert [f.has_decoder for f in IMPORT_FORMATS.values()][:5] == [True, True, True, False, True]


def test_an_unknown_format_is_one_line_naming_the_registered_ones(capsys, tmp_path, toy_file, scratch_formats):
    register_import_format(TOY)
    _, toy = toy_file
    finetune = run(capsys, "finetune", "--from", toy, "--format", "nope")
    pretrain = run(capsys, "pretrain", "--preset", "mae-tiny-digits", "--from", toy, "--format", "nope")
    for code, _, err in (finetune, pretrain):
        assert_one_line_error(code, err, "--format 'nope' is unknown; choose one of resdecay, mae, unet-mae, timm-vit, "
                                         "hf-vitmae, toy")
    code, _, err = run(capsys, "import-weights", toy, "--format", "resdecay", "--preset", "mae-tiny-digits",
                       "--out", tmp_path / "o.pt")  # resdecay's own checkpoint needs no import
    assert_one_line_error(code, err, "--format 'resdecay' is unknown; choose one of mae, unet-mae, timm-vit, hf-vitmae, toy")
    assert not (tmp_path / "o.pt").exists()


def test_a_format_registered_after_the_parser_is_built_is_taken(capsys, tmp_path, toy_file, scratch_formats):
    from resdecay.cli.main import build_parser

    src, toy = toy_file
    parser = build_parser()
    register_import_format(TOY)  # after the parser: no argparse choices froze the list
    args, overrides = parser.parse_known_args(["import-weights", str(toy), "--format", "toy", "--preset",
                                               "mae-tiny-digits-plain", "--out", str(tmp_path / "imp.pt"), *HEADS])
    args.overrides = overrides  # as main() takes key=value after the options
    args.func(args)
    model, cfg = load_model(tmp_path / "imp.pt")
    assert same_mae_outputs(src, model) and cfg.model.alpha_min == 1.0
    assert load_checkpoint(tmp_path / "imp.pt")["imported_from"]["format"] == "toy"
    args = parser.parse_args(["finetune", "--from", str(toy), "--format", "toy"])
    assert args.format == "toy"


def test_detection_follows_registration_and_load_checkpoint_names_the_import(capsys, tmp_path, toy_file,
                                                                             scratch_formats):
    src, toy = toy_file
    with pytest.raises(UserError, match="cannot tell the format .*give --format, one of resdecay, mae"):
        load_pretrained(toy)
    register_import_format(TOY)
    got = load_pretrained(toy, import_preset="mae-tiny-digits-plain", import_overrides=HEADS)
    assert got.format == "toy" and not got.native and got.weights_file == toy
    assert all(torch.equal(got.state["model"][k], v) for k, v in src.state_dict().items())
    # an eager format registered later does not take a file a built-in recognises first
    register_import_format(ImportFormat("anything", "anything", lambda source: True, convert_toy))
    torch.save({"model": src.state_dict()}, tmp_path / "mae.pth")
    assert load_pretrained(tmp_path / "mae.pth", import_preset="mae-tiny-digits-plain",
                           import_overrides=HEADS).format == "mae"
    code, _, err = run(capsys, "eval", toy)
    assert_one_line_error(code, err, "looks like a toy MAE checkpoint", f"import-weights {toy} --format toy")


def test_a_failing_detect_or_convert_is_one_line_naming_the_format(capsys, tmp_path, toy_file, scratch_formats):
    _, toy = toy_file

    def fussy(source: SourceFile) -> bool:
        return source.contents["net"] is not None  # a KeyError on any other layout

    register_import_format(ImportFormat("fussy", "fussy", fussy, convert_toy))
    code, _, err = run(capsys, "finetune", "--from", toy)
    assert_one_line_error(code, err, "import format 'fussy': its detect", f"failed on {toy}: KeyError")
    unregister_import_format("fussy")
    register_import_format(ImportFormat("broken", "broken", is_toy, lambda source: {"weights": {}}))
    code, _, err = run(capsys, "import-weights", toy, "--format", "broken", "--preset", "mae-tiny-digits-plain",
                       "--out", tmp_path / "o.pt")
    assert_one_line_error(code, err, "import format 'broken': convert returned a dict, not ConvertedWeights")


@pytest.mark.parametrize("change,fragment", [
    ({"name": "two words"}, "must be a word"),
    ({"description": ""}, "description must be a non-empty string"),
    ({"detect": None}, "detect must be a function"),
    ({"convert": "convert_toy"}, "convert must be a function"),
    ({"unstated_alpha": "maybe"}, "unstated_alpha must be one of plain, ask, assume plain"),
])
def test_an_entry_that_cannot_work_is_refused(change, fragment, scratch_formats):
    entry = dataclasses.replace(TOY, **change)
    with pytest.raises(RegistryError, match=fragment):
        register_import_format(entry)
    with pytest.raises(RegistryError, match="takes an ImportFormat"):
        register_import_format(argparse.Namespace(name="toy"))
    assert "toy" not in IMPORT_FORMATS
