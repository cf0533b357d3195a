"""Experiment trackers (train.loggers): TensorBoard events read back with EventAccumulator, W&B offline
run files, an MLflow file store read with MlflowClient, summary.csv; resume continues the same tracker
runs; evaluation numbers reach the run's trackers; a missing package is one line. All offline."""

import csv
import json
import re
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from helpers import assert_one_line_error, run, train_online
from helpers.trackers import EVAL, ONLINE, RUN, needs, offline
from resdecay.errors import ConfigError
from resdecay.eval.suite import EvalSettings, evaluate_checkpoint
from resdecay.train import checkpoint as ckpt
from resdecay.train.config import from_dict, load_config
from resdecay.train.log.runlog import RunLog, read_log
from resdecay.train.log.trackers import CsvTracker
from resdecay.train.log.tracking import Trackers, tracker_group


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    offline(monkeypatch)


def train_run(out: Path, *extra: str, resume: str | None = None) -> dict:
    return train_online(load_config("mae-tiny-digits", [*RUN, f"train.out_dir={out}", *extra]), resume=resume,
                                  progress=False)


def mlflow_client(uri: str):
    return needs("mlflow.tracking").MlflowClient(tracking_uri=uri)


def wandb_records(path: Path):
    """The records of a W&B ``run-<id>.wandb`` file (LevelDB log format: 32 KiB blocks of chunks,
    each with a 7-byte header: CRC, length, type (1 full, 2 first, 3 middle, 4 last))."""
    wandb_internal_pb2 = needs("wandb.proto.wandb_internal_pb2")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, chunk = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            chunk = b""
            yield record


def wandb_run(out: Path) -> dict:
    """What the run's offline W&B files hold: run ids, config, history rows by step, summary keys, media files."""
    found = {"ids": set(), "config": {}, "history": {}, "summary": {}, "media": []}
    for run_dir in sorted((out / "wandb").glob("offline-run-*")):
        for record in wandb_records(next(run_dir.glob("run-*.wandb"))):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                found["ids"].add(record.run.run_id)
                found["config"].update({i.key: json.loads(i.value_json) for i in record.run.config.update})
            elif kind == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                found["history"].setdefault(items["_step"], {}).update(items)
            elif kind == "summary":
                found["summary"].update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.summary.update})
        found["media"] += [p.relative_to(run_dir / "files" / "media" / "images").as_posix()
                           for p in (run_dir / "files" / "media" / "images").rglob("*.png")]
    return found


def refs_of(checkpoint: Path) -> dict:
    return ckpt.load_checkpoint(checkpoint)["train_state"].get("trackers")


# ----------------------------------------------------------------------------- W&B, MLflow, CSV; resume
@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """One run logging to W&B (offline), MLflow and CSV with online evaluation; then resumed from its
    step-4 checkpoint, as if killed after logging step 8; then evaluated."""
    needs("wandb"), needs("mlflow")
    out = tmp_path_factory.mktemp("tracked") / "run"
    loggers = ["train.loggers=[wandb,mlflow,csv]", *ONLINE]
    with pytest.MonkeyPatch.context() as mp:
        offline(mp)
        train_run(out, *loggers)
        first_csv = (out / "summary.csv").read_text()
        train_run(out, *loggers, resume=str(ckpt.checkpoint_path(out / "checkpoints", 4)))
        last = ckpt.checkpoint_path(out / "checkpoints", 10)
        evaluate_checkpoint(last, EvalSettings(cache_dir=str(out.parent / "cache"), **EVAL))
    return out, first_csv


def test_checkpoints_keep_the_tracker_runs_and_resume_continues_them(tracked):
    out, _ = tracked
    at4, at10 = refs_of(ckpt.checkpoint_path(out / "checkpoints", 4)), refs_of(ckpt.checkpoint_path(out / "checkpoints", 10))
    assert set(at4) == {"wandb", "mlflow"} and at4 == at10  # the resumed launch continued the same runs
    assert at4["mlflow"]["uri"] == f"file:{(out / 'mlruns').resolve()}" and at4["mlflow"]["experiment"] == "resdecay"
    assert wandb_run(out)["ids"] == {at4["wandb"]["id"]}  # every offline launch (train, resume, eval) is that run
    client = mlflow_client(at4["mlflow"]["uri"])
    assert len(client.search_runs([client.get_experiment_by_name("resdecay").experiment_id])) == 1


