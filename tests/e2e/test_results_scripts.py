"""Issue 38: every script under docs/results/ takes its folders as arguments (defaults relative to the repository
it sits in) and runs from a fresh clone. Each runs here from a copy of docs/results/ in a temporary "clone" (no
.venv, no runs/), from another working directory: the training and evaluation scripts with --dry-run (their
printed resdecay commands are parsed by resdecay's own command line, the pretraining ones resolved with
--print-config), the collectors on a tiny fake tree of runs. None may print an absolute /work path, and no file
under docs/results/ may hold one."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import ROOT
from helpers.benchmarks import run_python_here

RESULTS = ROOT / "docs" / "results"
SOURCED = {"common.sh", "segmentation-patch4/checkpoints.sh"}  # sourced by the scripts, not run on their own
# every runnable script and the test below that runs it
COVERED = {
    "segmentation-patch4/run.sh": "test_segmentation_run_dry_run",
    "segmentation-patch4/eval.sh": "test_segmentation_eval_dry_run",
    "segmentation-patch4/learned.sh": "test_segmentation_learned_dry_run",
    "segmentation-patch4/collect.py": "test_segmentation_collect_on_a_fake_tree",
    "repro/run_seeds.sh": "test_repro_dry_runs",
    "repro/run_threads_isa.sh": "test_repro_dry_runs",
    "repro/summarise.py": "test_repro_summarise",
    "where-small/run.sh": "test_where_small",
    "where-small/collect.sh": "test_where_small",
    "where-map/run.sh": "test_where_map_dry_run",
    "where-map/collect.py": "test_where_map_collectors",
    "where-map/machines.py": "test_where_map_collectors",
    "diagnostics/train_plain.sh": "test_diagnostics_scripts_dry_run",
    "diagnostics/gpu_width.sh": "test_diagnostics_scripts_dry_run",
    "diagnostics/predict.py": "test_diagnostics_predict_on_a_fake_tree",
    "probing/evaluate.sh": "test_probing_scripts_on_a_fake_tree",
    "probing/collect.py": "test_probing_scripts_on_a_fake_tree",
    "probing/demo.sh": "test_probing_scripts_on_a_fake_tree",
    "probing/textures.py": "test_probing_textures_figure",
    "alternatives/orthogonal_fmnist.sh": "test_results_alternatives.py::test_alternatives_dry_run",
    "alternatives/grid_fmnistm.sh": "test_results_alternatives.py::test_alternatives_grid_dry_run",
    "alternatives/grid_sit.sh": "test_results_alternatives.py::test_alternatives_sit_grid_dry_run",
    "alternatives/gpu_sit_s2.sh": "test_results_alternatives.py::test_alternatives_sit_s2_gpu_script_dry_run",
    "alternatives/collect_sit.py": "test_results_alternatives.py::test_alternatives_sit_collector",
    "alternatives/collect_grid.py": "test_results_alternatives.py::test_alternatives_grid_collector",
}
SCRIPT_ENV = ("ROOT", "RUNS", "QUEUE", "RESDECAY", "PYTHON", "DRY_RUN", "EXTRA", "SEG_SEEDS", "SOLVERS", "SEG_IMAGES",
              "KNN_PROBE", "STEP", "STEPS", "DEST", "LEVELS", "SEEDS", "WIDTH", "EPOCHS", "EVAL", "CELLS", "VARIANTS",
              "SUBSET", "EVAL_SIZE", "FMNIST", "BATCH", "BUDGET_S", "TARGET_EXTRA")


def scripts() -> set[str]:
    return {str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*") if p.suffix in (".sh", ".py")} - SOURCED


def test_every_script_is_run_here():
    assert scripts() == set(COVERED), "a script under docs/results/ that this file does not run (or a stale entry)"


def test_no_absolute_work_path_under_docs_results():
    hits = []
    for path in RESULTS.rglob("*"):
        if path.is_file() and path.suffix not in (".png", ".pt", ".pyc"):  # a bytecode cache records its source's path
            hits += [f"{path.relative_to(ROOT)}:{i}" for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
                     if "/work/" in line]
    assert not hits, f"absolute /work/ paths: {hits[:10]}"


def run_script(clone: Path, rel: str, *args: str, **env: str) -> str:
    """Run docs/results/REL of ``clone`` from another folder; assert exit 0 and no /work path in what it prints
    (the clone's own temporary path aside); return stdout. A python script runs as ``__main__`` in this process (its
    own interpreter would start torch again: ~3 s of a 2-core machine each), with the environment it would get."""
    script = clone / "docs" / "results" / rel
    elsewhere = clone.parent / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    env = {"OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", **env}
    if script.suffix == ".py":
        code, out, err = run_python_here(script, args, elsewhere, env, drop=SCRIPT_ENV)
    else:
        base = {k: v for k, v in os.environ.items() if k not in SCRIPT_ENV}
        proc = subprocess.run(["bash", str(script), *args], cwd=elsewhere, capture_output=True, text=True, timeout=300,
                              env={**base, **env})
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    assert code == 0, f"{rel} {args}: exit {code}\n{out[-2000:]}\n{err[-2000:]}"
    text = (out + err).replace(str(clone.parent), "<tmp>")
    assert "/work/" not in text, f"{rel} printed an absolute /work path:\n{text[:2000]}"
    return out


def commands(printed: str) -> list[list[str]]:
    """The resdecay arguments of each command a --dry-run printed (after `resdecay` or `-m resdecay`, up to `>`)."""
    out = []
    for line in printed.splitlines():
        words = shlex.split(line)
        if ">" in words:
            words = words[:words.index(">")]
        at = max(i for i, w in enumerate(words) if w == "resdecay" or w.endswith("/resdecay"))
        out.append(words[at + 1:])
    return out


def parses(argv: list[str]) -> None:
    """``argv`` is a command resdecay's parser accepts (options, choices, key=value overrides)."""
    from resdecay.cli.main import build_parser

    args, extra = build_parser().parse_known_args(argv)
    assert all("=" in e and not e.startswith("-") for e in extra), (argv, extra)


