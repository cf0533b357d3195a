"""``resdecay eval-classifier CKPT``: top-1 / top-5 of a saved classifier (``resdecay finetune``'s
checkpoints), printed and written as JSON; on a run's final checkpoint it gives the number the run
printed. The measurement is ``eval.classifier_eval.evaluate_classifier``; the parser is ``cli/eval_classifier.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..data import DataConfig
from ..eval.classifier_eval import evaluate_classifier
from ..io import atomic_write_text, run_dir_of
from ..train.checkpoint import load_checkpoint


def run_eval_classifier(checkpoint: str, split: str = "test", data_name: str | None = None, data_path: str | None = None,
                        device: str = "auto", num_workers: int = 0, out: str | None = None, progress: bool = True) -> dict:
    data = None
    if data_name or data_path:  # --data-path alone: the checkpoint's data set at another path
        saved = load_checkpoint(checkpoint)["config"]["data"] if not data_name else {}
        data = DataConfig(**{**saved, "name": data_name or saved["name"], "path": data_path, "num_workers": num_workers})
    report = evaluate_classifier(checkpoint, split, data, device, num_workers, progress)
    path = Path(out) if out else run_dir_of(Path(checkpoint)) / "eval" / f"classifier_{Path(checkpoint).stem}_{split}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(report, indent=2))
    v, p = report["values"], report["protocol"]
    print(f"eval-classifier: {split} top-1 {v['top1']:.4f}, top-5 {v['top5']:.4f} on {p['images']} {p['data']} {split} "
          f"images (no augmentation, {p['precision']}, batch {p['batch']}); checkpoint {checkpoint} (step {report['step']}); "
          f"wrote {path}")
    return report
