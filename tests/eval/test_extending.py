"""docs/EXTENDING.md's worked examples, run as the page shows them (with CI-sized budgets):
(a) a residual formula through ``ablate``, (b) a model family trained, resumed and evaluated by the
unchanged CLI, (c) a metric in ``eval.json`` and the report, (d) a metric over two blocks (linear CKA)
through ``eval`` and its per-layer profile, (e) a new input kind, (f) a ``--model`` format of one's own,
(g) a source of pretrained weights through ``import-weights``, ``finetune --from`` and ``pretrain --from`` —
each one file under docs/examples/extending/.
The contract test (tests/models/test_contract.py) and tests/eval/test_metrics.py load the same files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import TINY, assert_one_line_error, model_overrides, run
from helpers.doc_pages import python_blocks
from helpers.interop import resdecay_checkpoint, same_mae_outputs
from resdecay.eval.metrics import registered, unregister_metric
from resdecay.eval.sources import source_kinds, unregister_source
from resdecay.interop import IMPORT_FORMATS, unregister_import_format
from resdecay.interop.foreign_model import MODEL_FORMATS, unregister_model_format
from resdecay.io import file_sha256
from resdecay.models import FAMILIES
from resdecay.models.mae import MaskedAutoencoder
from resdecay.nn import residual
from resdecay.nn.residual import factors_of
from resdecay.train import checkpoint as ckpt

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLES = ROOT / "docs" / "examples" / "extending"
GUIDE = (ROOT / "docs" / "EXTENDING.md").read_text()
# 256 of the 1,437 training digits: 4 steps an epoch, not 22 (what the plugins change is checked, not the training)
FAST = ["train.epochs=2", "train.warmup_epochs=1", "train.log_every=5", "train.threads=1", "data.train_subset=256"]


def shown(command: str) -> str:
    """The command as EXTENDING.md shows it: the test runs what the page says (budget overrides added)."""
    assert command in GUIDE, f"docs/EXTENDING.md no longer shows: {command}"
    return command


@pytest.fixture
def registries_restored():
    """What a plugin registers (formulas, families, metrics, its module) is gone after the test."""
    formulas, families, modules = dict(residual.SHORTCUT_FORMULAS), dict(FAMILIES), set(sys.modules)
    metrics, kinds, formats = {m.name for m in registered()}, set(source_kinds()), set(MODEL_FORMATS)
    imports = set(IMPORT_FORMATS)
    yield
    for name in set(MODEL_FORMATS) - formats:
        unregister_model_format(name)
    for name in set(IMPORT_FORMATS) - imports:
        unregister_import_format(name)
    residual.SHORTCUT_FORMULAS.clear()
    residual.SHORTCUT_FORMULAS.update(formulas)
    FAMILIES.clear()
    FAMILIES.update(families)
    for name in {m.name for m in registered()} - metrics:
        unregister_metric(name)
    for kind in set(source_kinds()) - kinds:
        unregister_source(kind)
    for name in set(sys.modules) - modules:
        if name.startswith("resdecay_plugin_"):
            del sys.modules[name]


@pytest.mark.slow
def test_a_residual_formula_in_one_file_runs_through_ablate(capsys, tmp_path, registries_restored):
    cmd = shown("resdecay --plugin docs/examples/extending/two_minus.py ablate --grid "
                "docs/examples/extending/two_minus-digits.yaml --out runs/ablate/two-minus").split()[1:]
    cmd = [str(ROOT / c) if c.startswith("docs/") else c for c in cmd]
    cmd[cmd.index("--out") + 1] = str(tmp_path / "ablate")
    code, out, err = run(capsys, *cmd, *TINY, *FAST, "--no-progress")
    assert code == 0, err
    rows = json.loads((tmp_path / "ablate" / "ablate.json").read_text())["rows"]
    assert set(rows) == {"plain", "decay 0.6", "two_minus 0.6"} and "two_minus 0.6" in out
    assert all(0 <= rows[v]["measures"]["knn_top1"] <= 1 for v in rows)
    # the same alphas as the decayed variant, the branch boosted by 2 - alpha: read off the trained model
    model, cfg = ckpt.load_model(ckpt.list_checkpoints(tmp_path / "ablate" / "two-minus-0-6" / "checkpoints")[-1])
    assert cfg.model.shortcut == "two_minus"
    assert rows["two_minus 0.6"]["alphas"] == rows["decay 0.6"]["alphas"]
    for block in model.blocks:
        (a_attn, a_mlp), (b_attn, b_mlp) = factors_of(block).alphas, factors_of(block).betas
        assert (b_attn, b_mlp) == (2.0 - a_attn, 2.0 - a_mlp)
    assert model.blocks[-1].alpha_mlp == 0.6 and model.blocks[-1].beta_mlp == 1.4


@pytest.mark.slow
def test_a_family_in_one_file_trains_resumes_and_is_evaluated_by_the_cli(capsys, tmp_path, registries_restored):
    pretrain = shown("resdecay --plugin docs/examples/extending/mixer.py pretrain --preset "
                     "docs/examples/extending/mixer-digits.yaml").split()[1:]
    pretrain = [str(ROOT / c) if c.startswith("docs/") else c for c in pretrain]
    out_dir = tmp_path / "mixer"
    code, out, err = run(capsys, *pretrain, *FAST, f"train.out_dir={out_dir}", "--no-progress")
    assert code == 0, err
    assert "mixer depth 8 | alpha_min 0.6" in out
    code, out, err = run(capsys, *pretrain, *FAST, "train.epochs=3", f"train.out_dir={out_dir}", "--resume", "auto",
                         "--no-progress")
    assert code == 0 and "resumed from" in out, err
    last = ckpt.list_checkpoints(out_dir / "checkpoints")[-1]
    shown("resdecay --plugin docs/examples/extending/mixer.py eval runs/mixer-digits/checkpoints/")
    shown("resdecay --plugin docs/examples/extending/rankme.py eval runs/mixer-digits/checkpoints/")
    code, out, err = run(capsys, "--plugin", str(EXAMPLES / "mixer.py"), "--plugin", str(EXAMPLES / "rankme.py"), "eval",
                         str(last), "--evals", "knn,rankme", "--probe-epochs", "2", "--no-progress")
    assert code == 0, err
    report = json.loads((out_dir / "eval" / "eval.json").read_text())
    rows = {row["metric"]: row for row in report["results"]}
    assert set(rows) == {"knn", "rankme"}
    assert rows["rankme"]["values"]["rankme"] > 1 and "singular values" in rows["rankme"]["protocol"]["form"]
    assert rows["knn"]["protocol"]["k"] == 20 and rows["knn"]["layer"] == 7  # the mixer's last block
    assert "RankMe" in out  # the report table has the plugin metric's column
    # issue 38 item 10: every eval.json records the plugins loaded (the features path; tests/eval/test_segmentation.py
    # checks the segmentation-only one)
    assert {str((EXAMPLES / f).resolve()) for f in ("mixer.py", "rankme.py")} <= set(report["plugins"])


def test_the_plugin_formula_reaches_the_plugin_family(capsys, tmp_path, registries_restored):
    """(a) x (b): a formula from one file and a family from another meet through the registries only."""
    from resdecay.cli.plugins import load_plugin
    from resdecay.models import build_model
    from resdecay.train.config import load_config

    load_plugin(str(EXAMPLES / "two_minus.py"))
    load_plugin(str(EXAMPLES / "mixer.py"))
    cfg = load_config(str(EXAMPLES / "mixer-digits.yaml"), ["model.shortcut=two_minus", "model.depth=3"])
    model = build_model(cfg.model)
    for p in model.parameters():  # leave the zero init (the branches start at 0): a real check of both adds
        torch.nn.init.normal_(p, std=0.1)
    x = torch.randn(2, 16, 64)
    block = model.blocks[1]
    a, b = factors_of(block).alphas, factors_of(block).betas
    assert b == (2.0 - a[0], 2.0 - a[1]) and a[0] < 1.0
    mixed = block.token_mlp(block.norm1(x).transpose(1, 2)).transpose(1, 2)
    h = a[0] * x + b[0] * mixed
    assert torch.allclose(block(x), a[1] * h + b[1] * block.channel_mlp(block.norm2(h)), atol=1e-6)


def test_a_missing_or_broken_plugin_is_one_line(capsys, tmp_path, monkeypatch, registries_restored):
    from helpers import assert_one_line_error

    code, _, err = run(capsys, "--plugin", str(tmp_path / "nope.py"), "presets")
    assert_one_line_error(code, err, "nope.py: no such file", "path of a .py file")
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\nraise RuntimeError('my formula is wrong')\n")
    code, _, err = run(capsys, "--plugin", str(broken), "presets")
    assert_one_line_error(code, err, "plugin", "broken.py failed to load: RuntimeError: my formula is wrong")
    monkeypatch.setenv("RESDECAY_PLUGINS", str(tmp_path / "gone.py"))  # the environment's plugins, the same way
    code, _, err = run(capsys, "presets")
    assert_one_line_error(code, err, "gone.py: no such file")


def _cka_module():
    """docs/examples/extending/cka.py as ``--plugin`` loads it (registered; removed by ``registries_restored``)."""
    from resdecay.cli.plugins import load_plugin

    load_plugin(str(EXAMPLES / "cka.py"))
    return next(m for n, m in sys.modules.items() if n.startswith("resdecay_plugin_cka_"))


def _textbook_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Kornblith et al. 2019 written out: HSIC of centred N x N linear Gram matrices, normalised."""
    n = len(x)
    h = np.eye(n) - np.full((n, n), 1.0 / n)
    k, l = h @ (x @ x.T) @ h, h @ (y @ y.T) @ h
    return float((k * l).sum() / np.sqrt((k * k).sum() * (l * l).sum()))