def test_a_resumed_launch_leaves_no_duplicate_points_in_wandb_offline_files(tracked):
    """Issue 30.6: the resumed launch (from step 4) logged steps 6..10 again into its own offline folder,
    so `wandb sync` sent each of them twice; now each tag is logged at each step by one launch only."""
    out, _ = tracked
    launches = sorted((out / "wandb").glob("offline-run-*"))
    assert len(launches) == 3  # training, the resumed launch, the evaluation
    logged = []  # (tag, step) of every scalar in every launch folder's history records
    for run_dir in launches:
        for record in wandb_records(next(run_dir.glob("run-*.wandb"))):
            if record.WhichOneof("record_type") == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                logged += [(k, items["_step"]) for k, v in items.items() if not k.startswith("_") and isinstance(v, float)]
    twice = sorted({x for x in logged if logged.count(x) > 1})
    assert not twice, twice[:5]
    assert sorted(s for k, s in logged if k == "train/loss") == [2, 4, 6, 8, 10]


def test_wandb_offline_files_hold_config_scalars_block_rms_and_figures(tracked):
    out, _ = tracked
    found, rows = wandb_run(out), read_log(out)
    assert found["config"]["train"]["loggers"] == ["wandb", "mlflow", "csv"] and found["config"]["model"]["alpha_min"] == 0.6
    train_rows = [r for r in rows if "loss" in r]
    assert [s for s in sorted(found["history"]) if "train/loss" in found["history"][s]] == [2, 4, 6, 8, 10]
    for r in train_rows:
        logged = found["history"][r["step"]]
        assert logged["train/loss"] == pytest.approx(r["loss"], rel=1e-12)
        assert [logged[f"block_rms/encoder_block_0{i}"] for i in range(4)] == pytest.approx(r["block_rms"][:4])
    final = found["history"][10]
    assert final["online/knn_top1"] == next(r["online_knn_top1"] for r in rows if "online_knn_top1" in r)
    assert final["online/pca_maps/_type"] == final["online/reconstructions/_type"] == "image-file"
    assert found["history"][0]["alpha_schedule/_type"] == "image-file"
    media = {re.sub(r"_\d+_[0-9a-f]+\.png$", "", m) for m in found["media"]}  # <key>_<step>_<hash>.png
    assert media == {"alpha_schedule", "online/pca_maps", "online/reconstructions"}
    assert found["summary"]["summary/final_loss"] == pytest.approx(train_rows[-1]["loss"])
    assert 0 <= found["summary"]["eval/knn_top1"] <= 100  # the evaluation after training, in the same run


def test_mlflow_file_store_holds_params_metrics_images_and_the_evaluation(tracked):
    out, _ = tracked
    ref = refs_of(ckpt.checkpoint_path(out / "checkpoints", 10))["mlflow"]
    client = mlflow_client(ref["uri"])
    run_ = client.get_run(ref["id"])
    assert run_.info.status == "FINISHED" and run_.info.run_name == "run"
    assert run_.data.params["train.epochs"] == "1" and run_.data.params["model.alpha_min"] == "0.6"
    rows = {r["step"]: r for r in read_log(out) if "loss" in r}
    history = client.get_metric_history(ref["id"], "train/loss")
    # the first launch logged 2..10; the resumed one (from step 4) skips the steps MLflow already holds (issue 30.6)
    assert sorted(m.step for m in history) == [2, 4, 6, 8, 10]
    for key in client.get_run(ref["id"]).data.metrics:
        steps = [m.step for m in client.get_metric_history(ref["id"], key)]
        assert len(steps) == len(set(steps)), key
    assert all(m.value == pytest.approx(rows[m.step]["loss"], rel=1e-12) for m in history)
    assert [m.step for m in client.get_metric_history(ref["id"], "block_rms/decoder_block_01")][:2] == [2, 4]
    assert [m.step for m in client.get_metric_history(ref["id"], "eval/knn_top1")] == [10]
    artifacts = {a.path for a in client.list_artifacts(ref["id"])}
    assert "config.yaml" in artifacts and "alpha_table.txt" in artifacts and "images" in artifacts


def test_summary_csv_one_row_per_step_union_of_columns_and_resume_appends(tracked):
    out, first_csv = tracked
    with open(out / "summary.csv", newline="") as f:
        reader = csv.DictReader(f)
        header, table = reader.fieldnames, list(reader)
    assert header[0] == "step" and {"train/loss", "block_rms/encoder_block_00", "online/knn_top1"} <= set(header)
    assert [int(r["step"]) for r in table] == [2, 4, 6, 8, 10]  # no duplicates from the killed launch's steps
    rows = read_log(out)
    assert [float(r["train/loss"]) for r in table] == [r["loss"] for r in rows if "loss" in r]  # repr round-trips
    assert table[-1]["online/knn_top1"] and not table[0]["online/knn_top1"]  # training row and online eval share step 10
    assert float(table[-1]["online/knn_top1"]) == next(r["online_knn_top1"] for r in rows if "online_knn_top1" in r)
    first = list(csv.DictReader(first_csv.splitlines()))
    assert [r["train/loss"] for r in first] == [r["train/loss"] for r in table]  # the resumed run is bit-identical


