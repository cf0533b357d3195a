"""Sharing a trained model as a folder, the way timm and diffusers models are shared on a hub.

``save_pretrained(model, folder)`` writes huggingface_hub's layout::

    config.json          what rebuilds the model and its alphas (``pretrained_config.py``), the
                         resdecay version, and where known the run's preset, data, training length
    model.safetensors    the state_dict; its metadata repeats config.json (and the ``resdecay_spec``
                         of a decayified model), so the bare weights file still carries its alphas
    README.md            the model card (``model_card.py``): the decay, the training, and every
                         evaluation number with its protocol
    eval.json            the evaluation it was given (``resdecay eval``'s report), when one was

``from_pretrained(folder_or_hub_id)`` returns the model, config.json as ``model.resdecay_config``:
it rebuilds it, re-applies the decay, loads the weights strictly and checks the factors against
config.json. A folder is read offline; only a hub id (``user/name`` that is not a folder here)
goes through ``huggingface_hub.snapshot_download``. ``push_to_hub(folder, repo_id)`` uploads a
folder; nothing else here opens a connection. Models from resdecay also have these as methods,
``model.save_pretrained(folder)`` and ``model.push_to_hub(repo_id)`` (``hub_model.py``).
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch.nn as nn

from ..errors import CheckpointError, UserError
from ..io import file_sha256, run_dir_of
from ..nn.spec import unwrap_compiled
from ..train.checkpoint import list_checkpoints, load_checkpoint, load_model
from ..train.config import RunConfig, from_dict
from ..train.sharded_checkpoint import is_dcp_folder
from .checkpoint_io import CARD_NAME, CONFIG_NAME, EVAL_NAME, WEIGHTS_NAME, load_folder
from .files import check_out_file, read_json_object, write_bytes_atomically
from .hub_model import with_hub_methods
from .model_card import model_card
from .pretrained_config import FORMAT, describe_decayified, describe_resdecay, family_config

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # user/name, as huggingface_hub's validate_repo_id
TRAINING_KEYS = ("steps", "epochs", "images", "effective_batch", "lr", "final_loss", "train_time_s")
HUB_EXTRA = "huggingface_hub is not installed; pip install 'resdecay[hub]' (or pip install huggingface_hub)"


@dataclass
class RunRecord:
    """What a run folder says about a model: its config, summary.json and an eval.json (each may be None)."""

    config: RunConfig | None = None
    summary: dict | None = None
    evaluation: dict | None = None
    eval_path: Path | None = None


def read_run(run_dir: str | Path | None, eval_json: str | Path | None, config: RunConfig | None) -> RunRecord:
    """The run record of ``save_pretrained``'s ``run_dir`` / ``eval_json`` / ``config`` arguments.

    ``run_dir`` gives ``summary.json``, ``eval/eval.json`` (unless ``eval_json`` names another) and,
    without ``config``, the config of the run's checkpoint.
    """
    record = RunRecord(config=config)
    if run_dir is not None:
        run_dir = Path(run_dir)
        if not run_dir.is_dir():
            raise UserError(f"run_dir {run_dir} is not a folder; pass the run folder (train.out_dir) the model came from")
        if (run_dir / "summary.json").is_file():
            record.summary = read_json_object(run_dir / "summary.json", "summary.json", "pass a run folder resdecay train wrote")
        if eval_json is None and (run_dir / "eval" / "eval.json").is_file():
            eval_json = run_dir / "eval" / "eval.json"
        if config is None:
            ckpts = list_checkpoints(run_dir / "checkpoints")
            if ckpts:
                record.config = from_dict(load_checkpoint(ckpts[-1])["config"])
    if eval_json is not None:
        report = read_json_object(Path(eval_json), "eval.json", "pass a report written by resdecay eval")
        if not isinstance(report.get("results"), list):
            raise UserError(f"{eval_json} holds no results; pass an eval.json written by resdecay eval (not a profile.json)")
        record.evaluation, record.eval_path = report, Path(eval_json)
    return record


def describe(model: nn.Module, record: RunRecord, architecture: str | None = None, model_kwargs: dict | None = None,
             weights: dict | None = None) -> dict:
    """The config.json of ``model`` with its run's training length and evaluation provenance."""
    cfg = family_config(model)
    if cfg is not None:
        config = describe_resdecay(model, cfg, record.config)
    else:
        config = describe_decayified(model, architecture, model_kwargs)
    if record.summary is not None:
        config["training"] = {k: record.summary.get(k) for k in ("preset", *TRAINING_KEYS) if k in record.summary}
    if weights is not None:
        config["weights"] = weights
    report = record.evaluation
    if report is not None:
        # compared as JSON both: eval.json was read back from JSON, the config is fresh from the dataclass
        if "model" in config and "model" in report and report["model"] != json.loads(json.dumps(config["model"])):
            diff = next((k for k, v in config["model"].items() if report["model"].get(k) != v), "?")
            raise UserError(f"{record.eval_path} measured another model (model.{diff}: {report['model'].get(diff)!r} vs "
                            f"{config['model'].get(diff)!r}); pass the eval.json of this model's run")
        sha = (weights or {}).get("sha256")
        config["evaluation"] = {"file": EVAL_NAME, "step": report.get("step"), "checkpoint_sha256": report.get("checkpoint_sha256"),
                                "matches_weights": None if sha is None else sha == report.get("checkpoint_sha256")}
    return config