def test_linear_cka_is_the_textbook_formula(registries_restored):
    """(d)'s function against the definition on random data, and the invariances that make CKA a similarity."""
    linear_cka = _cka_module().linear_cka
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(50, 8, generator=g, dtype=torch.float64), torch.randn(50, 12, generator=g, dtype=torch.float64)
    y = y + x @ torch.randn(8, 12, generator=g, dtype=torch.float64)  # related, so the value is neither 0 nor 1
    value = linear_cka(x, y)
    assert value == pytest.approx(_textbook_cka(x.numpy(), y.numpy()), abs=1e-12)
    assert 0.2 < value < 0.999 and linear_cka(y, x) == pytest.approx(value, abs=1e-12)
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)
    q, _ = torch.linalg.qr(torch.randn(8, 8, generator=g, dtype=torch.float64))  # an orthogonal transform
    assert linear_cka(x @ q, y) == pytest.approx(value, abs=1e-12)
    assert linear_cka(3.5 * x, 0.01 * y) == pytest.approx(value, abs=1e-12)  # isotropic scaling
    assert linear_cka(x + 7.0, y - 2.0) == pytest.approx(value, abs=1e-12)  # a shift (features are centred)
    assert linear_cka(x * torch.linspace(0.1, 3.0, 8, dtype=torch.float64), y) != pytest.approx(value, abs=1e-3)  # not per-axis scaling
    assert linear_cka(x, torch.ones(50, 3)) == 0.0  # a constant block
    assert linear_cka(x.float(), y.float()) == pytest.approx(value, abs=1e-6)  # float32 features: computed in float64


