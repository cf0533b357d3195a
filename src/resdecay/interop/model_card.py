"""The README.md model card of a ``save_pretrained`` folder, written from its config.json and eval.json.

huggingface_hub's layout: YAML front matter (``library_name: resdecay``, tags with the paper's
``arxiv:2404.10947``, a pipeline tag, ``license`` -- ``unknown`` where none was given --, the
training ``datasets`` and a ``model-index`` of eval.json's results, which the hub shows as
evaluation results), then the body. Every number on the card says how it was obtained: the
decay's ``alpha_eff`` its definition, the training figures where they come from, and each
evaluation number the protocol ``resdecay eval`` printed beside it (``eval.reports.protocol_text``:
data, split sizes, the metric's registered protocol card), so a number read off a hub page can be
compared only with numbers measured the same way.
"""

from __future__ import annotations

import json

import yaml

from ..eval.metrics import get_metric
from ..eval.reports import protocol_text, values_text
from ..models import is_diffusion
from .pretrained_config import architecture_dict

PIPELINE = {"mae": "image-feature-extraction", "classifier": "image-classification", "resnet": "image-classification"}
PAPER = "x_{l+1} = α_l · x_l + f_l(x_l) (Zhang et al., CVPR 2026, [arXiv:2404.10947](https://arxiv.org/abs/2404.10947))"
ARXIV = "2404.10947"
# model-index task of each eval metric: kNN and the linear probe classify frozen features
TASKS = {"knn": ("image-classification", "kNN classification of frozen features"),
         "linear_probe": ("image-classification", "linear probe on frozen features"),
         "probe": ("image-classification", "linear probe on frozen features")}
ALPHA_EFF = ("the product of every shortcut factor of the encoder / backbone (paper §3): how much of the input reaches "
             "the last block through the identity path")


def _cell(text: object) -> str:
    """A markdown table cell: pipes escaped, one line."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(header: tuple[str, ...], rows: list[tuple]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(_cell(c) for c in row) + " |" for row in rows)]


def front_matter(config: dict, license: str | None, report: dict | None = None, name: str = "model") -> str:
    """The card's YAML metadata block."""
    family = config.get("family")
    arch = architecture_dict(config) or {}
    data = (config.get("data") or {}).get("name")
    tags = ["resdecay", "decayed-identity-shortcuts", f"arxiv:{ARXIV}",
            *(t for t in (family, arch.get("library"), arch.get("name"), data) if t)]
    meta: dict = {"library_name": "resdecay", "license": license or "unknown", "tags": list(dict.fromkeys(tags))}
    if family in PIPELINE:
        meta["pipeline_tag"] = PIPELINE[family]
    elif family is None and arch.get("library") == "timm":
        meta["pipeline_tag"] = "image-feature-extraction"
    if data:
        meta["datasets"] = [data]
    if report is not None and report.get("results"):
        meta["model-index"] = model_index(name, report)
    return "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True) + "---\n"


def model_index(name: str, report: dict) -> list[dict]:
    """huggingface_hub's ``model-index``: one result per eval.json row, each shown value a metric,
    the row's test data as the dataset and its layer / feature in the metric's name."""
    results = []
    for row in report["results"]:
        test = (row.get("protocol") or {}).get("test") or {}
        data = str(test.get("data") or "unknown")
        task, task_name = TASKS.get(row["metric"], ("image-feature-extraction", f"{row['metric']} of frozen features"))
        m = get_metric(row["metric"])
        keys = m.display.report_values if m is not None else list(row["values"])
        metrics = [{"type": f"{row['metric']}_{k}", "value": float(row["values"][k]),
                    "name": f"{row['metric']} {k} (block {row.get('layer')}, {row.get('feature')} features)"}
                   for k in keys if isinstance(row["values"].get(k), (int, float)) and not isinstance(row["values"][k], bool)]
        if metrics:
            results.append({"task": {"type": task, "name": task_name},
                            "dataset": {"name": data, "type": data, "split": str(test.get("split") or "test")},
                            "metrics": metrics, "source": {"name": "resdecay eval", "url": f"https://arxiv.org/abs/{ARXIV}"}})
    return [{"name": name, "results": results}]


def _what(config: dict) -> str:
    if config["kind"] == "resdecay":
        return f"A resdecay `{config['family']}` model with decayed identity shortcuts"
    arch = architecture_dict(config)
    return f"A {arch['library']} `{arch['name']}` whose identity shortcuts `resdecay.decayify` decayed"


def decay_lines(config: dict) -> list[str]:
    """The decay: its settings, alpha_eff with its definition, and every block's factors."""
    alpha = config["alpha"]
    rows = [(k, v if isinstance(v, str) else json.dumps(v)) for k, v in alpha.items() if k not in ("alpha_eff", "factors")]
    rows.append(("alpha_eff", f"{alpha['alpha_eff']:.4g}: {ALPHA_EFF}"))
    lines = ["## Shortcut decay (α)", "", *_table(("setting", "value"), rows), ""]
    if "resdecay_spec" in config:
        lines += [f"The α spec (`model.resdecay_spec`, re-applied by `from_pretrained`): `{json.dumps(config['resdecay_spec'])}`", ""]
    lines += ["Shortcut factor of every residual add, per block (attention, MLP for transformer blocks):", "",
              *_table(("block", "factors"), [(name, ", ".join(f"{a:.4f}" for a in fs)) for name, fs in alpha["factors"]]), ""]
    return lines