def check_out_folder(folder: str | Path) -> Path:
    """``folder``, once it is known to be writable and not a file, nor a folder of other files (an
    earlier save_pretrained folder is overwritten, as huggingface_hub's save_pretrained does)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{folder} is a file, not a folder; pass a folder to write config.json, model.safetensors and README.md into")
    if folder.is_dir() and any(folder.iterdir()) and not _saved_here(folder):
        raise UserError(f"{folder} already holds other files; pass a new or empty folder (an earlier save_pretrained "
                        "folder is overwritten)")
    check_out_file(folder / CONFIG_NAME)
    return folder


def _saved_here(folder: Path) -> bool:
    """Whether ``folder`` holds a config.json that save_pretrained wrote."""
    try:
        return json.loads((folder / CONFIG_NAME).read_text()).get("format") == FORMAT
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return False


def save_pretrained(model: nn.Module, folder: str | Path, *, run_dir: str | Path | None = None,
                    eval_json: str | Path | None = None, config: RunConfig | None = None, architecture: str | None = None,
                    model_kwargs: dict | None = None, license: str | None = None, provenance: dict | None = None) -> Path:
    """Write ``model`` as a shareable folder: config.json, model.safetensors, README.md (+ eval.json).

    Args:
        model: a resdecay model (any registered family) or a decayified timm / torchvision model.
        folder: the folder to write (created; an earlier save_pretrained folder is overwritten).
        run_dir: the run the model came from: its summary.json (training length), eval/eval.json
            and config (preset, data) go into config.json and the model card.
        eval_json: an eval.json to report (default: ``<run_dir>/eval/eval.json`` when there is one).
        config: the run's RunConfig (as ``resdecay.load_model`` returns it), instead of reading it
            from ``run_dir``'s checkpoint.
        architecture: a decayified model's registered name (``resnet18``); timm models know theirs.
        model_kwargs: the keyword arguments a decayified model was created with (``img_size=32``);
            checked against the weights' shapes.
        license: a license identifier for the card's metadata (``mit``, ``apache-2.0``).
        provenance: where the weights come from (``checkpoint``, ``step``, ``epoch``, ``weights``,
            ``sha256``), as ``resdecay export --to hf`` records it; with ``sha256`` the card says
            whether the eval.json measured these very weights.

    Returns:
        The folder.
    """
    from safetensors.torch import save

    model = unwrap_compiled(model)  # torch.compile's wrapper: the model inside, its own keys
    folder = check_out_folder(folder)
    record = read_run(run_dir, eval_json, config)
    described = describe(model, record, architecture, model_kwargs, provenance)
    state = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
    meta = {"format": FORMAT, "resdecay_config": json.dumps(described)}
    if "resdecay_spec" in described:  # load_decayified / load_weights read it from the bare file
        meta["resdecay_spec"] = json.dumps(described["resdecay_spec"])
    write_bytes_atomically(save(state, metadata=meta), folder / WEIGHTS_NAME)
    if record.evaluation is not None:
        report = {k: v for k, v in record.evaluation.items() if k != "cache"}  # the cache entry is a local path
        write_bytes_atomically(json.dumps(report, indent=2).encode(), folder / EVAL_NAME)
    elif (folder / EVAL_NAME).is_file():  # an earlier save's report would describe other weights
        (folder / EVAL_NAME).unlink()
    card = model_card(described, record.evaluation, folder.name, license)
    write_bytes_atomically(card.encode(), folder / CARD_NAME)
    write_bytes_atomically((json.dumps(described, indent=2, allow_nan=False) + "\n").encode(), folder / CONFIG_NAME)
    return folder


def export_to_hf(checkpoint: str | Path, out: str | Path, ema: bool = False, eval_json: str | Path | None = None,
                 license: str | None = None) -> Path:
    """``resdecay export CKPT --to hf``: a checkpoint as a save_pretrained folder, with its run's
    summary and eval.json (``<run>/eval/eval.json`` unless ``eval_json`` names another).

    Args:
        checkpoint: a resdecay checkpoint of any family.
        out: the folder to write.
        ema: export the EMA weights; refused when the run kept none.
        eval_json: the evaluation to report.
        license: the card's license identifier.
    """
    if Path(checkpoint).is_dir() and not is_dcp_folder(checkpoint):  # (a sharded run's checkpoint is a folder)
        raise UserError(f"{checkpoint} is a folder; export --to hf takes a checkpoint file (<run>/checkpoints/step_*.pt), and a "
                        "save_pretrained folder is shared as it is")
    check_out_folder(out)
    state = load_checkpoint(checkpoint)
    if ema and "ema" not in state:
        raise UserError(f"{checkpoint} holds no EMA weights (the run was trained with train.ema_decay=0); drop --ema")
    model, cfg = load_model(checkpoint, ema=ema, state=state)
    ts = state.get("train_state", {})
    weights = {"checkpoint": Path(checkpoint).name, "step": ts.get("step"), "epoch": ts.get("epoch"),
               "weights": "ema" if ema else "model", "sha256": file_sha256(Path(checkpoint))}
    # the run folder's summary.json and eval/eval.json, where they exist (an import-weights output has neither)
    return save_pretrained(model, out, run_dir=run_dir_of(Path(checkpoint)), eval_json=eval_json, config=cfg,
                           license=license, provenance=weights)


# ----------------------------------------------------------------------------- loading
def resolve_folder(name_or_path: str | Path, revision: str | None = None, cache_dir: str | Path | None = None,
                   local_files_only: bool = False, token: str | bool | None = None) -> Path:
    """A local folder as it is; a hub id ``user/name`` downloaded (or found in the cache) by
    huggingface_hub; anything else one line."""
    path = Path(name_or_path)
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError(f"{path} is a file; pass the folder save_pretrained wrote (it holds {CONFIG_NAME} and {WEIGHTS_NAME})")
    if not HUB_ID.match(str(name_or_path)):
        raise CheckpointError(f"{name_or_path} is neither a folder nor a hub id like user/name; pass a folder written by "
                              "resdecay.save_pretrained or a hub repository id")
    try:
        import huggingface_hub
    except ImportError:
        raise UserError(HUB_EXTRA) from None
    try:
        local = huggingface_hub.snapshot_download(str(name_or_path), revision=revision, cache_dir=cache_dir, token=token,
                                                  local_files_only=local_files_only, library_name="resdecay",
                                                  allow_patterns=[CONFIG_NAME, WEIGHTS_NAME, CARD_NAME, EVAL_NAME])
    except Exception as e:  # no network, no such repository, no access: one line, whichever it was
        raise CheckpointError(f"cannot download {name_or_path} from the hub ({type(e).__name__}: "
                              f"{' '.join(str(e).split())[:140]}); check the id and your connection, or pass a local folder") from None
    return Path(local)


def from_pretrained(name_or_path: str | Path, *, device: str = "cpu", revision: str | None = None,
                    cache_dir: str | Path | None = None, local_files_only: bool = False,
                    token: str | bool | None = None) -> nn.Module:
    """The model a save_pretrained folder (or hub repository) holds, in eval mode, decay re-applied,
    as transformers' and timm's ``from_pretrained`` return it: the model alone.

    Args:
        name_or_path: a folder written by ``save_pretrained`` / ``resdecay export --to hf``, or a
            hub id ``user/name`` (downloaded with huggingface_hub; only then is a network used).
        device: where the model goes.
        revision, cache_dir, local_files_only, token: passed to ``huggingface_hub.snapshot_download``
            for a hub id.

    Returns:
        The model, with ``model.resdecay_config`` (config.json as a dict: ``alpha`` with settings,
        alpha_eff and factors, ``family`` / ``model`` or ``resdecay_architecture`` / ``resdecay_spec``,
        and where known ``preset``, ``data``, ``training`` and ``evaluation``) and the methods
        ``model.save_pretrained(folder)`` / ``model.push_to_hub("user/name")`` (``hub_model.py``).
        Until resdecay 0.2 it also unpacks as the former ``(model, config)`` tuple, with a
        DeprecationWarning.
    """
    folder = resolve_folder(name_or_path, revision, cache_dir, local_files_only, token)
    model, config = load_folder(folder)  # rebuilt, decay re-applied, weights strict, factors checked
    return attach_hub_methods(model.to(device).eval(), config, unpackable=True)


def push_to_hub(folder: str | Path, repo_id: str, *, private: bool | None = None, token: str | bool | None = None,
                commit_message: str = "Upload resdecay model", revision: str | None = None) -> str:
    """Upload a save_pretrained folder to a hub repository (created if missing); returns its URL.

    The folder is checked to load first (config, weights and factors), so what is pushed loads.

    Args:
        folder: a folder written by ``save_pretrained``.
        repo_id: ``user/name``.
        private: create the repository private.
        token, commit_message, revision: as ``huggingface_hub.HfApi.upload_folder``.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder; push_to_hub uploads a folder written by resdecay.save_pretrained")
    from_pretrained(folder)  # what is pushed must load: config, weights and factors
    try:
        import huggingface_hub
    except ImportError:
        raise UserError(HUB_EXTRA) from None
    api = huggingface_hub.HfApi(token=token)
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True)
        api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message=commit_message, revision=revision,
                          allow_patterns=[CONFIG_NAME, WEIGHTS_NAME, CARD_NAME, EVAL_NAME])
    except Exception as e:
        raise UserError(f"cannot push {folder} to {repo_id} ({type(e).__name__}: {' '.join(str(e).split())[:140]}); "
                        "log in with `hf auth login` (or pass token=) and check the repository id") from None
    return str(url)