def test_a_metric_over_two_blocks_in_one_file_runs_through_eval(tiny_checkpoints, capsys, tmp_path, registries_restored):
    """(d): linear CKA between the first and the last block through ``resdecay eval --evals cka``, checked
    against CKA computed here from the same blocks' features."""
    from resdecay.eval.features.extract import extract_block_features
    from resdecay.eval.inputs import eval_split
    from resdecay.eval.suite import EvalSettings, checked_checkpoint

    shown("resdecay --plugin docs/examples/extending/cka.py eval runs/mixer-digits/checkpoints/step_00000440.pt --evals cka")
    shown("--evals knn,cka --layer all --metric-option cka.reference=-1")
    ck = tiny_checkpoints["decayed"]
    common = ["--no-progress", "--cache-dir", str(tmp_path / "cache")]
    code, out, err = run(capsys, "--plugin", str(EXAMPLES / "cka.py"), "eval", ck, "--evals", "cka", *common,
                         "--out", str(tmp_path / "one"))
    assert code == 0, err
    report = json.loads(next((tmp_path / "one").glob("*/eval.json")).read_text())
    (row,) = report["results"]
    assert (row["metric"], row["layer"], row["feature"]) == ("cka", 3, "mean") and "baselines" not in report
    assert row["protocol"]["blocks"] == [0, 3] and row["protocol"]["reference"] == 0
    assert "Kornblith" in row["protocol"]["form"] and row["protocol"]["test"]["images"] == 360
    assert "linear CKA of blocks [0, 3]" in out
    # the same number from the blocks' features extracted here, by the textbook formula
    state, cfg, data = checked_checkpoint(ck, EvalSettings())
    model = ckpt.load_model(ck)[0]
    feats, _ = extract_block_features(model, eval_split(data, "test", cfg.model.img_size), [0, 3], ("mean",),
                                      progress=False)
    first, last = feats[(0, "mean")].double().numpy(), feats[(3, "mean")].double().numpy()
    assert row["values"]["cka"] == pytest.approx(_textbook_cka(first, last), abs=1e-9)
    assert 0.5 < row["values"]["cka"] < 0.999
    # the reference block is the metric's own option; the profile gives every block against it
    code, out, err = run(capsys, "--plugin", str(EXAMPLES / "cka.py"), "eval", ck, "--evals", "knn,cka", "--layer", "all",
                         "--metric-option", "cka.reference=-1", "--probe-epochs", "2", *common, "--out", str(tmp_path / "all"))
    assert code == 0, err
    profile = json.loads(next((tmp_path / "all").glob("*/profile.json")).read_text())["profile"]
    assert [r["layer"] for r in profile] == [0, 1, 2, 3] and all("knn_top1" in r for r in profile)
    assert profile[3]["cka"] == pytest.approx(1.0, abs=1e-12)
    assert profile[0]["cka"] == pytest.approx(_textbook_cka(last, first), abs=1e-9)
    assert_one_line_error(*run(capsys, "--plugin", str(EXAMPLES / "cka.py"), "eval", ck, "--evals", "cka",
                               "--metric-option", "cka.reference=first", *common, "--out", str(tmp_path / "x"))[::2],
                          "cka.reference takes an integer, got 'first'")


