"""Top-1 / top-5 of a classifier on a labelled split: the library side of ``resdecay finetune``,
``resdecay eval-classifier`` and ``resdecay train-supervised``.

Measured as facebookresearch/mae's ``engine_finetune.evaluate`` does: the test transform (no
augmentation), the label among the 1 / 5 highest logits, every image once.

- ``split_counts``: the correct counts over a split; under torchrun each rank takes every
  world_size-th image and the counts are all-reduced (MAE's ``--dist_eval``, without its
  DistributedSampler padding, which counts some images twice), so the number equals a one-process one.
- ``EpochEval``: ``resdecay finetune``'s epoch-end training hook (every ``train.online_eval_every``
  epochs and at the last): logs ``eval_top1`` / ``eval_top5`` with their protocol, prints one line, and
  keeps the best epoch's weights in ``<run>/checkpoints/best.pt`` (atomically; a resumed run
  finds its best so far in its log).
- ``evaluate_classifier``: the same measurement of a saved classifier checkpoint (``resdecay
  eval-classifier``, ``commands/eval_classifier.py``, prints and writes it); on a run's final
  checkpoint it gives the number the run printed.
- ``test_accuracy``: top-1 / top-5 of any classifier checkpoint on its test split (train-supervised's
  ResNets too).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Subset

from ..data import DataConfig, build_dataset
from ..errors import CheckpointError, UserError
from ..io import atomic_save, file_sha256, progress_bar
from ..train.checkpoint import FORMAT, load_checkpoint, load_model, loaded_plugins
from ..train.distributed import resolve_device
from ..train.hooks import Hook, is_eval_epoch
from ..train.log.runlog import read_log
from .features.knn import topk_accuracy

EVAL_BATCH = 256  # one batch size for every evaluation: the same images in the same batches, the same numbers
BEST = "best.pt"  # in <run>/checkpoints/, beside the last train.keep_last step_*.pt (never pruned)


def protocol(data_name: str, split: str, images: int, device: torch.device, processes: int) -> dict:
    """How a top-1 / top-5 was measured (logged and written beside every number)."""
    return {"data": data_name, "split": split, "images": images, "augmentation": "none (the test transform)",
            "metric": "top-k: the label among the k highest logits, every image once",
            "precision": "bf16 autocast" if device.type == "cuda" else "fp32", "batch": EVAL_BATCH,
            "processes": processes, "shares": "image i on rank i mod processes, counts all-reduced"}


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@torch.no_grad()
def split_counts(model: torch.nn.Module, dataset, device: torch.device, num_workers: int = 0,
                 progress: bool = False) -> tuple[int, int, int]:
    """(top-1 correct, top-5 correct, images) of ``model`` on ``dataset``, over every rank's share."""
    rank, world = _rank_world()
    share = Subset(dataset, range(rank, len(dataset), world)) if world > 1 else dataset
    training, counts = model.training, torch.zeros(3, dtype=torch.long)
    model.eval()
    loader = DataLoader(share, batch_size=EVAL_BATCH, num_workers=num_workers)
    for images, labels in progress_bar(loader, desc="eval", disable=not progress, leave=False):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(images.to(device, non_blocking=True)).float()
        labels = torch.as_tensor(labels).to(device)
        hit = logits.topk(min(5, logits.shape[1]), dim=1).indices == labels.unsqueeze(1)
        counts += torch.tensor([int(hit[:, 0].sum()), int(hit.any(1).sum()), len(labels)])
    model.train(training)
    if world > 1:
        summed = counts.to(device)  # NCCL reduces device tensors only
        dist.all_reduce(summed)
        counts = summed.cpu()
    top1, top5, n = (int(c) for c in counts)
    return top1, top5, n


def best_in_log(out: Path) -> dict | None:
    """The best evaluation a run logged so far (a resumed run's log holds only rows up to its
    checkpoint, so this is the best of the run it continues); the first epoch wins a tie."""
    best = None
    for row in read_log(out):
        if "eval_top1" in row and (best is None or row["eval_top1"] > best["top1"]):
            best = {"top1": row["eval_top1"], "top5": row["eval_top5"], "epoch": int(row["epoch"]), "step": row["step"]}
    return best