def training_lines(config: dict) -> list[str]:
    """Preset, data, inputs and training length, each with where it comes from."""
    lines = ["## Training", ""]
    train, data, weights = config.get("training"), config.get("data"), config.get("weights")
    rows = []
    if config.get("preset"):
        rows.append(("preset", config["preset"]))
    if data:
        rows.append(("data", f"{data['name']} (augmentation {data.get('augment')}, normalisation {data.get('normalize')})"
                     + (f", first {data['train_subset']} training images" if data.get("train_subset") else "")))
    model = config.get("model") or {}
    if "img_size" in model or "encoder" in model:
        enc = model.get("encoder") or model
        rows.append(("input", f"{enc.get('img_size')} px square, {enc.get('in_chans')} channel(s), normalised as the data above"))
    if train:
        if train.get("steps") is not None:
            rows.append(("training length", f"{train['steps']} optimizer steps, train.epochs={train.get('epochs')} over "
                         f"{train.get('images')} images, effective batch {train.get('effective_batch')} (the run's summary.json)"))
        if train.get("lr") is not None:
            rows.append(("learning rate", f"{train['lr']:.3g} (peak, after warmup)"))
        if train.get("final_loss") is not None:
            rows.append(("final loss", f"{train['final_loss']:.4f} (training objective, mean over the last logged window)"))
        if train.get("train_time_s") is not None:
            rows.append(("training time", f"{train['train_time_s']:.3g} s (summed over every launch)"))
    elif config.get("train"):  # the run's config without its summary: what was planned, not what ran
        planned = config["train"]
        rows.append(("training length", f"train.epochs={planned.get('epochs')} at batch {planned.get('batch_size')} per device "
                     "as configured (the run's summary.json was not given: pass run_dir= for the steps it trained)"))
    if weights:
        rows.append(("weights", f"{weights.get('weights', 'model')} weights of {weights.get('checkpoint')}, step "
                     f"{weights.get('step')} (epoch {weights.get('epoch')})"))
    if not rows:
        return lines + ["Not recorded: the model was saved without its run (pass `run_dir=` to `save_pretrained`), so "
                        "its data and training length are unknown here.", ""]
    return lines + [*_table(("", ""), rows), ""]


def _protocol(row: dict) -> str:
    """A result's protocol in words; a metric not registered now (its plugin not loaded) keeps its raw card."""
    text = protocol_text(row)
    if get_metric(row["metric"]) is None:
        card = {k: v for k, v in row["protocol"].items() if k not in ("train", "test", "checkpoint_sha256")}
        text = text.removesuffix("; -") + "; " + json.dumps(card, sort_keys=True)
    return text


def evaluation_lines(config: dict, report: dict | None) -> list[str]:
    """eval.json's numbers, each with its protocol, then the baselines measured the same way."""
    if report is None:
        return ["## Evaluation", "", "No evaluation was given (`resdecay eval` the run, then save again with its "
                "`run_dir=` / `eval_json=`).", ""]
    ev = config.get("evaluation") or {}
    sha = str(report.get("checkpoint_sha256") or "")[:12]
    lines = ["## Evaluation", "", f"Measured by `resdecay eval` on step {report.get('step')} (checkpoint sha256 {sha}); "
             "each number with its protocol. The full report, protocol cards included, is `eval.json`.", ""]
    if ev.get("matches_weights") is False:
        lines += [f"**Note:** these numbers were measured on another checkpoint of the run (step {report.get('step')}) "
                  f"than the weights shared here (step {(config.get('weights') or {}).get('step')}).", ""]
    lines += _table(("metric", "layer", "feature", "value", "protocol"),
                    [(r["metric"], r.get("layer"), r.get("feature"), values_text(r), _protocol(r)) for r in report["results"]])
    base = report.get("baselines") or []
    if base:
        lines += ["", "Baselines, same protocol: raw pixels and the randomly initialised model.", "",
                  *_table(("source", "metric", "layer", "feature", "value", "protocol"),
                          [(r.get("source"), r["metric"], "-" if r.get("layer") is None else r["layer"], r.get("feature"),
                            values_text(r), _protocol(r)) for r in base])]
    return lines + [""]


def usage_lines(config: dict, name: str) -> list[str]:
    code = ["import resdecay", "", f"model = resdecay.from_pretrained({name!r})  # a folder, or a hub id user/name",
            "config = model.resdecay_config  # this folder's config.json"]
    if config["kind"] == "resdecay" and not is_diffusion(config["family"]):
        code.append("features = resdecay.extract_features(model, images, layer=-1)  # {block: (N, D)}, mean of all tokens")
    elif config["kind"] == "decayified":
        code.append(f"out = model(images)  # the {architecture_dict(config)['library']} model, its decay re-applied")
    return ["## Use", "", "```python", *code, "```", "",
            "`from_pretrained` rebuilds the model, re-applies the decay and refuses weights whose factors differ from "
            "the ones above. Files: `config.json` (model, α spec, run settings), `model.safetensors` (weights; its "
            "metadata repeats the config), this card" + (", `eval.json`." if config.get("evaluation") else ".")
            + " `model.save_pretrained(folder)` / `model.push_to_hub('user/name')` share it again. timm's "
            "`create_model('hf-hub:...')` refuses the folder (`Unknown model (resdecay:...)`): as a plain timm model "
            "it would run without its decay.", ""]


def model_card(config: dict, report: dict | None, name: str, license: str | None = None) -> str:
    """The README.md text of a save_pretrained folder.

    Args:
        config: its config.json (``pretrained_config``).
        report: the eval.json reported, or None.
        name: how the usage snippet names the folder / repository.
        license: a license identifier for the metadata, or None.
    """
    intro = (f"{_what(config)}, {PAPER}, saved with resdecay "
             f"{config.get('resdecay_version')}.")
    body = [f"# {name}", "", intro, "", *decay_lines(config), *training_lines(config), *evaluation_lines(config, report),
            *usage_lines(config, name)]
    return front_matter(config, license, report, name) + "\n" + "\n".join(body)