def test_csv_tracker_merges_a_step_adds_columns_and_trims_on_resume(tmp_path):
    t = CsvTracker()
    t.start({}, tmp_path)
    t.log_scalars(2, {"train/loss": 1.5})
    t.log_scalars(4, {"train/loss": 1.25})
    t.log_scalars(4, {"online/knn_top1": 50.0})  # same step: the same row, a new column
    t.log_scalars(4, {"online/rank": 3.0})
    t.log_scalars(6, {"train/loss": 1.0})
    text = (tmp_path / "summary.csv").read_text().splitlines()
    assert text == ["step,train/loss,online/knn_top1,online/rank", "2,1.5,,", "4,1.25,50.0,3.0", "6,1.0,,"]
    resumed = CsvTracker()
    resumed.start({}, tmp_path, resume_step=4)
    resumed.log_scalars(6, {"train/loss": 0.5})
    assert (tmp_path / "summary.csv").read_text().splitlines()[1:] == ["2,1.5,,", "4,1.25,50.0,3.0", "6,0.5,,"]
    CsvTracker().start({}, tmp_path)  # a fresh start begins a new table
    assert (tmp_path / "summary.csv").read_text().splitlines() == ["step"]


# ----------------------------------------------------------------------------- TensorBoard (the default)
def test_tensorboard_holds_scalars_config_block_rms_alpha_figures_and_the_evaluation(tmp_path):
    out = tmp_path / "run"
    train_run(out, *ONLINE)
    evaluate_checkpoint(ckpt.checkpoint_path(out / "checkpoints", 10), EvalSettings(cache_dir=str(tmp_path / "c"), **EVAL))
    events = EventAccumulator(str(out / "tb"), size_guidance={"images": 0, "tensors": 0, "scalars": 0})
    events.Reload()
    tags, rows = events.Tags(), read_log(out)
    train_rows = [r for r in rows if "loss" in r]
    assert [e.step for e in events.Scalars("train/loss")] == [r["step"] for r in train_rows] == [2, 4, 6, 8, 10]
    for i, name in enumerate(["encoder_block_00", "encoder_block_01", "encoder_block_02", "encoder_block_03",
                              "decoder_block_00", "decoder_block_01"]):
        assert [e.value for e in events.Scalars(f"block_rms/{name}")] == pytest.approx([r["block_rms"][i] for r in train_rows])
    assert [e.step for e in events.Scalars("online/knn_top1")] == [10]
    assert [e.step for e in events.Scalars("eval/knn_top1")] == [10] and "summary/final_loss" in tags["scalars"]
    config = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "alpha_min: 0.6" in config and "loggers:" in config
    alphas = events.Tensors("alpha_table/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| blocks.3 | 0.6571, 0.6 |" in alphas
    assert {"alpha_schedule", "online/pca_maps", "online/reconstructions"} <= set(tags["images"])
    image = events.Images("online/reconstructions")[0]
    assert image.step == 10 and image.encoded_image_string[:8] == b"\x89PNG\r\n\x1a\n" and image.height > 50
    state = ckpt.load_checkpoint(ckpt.checkpoint_path(out / "checkpoints", 10))
    assert "trackers" not in state["train_state"]  # TensorBoard alone: checkpoints as before
    assert not (out / "summary.csv").exists() and not (out / "wandb").exists() and not (out / "mlruns").exists()


def test_a_checkpoint_without_tracker_runs_resumes_and_adds_a_tracker(tmp_path):
    """Checkpoints of earlier versions name no tracker runs; a resume may add back ends (train.loggers
    is a harmless change), which then start at the resumed step."""
    needs("mlflow")
    out = tmp_path / "run"
    train_run(out)
    state = ckpt.load_checkpoint(ckpt.checkpoint_path(out / "checkpoints", 4))
    assert "trackers" not in state["train_state"]
    train_run(out, "train.loggers=[tensorboard,csv,mlflow]", resume=str(ckpt.checkpoint_path(out / "checkpoints", 4)))
    with open(out / "summary.csv", newline="") as f:
        assert [int(r["step"]) for r in csv.DictReader(f)] == [6, 8, 10]
    assert set(refs_of(ckpt.checkpoint_path(out / "checkpoints", 10))) == {"mlflow"}


# ----------------------------------------------------------------------------- choosing, failing, ranks
@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_a_missing_tracker_package_is_one_line_naming_the_extra(capsys, tmp_path, monkeypatch, name):
    """Simulated: the package made unimportable (the test needs neither installed)."""
    monkeypatch.setitem(sys.modules, name, None)  # `import wandb` now raises ImportError
    out = tmp_path / "run"
    code, _, err = run(capsys, "pretrain", "--preset", "mae-tiny-digits", "--no-progress", *RUN, f"train.out_dir={out}",
                       f"train.loggers=[tensorboard,{name}]")
    assert_one_line_error(code, err, f"train.loggers includes {name}", f"pip install -e '.[{name}]'")
    assert not out.exists()  # refused before anything was made


def test_loggers_are_checked_and_do_not_name_the_run_folder():
    with pytest.raises(ConfigError, match="train.loggers 'comet' is unknown; choose one of tensorboard, wandb, mlflow, csv"):
        load_config("mae-tiny-digits", ["train.loggers=[tensorboard,comet]"])
    cfg = load_config("mae-tiny-digits", ["train.loggers=[csv]", "train.epochs=3"])
    assert cfg.train.loggers == ["csv"] and cfg.out_dir.name == "mae-tiny-digits_epochs-3"
    old = load_config("mae-tiny-digits").to_dict()
    del old["train"]["loggers"]  # a config written before train.loggers existed
    assert from_dict(old).train.loggers == ["tensorboard"]


def test_only_rank_0_logs(tmp_path):
    log = RunLog(tmp_path, enabled=False, loggers=["tensorboard", "csv", "mlflow", "wandb"], config={})
    log.write({"step": 1, "loss": 1.0})
    log.log_image(1, "x", b"")
    log.close()
    assert list(tmp_path.iterdir()) == [] and log.refs == {}


def test_an_ablation_grid_shares_one_mlflow_store_and_experiment_and_failures_are_marked(tmp_path):
    needs("mlflow")
    grid = tmp_path / "grid"
    with tracker_group("table3b", grid), tracker_group("inner", tmp_path / "other"):  # the outer group wins
        trackers = Trackers(["mlflow"])
        trackers.start({"train": {"epochs": 1}}, grid / "seed0" / "decay-both")
    trackers.log_scalars(3, {"train/loss": 0.5})
    trackers.finish(ok=False)
    ref = trackers.refs["mlflow"]
    assert ref["uri"] == f"file:{(grid / 'mlruns').resolve()}" and ref["experiment"] == "table3b"
    run_ = mlflow_client(ref["uri"]).get_run(ref["id"])
    assert run_.info.run_name == "seed0/decay-both" and run_.info.status == "FAILED"
    assert run_.data.metrics == {"train/loss": 0.5}


# ----------------------------------------------------------------------------- ablate
SEED_GRID = ["data.name=digits", "model.img_size=8", "model.width=8", "train.epochs=1", "train.batch_size=64",
             "train.warmup_epochs=0", "data.num_workers=0", "train.threads=1", "train.loggers=[mlflow]",
             "data.train_subset=256"]  # 4 steps an epoch, not 22: where the runs are logged is checked, not the training


def grid_runs(out: Path) -> dict:
    """{MLflow run name: its eval/knn_top1} in the grid's store, experiment figure7-toy."""
    client = mlflow_client(f"file:{(out / 'mlruns').resolve()}")
    runs = client.search_runs([client.get_experiment_by_name("figure7-toy").experiment_id])
    return {r.info.run_name: r.data.metrics.get("eval/knn_top1") for r in runs}


@pytest.mark.slow
def test_ablate_variants_and_seeds_share_one_mlflow_experiment_with_their_evaluations(capsys, tmp_path):
    needs("mlflow")
    out = tmp_path / "g"
    code, _, err = run(capsys, "ablate", "--grid", "figure7-toy", "--only", "8 blocks alpha 0.7", "--out", str(out),
                       *SEED_GRID, "--no-progress")
    assert code == 0, err
    assert grid_runs(out) == {"8-blocks-alpha-0-7": json.loads((out / "ablate.json").read_text())
                              ["rows"]["8 blocks alpha 0.7"]["measures"]["knn_top1"]}
    seeds = tmp_path / "s"
    code, _, err = run(capsys, "ablate", "--grid", "figure7-toy", "--only", "8 blocks alpha 0.7", "--seeds", "0,1",
                       "--out", str(seeds), *SEED_GRID, "--no-progress")
    assert code == 0, err
    found = grid_runs(seeds)  # both seeds in the outer folder's store, named by their path in it
    assert set(found) == {"seed0/8-blocks-alpha-0-7", "seed1/8-blocks-alpha-0-7"} and all(v is not None for v in found.values())
    assert not (seeds / "seed0" / "mlruns").exists() and not (seeds / "seed0" / "8-blocks-alpha-0-7" / "mlruns").exists()