def test_a_new_input_kind_in_one_file_runs_through_eval(tiny_checkpoints, capsys, tmp_path, registries_restored):
    """(e): a source and a metric of a new input kind (the MAE's pixel reconstructions) in one plugin file,
    through the unchanged ``resdecay eval``: its number is the MAE's own loss on the same images and masks."""
    from resdecay.eval.inputs import eval_split
    from resdecay.eval.suite import EvalSettings, checked_checkpoint

    shown("resdecay --plugin docs/examples/extending/reconstruction.py eval RUN/checkpoints/step_N.pt --evals knn,recon_mse")
    ck = tiny_checkpoints["decayed"]
    code, out, err = run(capsys, "--plugin", str(EXAMPLES / "reconstruction.py"), "eval", ck, "--evals", "knn,recon_mse",
                         "--metric-option", "recon_mse.images=40", "--no-progress", "--no-baselines",
                         "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "one"))
    assert code == 0, err
    report = json.loads(next((tmp_path / "one").glob("*/eval.json")).read_text())
    assert [r["metric"] for r in report["results"]] == ["knn", "recon_mse"]
    row = report["results"][1]
    assert row["protocol"]["images"] == 40 and row["protocol"]["test"]["images"] == 40 and row["feature"] == "pixels"
    assert "recon_mse" in out and "digits test 40" in out  # the report table: metric, value, protocol
    state, cfg, data = checked_checkpoint(ck, EvalSettings())
    model = ckpt.load_model(ck)[0]
    test = eval_split(data, "test", cfg.model.img_size)
    torch.manual_seed(0)
    with torch.no_grad():
        loss = model(torch.stack([test[i][0] for i in range(40)]))[0]
    assert row["values"]["mse"] == pytest.approx(float(loss), rel=1e-5)


def test_a_model_format_in_one_file_runs_through_eval(capsys, tmp_path, registries_restored):
    """(f): ``zoo:NAME`` from a plugin file is measured by the unchanged ``resdecay eval``: with the same weights,
    the same numbers as the built-in ``timm:`` format building the same ViT; a name the zoo lacks is one line."""
    import timm

    shown("resdecay --plugin docs/examples/extending/model_format.py eval --model zoo:digits-vit --weights W.pth --data digits")
    zoo = dict(img_size=8, patch_size=2, in_chans=1, depth=3, embed_dim=32, num_heads=2)
    torch.manual_seed(3)
    weights = tmp_path / "w.pth"
    torch.save(timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, **zoo).state_dict(), weights)
    common = ["--weights", str(weights), "--data", "digits", "--evals", "knn,rank", "--max-train", "200", "--max-test",
              "100", "--no-progress"]
    code, out, err = run(capsys, "--plugin", str(EXAMPLES / "model_format.py"), "eval", "--model", "zoo:digits-vit",
                         *common, "--out", str(tmp_path / "zoo"))
    assert code == 0, err
    mine = json.loads((tmp_path / "zoo" / "zoo-digits-vit" / "eval.json").read_text())
    assert mine["label"] == "zoo:digits-vit (plain)" and mine["step"] is None
    assert {b["source"] for b in mine["baselines"]} == {"pixels", "random-init"}
    model_args = [a for k, v in zoo.items() for a in ("--model-arg", f"{k}={v}")]
    code, _, err = run(capsys, "eval", "--model", "timm:vit_tiny_patch16_224", *model_args, *common,
                       "--out", str(tmp_path / "timm"))
    assert code == 0, err
    built_in = json.loads(next((tmp_path / "timm").glob("*/eval.json")).read_text())
    assert [r["values"] for r in mine["results"]] == [r["values"] for r in built_in["results"]]
    assert [r["values"] for r in mine["baselines"]] == [r["values"] for r in built_in["baselines"]]
    assert mine["checkpoint_sha256"] == built_in["checkpoint_sha256"]  # the cache key: the weights file
    code, _, err = run(capsys, "--plugin", str(EXAMPLES / "model_format.py"), "eval", "--model", "zoo:resnet",
                       *common, "--out", str(tmp_path / "bad"))
    assert_one_line_error(code, err, "zoo:resnet", "digits-vit, digits-vit-deep")
    assert not (tmp_path / "bad").exists()