# ----------------------------------------------------------------------------- the model methods
_push_folder = push_to_hub  # the methods' ``push_to_hub`` argument (huggingface_hub's signature) shadows the name
def _save_pretrained(self, save_directory, *, push_to_hub: bool = False, repo_id: str | None = None, **kwargs):
    """Write this model as a shareable folder (``resdecay.save_pretrained``'s keyword arguments:
    run_dir, eval_json, config, architecture, model_kwargs, license, provenance); with
    ``push_to_hub=True`` upload it too (to ``repo_id``, default the folder's name) and return the URL."""
    push_kwargs = {k: kwargs.pop(k) for k in ("private", "token", "commit_message", "revision") if k in kwargs}
    folder = save_pretrained(self, save_directory, **kwargs)
    if push_to_hub:
        return _push_folder(folder, repo_id or Path(folder).name, **push_kwargs)
    return folder


def _push_to_hub(self, repo_id: str, *, private: bool | None = None, token: str | bool | None = None,
                 commit_message: str = "Upload resdecay model", revision: str | None = None, **save_kwargs) -> str:
    """Save this model into a temporary folder (``save_kwargs`` as ``save_pretrained``'s) and
    upload it to the hub repository ``repo_id``; returns its URL."""
    with tempfile.TemporaryDirectory(prefix="resdecay-push-") as tmp:
        folder = save_pretrained(self, Path(tmp) / repo_id.split("/")[-1], **save_kwargs)
        return push_to_hub(folder, repo_id, private=private, token=token, commit_message=commit_message, revision=revision)


def attach_hub_methods(model: nn.Module, config: dict | None = None, unpackable: bool = False) -> nn.Module:
    """``model`` with ``save_pretrained`` / ``push_to_hub`` methods (``hub_model.with_hub_methods``)."""
    return with_hub_methods(model, _save_pretrained, _push_to_hub, config, unpackable)