def test_segmentation_run_dry_run(clone, capsys):
    from resdecay.cli import main

    printed = run_script(clone, "segmentation-patch4/run.sh", "--dry-run", EXTRA="train.epochs=1")
    cmds = commands(printed)
    assert len(cmds) == 12  # clean and all x seeds 0-2 x plain and a08
    assert f"{clone}/runs/segmentation-patch4/all/seed2/a08" in printed
    for argv in cmds:  # every run's config resolves (presets, overrides) without training
        assert argv[0] == "pretrain" and "train.epochs=1" in argv
        assert main([*argv, "--print-config"]) == 0, argv
    assert "alpha_min: 0.8" in capsys.readouterr().out
    assert not (clone / "runs").exists()  # a dry run claims and creates nothing
    queue = clone.parent / "queue.txt"
    queue.write_text("# level seed variant\nall 1 a08\n")
    printed = run_script(clone, "segmentation-patch4/run.sh", "--dry-run", QUEUE=str(queue), RUNS=str(clone.parent / "r"))
    assert commands(printed) and len(commands(printed)) == 1 and "<tmp>/r/all/seed1/a08" in printed.replace(
        str(clone.parent), "<tmp>")


def test_segmentation_eval_dry_run(clone):
    runs = clone / "runs" / "segmentation-patch4"
    for variant in ("plain", "a08"):  # the newest checkpoint of each run is evaluated
        (runs / "all" / "seed0" / variant / "checkpoints").mkdir(parents=True)
        for step in (100, 304):
            (runs / "all" / "seed0" / variant / "checkpoints" / f"step_{step:08d}.pt").write_bytes(b"")
    printed = run_script(clone, "segmentation-patch4/eval.sh", "--dry-run", "all", "0", SEG_SEEDS="0 1 2")
    cmds = commands(printed)
    assert len(cmds) == 2 * 3 + 1  # exact and kmeans x 3 evaluation seeds, then kNN + probe once
    for argv in cmds:
        parses(argv)
        assert argv[0] == "eval" and argv[1].endswith("plain/checkpoints/step_00000304.pt")
    seeds = sorted(a[a.index("--seg-seed") + 1] for a in cmds if "--seg-seed" in a)
    assert seeds == ["0", "0", "1", "1", "2", "2"]
    assert f"{runs}/eval/all/seed0/kmeans/segseed2" in printed
    assert cmds[-1][cmds[-1].index("--evals") + 1] == "knn,probe"
    # no checkpoint yet: a dry run names a placeholder, a real run one line and exit 1
    printed = run_script(clone, "segmentation-patch4/eval.sh", "all", "1", "--dry-run", KNN_PROBE="0")
    assert len(commands(printed)) == 2 and "step_NEWEST.pt" in printed
    proc = subprocess.run(["bash", str(clone / "docs/results/segmentation-patch4/eval.sh"), "all", "1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "no checkpoint in" in proc.stderr


def test_segmentation_learned_dry_run(clone):
    printed = run_script(clone, "segmentation-patch4/learned.sh", "--dry-run", "all", "0", SEG_SEEDS="3", STEP="304")
    (argv,) = commands(printed)
    parses(argv)
    assert "learned" in argv and argv[argv.index("--seg-seed") + 1] == "3" and argv[1].endswith("step_00000304.pt")


def write_fake_segmentation_tree(runs: Path) -> None:
    """Three training seeds of the all level, three evaluation seeds each. Seed 0's decayed model wins under
    evaluation seed 0 only and loses on the mean; seed 1's decayed run ends on its plateau (0.75 vs 0.56)."""
    def seg(miou):
        return {"results": [{"metric": "segmentation", "values": {"miou": miou, "pixel_acc": 0.2}}],
                "baselines": [{"source": s, "metric": "segmentation", "values": {"miou": m, "pixel_acc": 0.3}}
                              for s, m in (("pixels", 0.05), ("random-init", 0.04))]}

    def write(path, obj):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(obj))

    mious = {0: {"plain": [0.040, 0.050, 0.050], "a08": [0.045, 0.040, 0.041]},
             1: {"plain": [0.040, 0.040, 0.040], "a08": [0.050, 0.050, 0.050]},
             2: {"plain": [0.040, 0.040, 0.040], "a08": [0.042, 0.044, 0.046]}}
    for seed, by_variant in mious.items():
        for variant, values in by_variant.items():
            pair = runs / "eval" / "all" / f"seed{seed}"
            for e, miou in enumerate(values):
                write(pair / "exact" / f"segseed{e}" / variant / "eval.json", seg(miou))
            knn = 0.1 + (0.02 if variant == "a08" else 0)
            write(pair / "knn-probe" / variant / "eval.json",
                  {"results": [{"metric": "knn", "values": {"top1": knn}}, {"metric": "probe", "values": {"top1": 0.12}}],
                   "baselines": [{"source": "pixels", "metric": "knn", "values": {"top1": 0.3}}]})
            loss = 0.75 if (seed, variant) == (1, "a08") else 0.56
            write(runs / "all" / f"seed{seed}" / variant / "summary.json", {"final_loss": loss})
    for variant in ("plain", "a08"):  # a run still training: its last log row
        (runs / "clean" / "seed0" / variant).mkdir(parents=True)
        (runs / "clean" / "seed0" / variant / "log.jsonl").write_text('{"step": 5, "loss": 0.9}\n{"step": 10, "loss": 0.8}\n')


def test_segmentation_collect_on_a_fake_tree(clone, tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "out"
    write_fake_segmentation_tree(runs)
    committed = (clone / "docs/results/segmentation-patch4/table.md").read_text()
    printed = run_script(clone, "segmentation-patch4/collect.py", str(runs), "--out", str(out))
    table = (out / "table.md").read_text()
    assert printed.strip() == table.strip()
    (row,) = [line for line in table.splitlines() if line.startswith("| all | exact |")]
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[2] == "3"  # evaluation seeds per checkpoint
    assert cells[6] == "2/3"  # wins on the mean over evaluation seeds: seed 0's single-seed win does not count
    assert cells[7] == "0.0150"  # seed 0's Δ moves by 0.015 with the evaluation seed alone
    assert cells[-1] == "a08 seed 1"  # the pair whose decayed run sits on its plateau
    assert "| all | 1 | a08 | 0.7500 | 0.5600 | **plateau** |" in table
    assert "| clean | 0 | plain | 0.8000 |" in table
    (kp,) = [line for line in table.splitlines() if line.startswith("| all | 0.1000")]
    assert "| 3/3 |" in kp  # kNN of the same checkpoints: the decayed one ahead in each seed
    report = json.loads((out / "table.json").read_text())
    assert report["plateau_factor"] == 1.2 and report["levels"]["all"]["runs"]["seed1/a08"]["plateau"] is True
    assert (clone / "docs/results/segmentation-patch4/table.md").read_text() == committed  # --out: nothing else written


def test_repro_dry_runs(clone):
    for rel, n in (("repro/run_seeds.sh", 6), ("repro/run_threads_isa.sh", 5)):
        printed = run_script(clone, rel, "--dry-run")
        cmds = commands(printed)
        assert len(cmds) == n and f"{clone}/runs/repro/" in printed
        for argv in cmds:
            parses(argv)
            assert argv[0] == "demo" and "--out" in argv
    assert "ATEN_CPU_CAPABILITY=avx2" in printed and not (clone / "runs").exists()


def test_repro_summarise(clone, tmp_path):
    printed = run_script(clone, "repro/summarise.py")
    assert "resdecay demo --data digits" in printed and "digits_t2_seed1" in printed
    results = tmp_path / "only-two"
    results.mkdir()
    for name in ("fmnist_t2_seed0", "fmnist_t2_seed1"):
        shutil.copy(RESULTS / "repro" / f"{name}.json", results)
    printed = run_script(clone, "repro/summarise.py", "--results", str(results))
    assert "fmnist_t2_seed1" in printed and "digits_t2_seed1" not in printed


def test_where_small(clone, tmp_path):
    printed = run_script(clone, "where-small/run.sh", "--dry-run", EXTRA="train.epochs=1")
    cmds = commands(printed)
    assert len(cmds) == 6 and f"{clone}/runs/where-small/seed2" in printed
    for argv in cmds:
        parses(argv)
        assert argv[:3] == ["ablate", "--grid", "where-small"] and "train.epochs=1" in argv
    runs, dest = tmp_path / "ws", tmp_path / "copies"
    (runs / "seed0" / "plain-mae" / "eval").mkdir(parents=True)
    (runs / "seed0" / "alpha-0-8").mkdir(parents=True)  # unfinished: no summary.json, not copied
    for name in ("log.jsonl", "summary.json", "eval/eval.json"):
        (runs / "seed0" / "plain-mae" / name).write_text("{}\n")
    (runs / "seed0" / "table.txt").write_text("table\n")
    run_script(clone, "where-small/collect.sh", str(runs), str(dest))
    assert sorted(p.name for p in (dest / "seed0" / "plain-mae").iterdir()) == ["eval.json", "log.jsonl", "summary.json"]
    assert (dest / "seed0" / "table.txt").is_file() and not (dest / "seed0" / "alpha-0-8").exists()


def test_where_map_dry_run(clone):
    printed = run_script(clone, "where-map/run.sh", "--dry-run")
    cmds = commands(printed)
    queue = [line for line in (RESULTS / "where-map" / "queue.txt").read_text().splitlines() if not line.startswith("#")]
    assert len(cmds) == len(queue) and f"{clone}/runs/where-map/all/seed0" in printed
    assert f"PYTHONPATH={clone}/src" in printed
    for argv in cmds:
        parses(argv)
        assert argv[:3] == ["ablate", "--grid", "where-map"]
    assert not (clone / "runs").exists()


def test_where_map_collectors(clone, tmp_path):
    printed = run_script(clone, "where-map/collect.py", "--no-copy", "--out", str(tmp_path / "map"))
    assert {"where-map.md", "where-map.json"} <= {p.name for p in (tmp_path / "map").iterdir()}
    assert (tmp_path / "map" / "where-map.md").read_text().strip() == printed.strip()
    run_script(clone, "where-map/machines.py", "--out", str(tmp_path / "machines"))
    assert (tmp_path / "machines" / "machines.md").read_text() == (RESULTS / "where-map" / "machines.md").read_text()


def test_diagnostics_scripts_dry_run(clone, capsys):
    from resdecay.cli import main

    cmds = commands(run_script(clone, "diagnostics/train_plain.sh", "--dry-run", EXTRA="train.epochs=1"))
    assert len(cmds) == 10  # five levels x seeds 0, 1: the where-map's plain recipe
    for argv in cmds:
        assert argv[:3] == ["pretrain", "--preset", "mae-tiny-fmnistm-plain"] and "data.train_subset=20000" in argv
        assert main([*argv, "--print-config"]) == 0, argv
    assert "nuisances:\n  - background" in capsys.readouterr().out.replace("\r", "")
    cmds = commands(run_script(clone, "diagnostics/train_plain.sh", "--dry-run", LEVELS="all", SEEDS="1"))
    assert len(cmds) == 1 and "train.seed=1" in cmds[0] and "data.nuisances=[background,colour,scale,position]" in cmds[0]
    cmds = commands(run_script(clone, "diagnostics/gpu_width.sh", "--dry-run", str(clone.parent / "w")))
    assert [c[0] for c in cmds] == ["pretrain", "eval"] * 4  # plain and decayed, seeds 0 and 1, each evaluated
    for argv in cmds:
        parses(argv)
    assert "model.embed_dim=192" in cmds[0] and "model.alpha_min=0.8" in cmds[2] and "knn,probe,diagnostics" in cmds[1]
    assert not (clone / "runs").exists()


def test_diagnostics_predict_on_a_fake_tree(clone, tiny_fmnistm_checkpoint, tmp_path):
    """predict.py on two levels, one seed, the tiny Fashion-MNIST-M checkpoint standing in for each plain MAE."""
    runs = tmp_path / "runs"
    for level in ("clean", "all"):
        (runs / level / "seed0" / "checkpoints").mkdir(parents=True)
        shutil.copy(tiny_fmnistm_checkpoint, runs / level / "seed0" / "checkpoints" / "step_00000002.pt")
    run_script(clone, "diagnostics/predict.py", str(runs), LEVELS="clean all", SEEDS="0", STEP="2")
    out = json.loads((clone / "docs" / "results" / "diagnostics" / "predict.json").read_text())
    assert [(p["level"], p["seed"]) for p in out["points"]] == [("clean", 0), ("all", 0)]
    assert out["points"][0]["delta"]["kNN"] == pytest.approx(-0.050000011920928955)  # the where-map's clean seed 0
    assert set(out["points"][0]["values"]) == {"direct share", "direct share (variance)", "pixel R2", "high-freq R2",
                                               "raw-pixel kNN (data)"}
    assert "leave-one-level-out" in (clone / "docs" / "results" / "diagnostics" / "predict.md").read_text()


def test_probing_scripts_on_a_fake_tree(clone, tmp_path):
    """evaluate.sh prints one eval per finished run (its newest checkpoint), collect.py tabulates the reports."""
    runs = tmp_path / "runs"
    for variant in ("plain-mae", "alpha-0-8", "still-training"):
        run = runs / "all-e8" / "seed0" / variant
        (run / "checkpoints").mkdir(parents=True)
        for step in (1, 2):
            (run / "checkpoints" / f"step_0000000{step}.pt").write_bytes(b"")
        if variant != "still-training":
            (run / "summary.json").write_text("{}")
    cmds = commands(run_script(clone, "probing/evaluate.sh", "--dry-run", RUNS=str(runs)))
    assert len(cmds) == 2 and all(c[1].endswith("step_00000002.pt") for c in cmds)
    for argv in cmds:
        parses(argv)
        assert argv[0] == "eval" and "knn,probe,linear_sweep,knn_sweep,ep,attentive" in argv
    for variant, top1 in (("plain-mae", 0.1), ("alpha-0-8", 0.25)):
        report = runs / "eval" / "all-e8" / "seed0" / variant / "eval.json"
        report.parent.mkdir(parents=True)
        report.write_text(json.dumps({"results": [{"metric": m, "values": {"top1": top1}}
                                                  for m in ("knn", "probe", "knn_sweep", "linear_sweep", "ep", "attentive")]}))
    # the second generator's level (its cards say textures) and the demo's plain / decayed, beside the where-map's
    textures = {"train": {"generator": {"composition": "textures"}}}
    for level, variant, top1, card in (("all-e8", "plain-mae", 0.1, {}), ("all-e8", "alpha-0-8", 0.25, {}),
                                       ("all-e8", "plain-mae", 0.3, textures), ("all-e8", "alpha-0-8", 0.2, textures),
                                       ("demo-digits", "plain", 0.7, {}), ("demo-digits", "decayed", 0.4, {})):
        root = runs if not card else tmp_path / "textures"
        report = root / "eval" / level / "seed0" / variant / "eval.json"
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(json.dumps({"results": [{"metric": m, "values": {"top1": top1}, "protocol": card}
                                                  for m in ("knn", "probe", "knn_sweep", "linear_sweep", "ep", "attentive")]}))
    printed = run_script(clone, "probing/collect.py", str(runs), str(tmp_path / "textures"), "--out", str(tmp_path / "out"))
    assert "| all-e8 | kNN k 20 T 0.07 (paper) | 0.100 | 0.250 | +0.150 | 1/1 |" in printed
    assert "| all-e8-textures | kNN k 20 T 0.07 (paper) | 0.300 | 0.200 | -0.100 | 0/1 |" in printed
    assert "| demo-digits | EP (Q 32), small recipe, chosen on val | 0.700 | 0.400 | -0.300 | 0/1 |" in printed
    assert (tmp_path / "out" / "probing.md").read_text().strip() == printed.strip()
    # demo.sh: the demo (not yet run), then every protocol on both of its checkpoints into RUNS/eval/demo-DATA/seed0
    (demo, evaluation) = commands(run_script(clone, "probing/demo.sh", "--dry-run", RUNS=str(tmp_path / "demo")))
    parses(demo)
    parses(evaluation)
    assert demo[:3] == ["demo", "--data", "digits"] and evaluation[0] == "eval" and "--max-train" not in evaluation
    assert evaluation[evaluation.index("--out") + 1] == str(tmp_path / "demo" / "eval" / "demo-digits" / "seed0")


def test_probing_textures_figure(clone, tmp_path, fake_fmnist):
    """textures.py draws both generators' composites of the same garments from any Fashion-MNIST folder."""
    printed = run_script(clone, "probing/textures.py", "--fmnist", str(fake_fmnist), "--out", str(tmp_path / "t.png"))
    assert (tmp_path / "t.png").stat().st_size > 0 and printed.strip().endswith("t.png")