def test_a_source_of_pretrained_weights_in_one_file_runs_through_import_weights_finetune_and_pretrain(
        capsys, tmp_path, monkeypatch, registries_restored):
    """(g): a lab's checkpoint layout (DDP's ``module.`` keys under ``net``, its decay under ``decay``) from a plugin
    file: import-weights converts it to the lab's model, weight for weight; finetune --from detects it and trains the
    classifier that fine-tuning from the same weights as a resdecay checkpoint trains; pretrain --from continues it
    (its first loss is the lab model's) and records it. The page shows the whole file this test runs."""
    (block,) = [code for title, code in python_blocks(GUIDE).items() if title.startswith("(g) ")]
    assert block == (EXAMPLES / "lab_mae.py").read_text()
    shown("resdecay --plugin docs/examples/extending/lab_mae.py import-weights lab_run.pt --format lab-mae")
    shown("resdecay --plugin docs/examples/extending/lab_mae.py finetune --from lab_run.pt --import-preset mae-b16")
    src, cfg = resdecay_checkpoint(tmp_path / "src.pt", "mae-tiny-digits", ["model.skips=false"])  # alpha_min 0.6
    lab = tmp_path / "lab_run.pt"
    torch.save({"net": {f"module.{k}": v for k, v in src.state_dict().items()}, "decay": 0.6, "epoch": 3}, lab)
    plugin = ["--plugin", str(EXAMPLES / "lab_mae.py")]
    heads = ["model.num_heads=2", "model.decoder_num_heads=2"]
    imported = ["import-weights", lab, "--format", "lab-mae", "--preset", "mae-tiny-digits", "--out", tmp_path / "imp.pt"]
    code, out, err = run(capsys, *plugin, *imported, *heads)
    assert code == 0, err
    model, imported_cfg = ckpt.load_model(tmp_path / "imp.pt")
    assert imported_cfg.model.alpha_min == 0.6 and not imported_cfg.model.skips and same_mae_outputs(src, model)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in src.state_dict().items())
    record = ckpt.load_checkpoint(tmp_path / "imp.pt")["imported_from"]
    assert record["format"] == "lab-mae" and record["stated_by_file"]["alpha_min"] == "0.6 (its 'decay')"
    assert_one_line_error(*run(capsys, *plugin, *imported, *heads, "--alpha-min", "0.9")[::2],
                          "stores alpha_min 0.6 but --alpha-min is 0.9")
    # finetune --from: detected, and the same run as from the resdecay checkpoint of the same weights
    fast = ["train.epochs=1", "train.batch_size=64", "data.train_subset=256", "train.warmup_epochs=0", "train.lr=3e-3",
            "mixup=0", "cutmix=0", "drop_path=0", "--no-progress"]
    code, out, err = run(capsys, *plugin, "finetune", "--from", lab, "--import-preset", "mae-tiny-digits",
                         *(a for h in heads for a in ("--import-override", h)), *fast, "--out", tmp_path / "a")
    assert code == 0, err
    assert run(capsys, "finetune", "--from", tmp_path / "src.pt", *fast, "--out", tmp_path / "b")[0] == 0
    a, b = (json.loads((tmp_path / n / "summary.json").read_text()) for n in "ab")
    assert a["pretrained"]["format"] == "lab-mae" and a["pretrained"]["sha256"] == file_sha256(lab)
    assert (a["final_top1"], a["final_top5"]) == (b["final_top1"], b["final_top5"])
    wa, wb = (ckpt.load_checkpoint(ckpt.list_checkpoints(tmp_path / n / "checkpoints")[-1])["model"] for n in "ab")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    # pretrain --from: the first step's loss is the lab model's on that batch and masking noise
    seen, forward = {}, MaskedAutoencoder.forward

    def recording(self, imgs, mask_ratio=None):
        if not seen:
            seen.update(imgs=imgs.detach().clone(), rng=torch.get_rng_state())
        return forward(self, imgs, mask_ratio)

    monkeypatch.setattr(MaskedAutoencoder, "forward", recording)
    short = ["train.epochs=1", "train.warmup_epochs=1", "train.batch_size=32", "data.train_subset=64", "train.log_every=1",
             "train.loggers=[]", "--no-progress"]
    code, out, err = run(capsys, *plugin, "pretrain", "--preset", "mae-tiny-digits", "--from", lab, "--out", tmp_path / "c",
                         *(a for h in heads for a in ("--import-override", h)), *model_overrides("mae"), "model.skips=false",
                         *short)
    assert code == 0, err
    assert "continuing pretraining from" in out and "lab MAE" in out
    first = json.loads((tmp_path / "c" / "log.jsonl").read_text().splitlines()[0])
    torch.set_rng_state(seen["rng"])
    with torch.no_grad():
        assert first["step"] == 1 and first["loss"] == pytest.approx(src.train()(seen["imgs"])[0].item(), rel=1e-6)
    assert json.loads((tmp_path / "c" / "pretrained.json").read_text())["format"] == "lab-mae"