class EpochEval(Hook):
    """The fine-tuning run's training hook: test top-1 / top-5 every ``train.online_eval_every``
    epochs (none when it is 0); ``last`` holds the latest evaluation on every rank, for
    ``resdecay finetune``'s final report."""

    def __init__(self):
        self.cfg, self.device, self.dataset = None, None, None
        self.last: dict | None = None
        self.best: dict | None = None
        self.started = False

    def start(self, cfg, device: torch.device) -> None:
        if cfg.train.online_eval_every > 0:  # the test split is read only by runs that evaluate
            self.cfg, self.device = cfg, device
            self.dataset, _ = build_dataset(cfg.data, "test", cfg.model.img_size, augment=False)

    def epoch_end(self, model, epoch: int, step: int, log) -> None:
        if self.cfg is None or not is_eval_epoch(epoch, self.cfg.train):
            return
        done = epoch + 1
        rank, world = _rank_world()
        if world > 1:  # BatchNorm statistics differ between ranks after their own last batch; rank 0's are saved
            for buffer in model.buffers():
                dist.broadcast(buffer, 0)
        top1, top5, n = split_counts(model, self.dataset, self.device, self.cfg.data.num_workers)
        card = protocol(self.cfg.data.name, "test", n, self.device, world)
        self.last = {"top1": top1 / n, "top5": top5 / n, "epoch": done, "step": step, "images": n, "protocol": card}
        if rank != 0:
            return
        if not self.started:  # a resumed run continues the best of the epochs it keeps
            self.best, self.started = best_in_log(self.cfg.out_dir), True
        if self.best is None or self.last["top1"] > self.best["top1"]:
            self.best = {k: self.last[k] for k in ("top1", "top5", "epoch", "step")}
            self._save_best(model)
        log.write({"step": step, "epoch": float(done), "eval_top1": self.last["top1"], "eval_top5": self.last["top5"],
                   "eval_images": n, "eval_best_top1": self.best["top1"], "eval_best_epoch": self.best["epoch"],
                   "eval_protocol": card})
        print(f"epoch {done}: test top-1 {self.last['top1']:.4f}, top-5 {self.last['top5']:.4f} on {n} images; "
              f"best top-1 {self.best['top1']:.4f} (epoch {self.best['epoch']})", flush=True)

    def _save_best(self, model) -> None:
        cfg, best = self.cfg, self.best
        weights = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        (Path(cfg.out_dir) / "checkpoints").mkdir(parents=True, exist_ok=True)  # the first epoch may end before a checkpoint
        atomic_save({"format": FORMAT, "model": weights, "config": cfg.to_dict(), "plugins": loaded_plugins(),
                     "train_state": {"step": best["step"], "epoch": best["epoch"], "step_in_epoch": 0},
                     "best": {**best, "protocol": self.last["protocol"],
                              "weights": "ema" if cfg.train.ema_decay > 0 else "model"}},
                    Path(cfg.out_dir) / "checkpoints" / BEST, fix="free some space there; the run goes on without a new best.pt")


# ----------------------------------------------------------------------------- a saved classifier
def evaluate_classifier(checkpoint: str | Path, split: str = "test", data: DataConfig | None = None,
                        device: str = "auto", num_workers: int = 0, progress: bool = True) -> dict:
    """Top-1 / top-5 of a classifier checkpoint on ``split`` (one process): the report's dict."""
    checkpoint = Path(checkpoint)
    if checkpoint.is_dir():
        raise UserError(f"{checkpoint} is a folder; pass a classifier checkpoint: <run>/checkpoints/{BEST} or a step_*.pt")
    state = load_checkpoint(checkpoint)
    family = state["config"]["model"].get("family")
    if family != "classifier":
        raise CheckpointError(f"{checkpoint} holds a {family!r} model; eval-classifier measures a fine-tuned or probed "
                              "classifier (resdecay finetune's checkpoints); measure encoders with resdecay eval")
    dev = resolve_device(device, "--device")
    model, cfg = load_model(checkpoint, dev, state=state)
    data = data or cfg.data
    dataset, info = build_dataset(data, split, cfg.model.img_size, augment=False)
    if info.num_classes != cfg.model.num_classes:
        raise UserError(f"{data.name} has {info.num_classes} classes but the classifier has {cfg.model.num_classes}; "
                        "measure it on the data set it was trained for")
    top1, top5, n = split_counts(model, dataset, dev, num_workers, progress)
    return {"resdecay_eval_classifier": 1, "checkpoint": str(checkpoint), "checkpoint_sha256": file_sha256(checkpoint),
            "step": state["train_state"]["step"], "values": {"top1": top1 / n, "top5": top5 / n},
            "correct": {"top1": top1, "top5": top5}, "protocol": protocol(data.name, split, n, dev, 1)}


@torch.no_grad()
def test_accuracy(checkpoint: Path, device: torch.device, batch_size: int = 256, progress: bool = True) -> tuple[dict, int]:
    """(top-1 / top-5, test images) of any classifier checkpoint (train-supervised's ResNets too)."""
    model, cfg = load_model(checkpoint, device)
    dataset, _ = build_dataset(cfg.data, "test", cfg.model.img_size, augment=False)
    scores, labels = [], []
    for images, y in progress_bar(DataLoader(dataset, batch_size=batch_size), desc="test", disable=not progress, leave=False):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            scores.append(model(images.to(device)).float().cpu())
        labels.append(torch.as_tensor(y))
    return topk_accuracy(torch.cat(scores), torch.cat(labels), (1, 5)), len(dataset)