def test_a_residual_update_in_one_file_reaches_the_blocks():
    """(a′): the page's file registers an update and a formula naming it; an MAE built with it adds, per token,
    f minus half its projection on x (by hand), and the page shows the file as it is."""
    import runpy

    from resdecay.models.mae import TINY_MAE, MAEConfig
    from resdecay.nn.residual import unregister_shortcut
    from resdecay.nn.updates import unregister_update
    source = (EXAMPLES / "half_orthogonal.py").read_text()
    assert source.split('"""', 2)[2].strip() in GUIDE  # the page shows the file's code, line for line
    runpy.run_path(str(EXAMPLES / "half_orthogonal.py"))
    try:
        torch.manual_seed(0)
        model = MaskedAutoencoder(MAEConfig(**{**TINY_MAE, "shortcut": "half_orthogonal"})).eval()
        blk, x = model.blocks[0], torch.randn(2, 5, TINY_MAE["embed_dim"])
        with torch.no_grad():
            f = blk.attn(blk.norm1(x))
            h = x + f - 0.5 * ((x * f).sum(-1, keepdim=True) / ((x * x).sum(-1, keepdim=True) + 1e-6)) * x
            g = blk.mlp(blk.norm2(h))
            want = h + g - 0.5 * ((h * g).sum(-1, keepdim=True) / ((h * h).sum(-1, keepdim=True) + 1e-6)) * h
            assert torch.allclose(blk(x), want, atol=1e-6)
    finally:
        unregister_shortcut("half_orthogonal")
        unregister_update("half_orthogonal")
