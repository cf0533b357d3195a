"""docs/results/alternatives/: RESULTS §18's orthogonal-update runs and §19's two grids (dry runs: every command a
valid one) and their collectors (on fake run trees)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from test_results_scripts import SCRIPT_ENV, commands, parses, run_script

from helpers.benchmarks import run_python_here


def test_alternatives_dry_run(clone, capsys):
    """RESULTS §18's four runs (plain, decay, orthogonal, both) and their evaluations, each a valid command."""
    from resdecay.cli import main

    cmds = commands(run_script(clone, "alternatives/orthogonal_fmnist.sh", "--dry-run", str(clone.parent / "r")))
    assert [c[0] for c in cmds] == ["pretrain"] * 4 + ["eval"] * 4
    for argv in cmds[:4]:
        assert main([*argv, "--print-config"]) == 0, argv
    for argv in cmds[4:]:
        parses(argv)
        assert argv[1].endswith("/checkpoints/step_00000312.pt")  # eval takes a checkpoint file, not the run folder
    shortcuts = [next((w for w in argv if w.startswith("model.shortcut=")), "decay") for argv in cmds[:4]]
    assert shortcuts == ["decay", "decay", "model.shortcut=orthogonal", "model.shortcut=orthogonal_decay"]
    assert "shortcut: orthogonal" in capsys.readouterr().out
    assert not (clone / "runs").exists()


def test_alternatives_grid_dry_run(clone):
    """RESULTS §19 (a): one ablate run per (cell, seed, variant), every variant of the grid, each config valid (the
    alternatives' settings included); --collect reads back each cell's seeds."""
    from resdecay.commands.ablate import plan_grid

    cmds = commands(run_script(clone, "alternatives/grid_fmnistm.sh", "--dry-run", str(clone.parent / "r")))
    plan = plan_grid("alternatives-fmnistm", out=str(clone.parent / "p"))
    names = [v["name"] for v in plan.grid["variants"]]
    assert len(names) == 11 and len(cmds) == 2 * 3 * len(names)
    assert sorted({c[c.index("--only") + 1] for c in cmds}) == sorted(names)
    assert {next(w for w in c if w.startswith("data.nuisances=")) for c in cmds} == {
        "data.nuisances=[background,colour,scale,position]", "data.nuisances=[]"}
    settings = {name: cfg.model for name, cfg in plan.cfgs.items()}
    assert settings["hyper-connections n=4"].hyper_streams == 4 and settings["ReZero"].branch_scale == "rezero"
    assert settings["orthogonal"].shortcut == "orthogonal" and settings["drop identity 0.1"].drop_identity == 0.1
    for argv in cmds:
        parses(argv)
    collect = commands(run_script(clone, "alternatives/grid_fmnistm.sh", "--dry-run", "--collect", str(clone.parent / "r")))
    assert [c[c.index("--seeds") + 1] for c in collect] == ["0,1,2", "0,1,2"]
    assert not (clone / "runs").exists()


def test_alternatives_grid_probes_measure_each_finished_run_once(clone, tmp_path):
    """--probes: EP and the swept linear heads on the last checkpoint of every run whose grid evaluation is written,
    into <run>/eval-probes, on the grid's banks; a run still training, or already measured, is left alone."""
    runs = tmp_path / "r"
    def run(seed: int, name: str, finished: bool = True, measured: bool = False) -> Path:
        folder = runs / "all" / f"seed{seed}" / name
        for sub in ("checkpoints", "eval", "eval-probes/x"):
            (folder / sub).mkdir(parents=True)
        for step in (10, 2496):
            (folder / "checkpoints" / f"step_{step:08d}.pt").touch()
        if finished:
            (folder / "eval" / "eval.json").touch()
        if measured:
            (folder / "eval-probes" / "x" / "eval.json").touch()
        return folder

    done = run(0, "decay-0-8")
    run(0, "plain-mae", finished=False)
    run(1, "orthogonal", measured=True)
    cmds = commands(run_script(clone, "alternatives/grid_fmnistm.sh", "--dry-run", "--probes", str(runs)))
    assert cmds == [["eval", str(done / "checkpoints" / "step_00002496.pt"), "--evals", "ep,linear_sweep",
                     "--max-train", "10000", "--out", str(done / "eval-probes"), "--no-baselines", "--no-progress"]]
    parses(cmds[0])
    # bad input: a folder the grid did not write, or both steps at once: one line each, exit 2, nothing run
    script = str(clone / "docs/results/alternatives/grid_fmnistm.sh")
    for args, says in ((["--probes", str(tmp_path / "elsewhere")], "no finished run in"),
                       (["--probes", "--collect", str(runs)], "are two steps")):
        proc = subprocess.run(["bash", script, "--dry-run", *args], capture_output=True, text=True, timeout=60,
                              env=os.environ)
        assert proc.returncode == 2 and not proc.stdout and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert says in proc.stderr


def test_alternatives_sit_grid_dry_run(clone, capsys):
    """RESULTS §19 (b): the REPA target first, then decay {off, 0.8} x aux {none, repa, dispersive} x 3 seeds, each a
    valid pretrain command ending with the online evaluation."""
    from resdecay.cli import main

    cmds = commands(run_script(clone, "alternatives/grid_sit.sh", "--dry-run", str(clone.parent / "r")))
    assert len(cmds) == 1 + 2 * 3 * 3 and cmds[0][cmds[0].index("--preset") + 1] == "mae-tiny-fmnist-plain"
    auxes = [next(w for w in c if w.startswith("train.aux=")) for c in cmds[1:]]
    assert sorted(set(auxes)) == ["train.aux=dispersive", "train.aux=none", "train.aux=repa"]
    for argv in cmds[1:4]:
        parses(argv)
        assert "train.online_eval_every=4" in argv
    assert main([*cmds[1], "--print-config"]) == 0
    assert any(w.startswith("train.aux_target=") and w.endswith(".pt") for w in cmds[2])
    assert not (clone / "runs").exists()


def test_alternatives_sit_s2_gpu_script_dry_run(clone, tmp_path, capsys):
    """Issue 52 item 6 (for a session lent a GPU): the REPA target at the SiT-S/2 token grid first, then the 2 x 3 table
    in (plain, decayed) pairs, aux none first, at SiT-S/2 size, each a valid config; then the collector. Without
    Fashion-MNIST it is one line, exit 2, before anything runs."""
    from resdecay.cli import main

    out = clone.parent / "s2"
    printed = run_script(clone, "alternatives/gpu_sit_s2.sh", "--dry-run", str(out), FMNIST="/fm")
    *runs, collect = printed.splitlines()
    cmds = commands("\n".join(runs))
    assert len(cmds) == 1 + 2 * 3 and "collect_sit.py" in collect and f"{out}/table" in collect
    assert cmds[0][cmds[0].index("--preset") + 1] == "mae-tiny-fmnist-plain" and "model.patch_size=2" in cmds[0]
    cells = [(c[c.index("--preset") + 1], next(w for w in c if w.startswith("train.aux="))) for c in cmds[1:]]
    assert cells == [(p, f"train.aux={a}") for a in ("none", "repa", "dispersive")
                     for p in ("sit-tiny-fmnist-plain", "sit-tiny-fmnist")]
    for argv in cmds[1:]:
        assert {"model.embed_dim=384", "model.depth=12", "model.patch_size=2", "data.path=/fm"} <= set(argv)
        assert "--resume" in argv and f"train.out_dir={out}/target" not in argv
    target = next(w for w in cmds[3] if w.startswith("train.aux_target="))
    assert target.startswith(f"train.aux_target={out}/target/checkpoints/")
    assert main([*cmds[4], "--print-config"]) == 0  # decayed + REPA at SiT-S/2: 384 wide, 12 blocks, patch 2
    assert "embed_dim: 384" in capsys.readouterr().out
    script = clone / "docs" / "results" / "alternatives" / "gpu_sit_s2.sh"
    proc = subprocess.run(["bash", str(script), str(tmp_path / "s2")], capture_output=True, text=True, timeout=60,
                          env={**{k: v for k, v in os.environ.items() if k not in SCRIPT_ENV},
                               "FMNIST": str(tmp_path / "none")})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "set FMNIST=DIR" in proc.stderr
    proc = subprocess.run(["bash", str(script), str(tmp_path / "s2")], capture_output=True, text=True, timeout=60,
                          env={**{k: v for k, v in os.environ.items() if k not in SCRIPT_ENV}, "BUDGET_S": "8 min"})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "BUDGET_S=8 min is not a positive" in proc.stderr
    assert not (tmp_path / "s2").exists() and not (clone / "runs").exists()


def test_alternatives_sit_collector(clone, tmp_path):
    """collect_sit.py: mean ± std over the seeds of each (decay, aux) cell, read from the runs' logs."""
    for seed, fid in ((0, 30.0), (1, 34.0)):
        run = tmp_path / "runs" / "decay0.8-repa" / f"seed{seed}"
        run.mkdir(parents=True)
        (run / "summary.json").write_text("{}")
        rows = [{"step": 10, "loss": 1.0 + seed, "loss_main": 0.9, "loss_aux": -0.5},
                {"step": 10, "online_proxy_fid": fid, "online_probe_best_top1": 0.5}]
        (run / "log.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    printed = run_script(clone, "alternatives/collect_sit.py", str(tmp_path / "runs"), "--out", str(tmp_path / "o"))
    table = json.loads((tmp_path / "o" / "sit_grid.json").read_text())
    assert table["decay0.8 + repa"]["online_proxy_fid"]["mean"] == 32.0
    assert table["decay0.8 + repa"]["loss"]["values"] == [1.0, 2.0] and "32.00 ± 2.83 (n=2)" in printed


def test_alternatives_grid_collector(clone, tmp_path):
    """collect_grid.py: per design the mean ± std over the seeds that finished and the paired Δ against the plain MAE
    of the same seed, read from eval.json (it never trains)."""
    def write(seed: int, folder: str, knn: float, ep: float | None = None) -> None:
        run = tmp_path / "runs" / "clean" / f"seed{seed}" / folder
        (run / "eval").mkdir(parents=True)
        results = [{"metric": "knn", "values": {"top1": knn}}, {"metric": "probe", "values": {"top1": knn + 0.01}},
                   {"metric": "rank", "values": {"effective_rank": 1.0}}]
        (run / "eval" / "eval.json").write_text(json.dumps({"results": results}))
        if ep is not None:  # `resdecay eval … --evals ep,linear_sweep --out <run>/eval-probes`
            (run / "eval-probes" / folder).mkdir(parents=True)
            probes = [{"metric": "ep", "values": {"top1": ep}}, {"metric": "linear_sweep", "values": {"top1": ep - 0.1}}]
            (run / "eval-probes" / folder / "eval.json").write_text(json.dumps({"results": probes}))

    # the orthogonal design's seed 1 has no probes yet: its EP is not averaged over one seed
    for seed, (plain, ortho) in enumerate(((0.70, 0.75), (0.72, 0.71))):
        write(seed, "plain-mae", plain, ep=0.8 + seed / 10)
        write(seed, "orthogonal", ortho, ep=0.85 if seed == 0 else None)
    printed = run_script(clone, "alternatives/collect_grid.py", str(tmp_path / "runs"), "--out", str(tmp_path / "o"))
    table = json.loads((tmp_path / "o" / "grid.json").read_text())["clean"]
    assert set(table) == {"plain MAE", "orthogonal"} and table["plain MAE"]["d_knn"] is None
    assert abs(table["orthogonal"]["d_knn"]["mean"] - 0.02) < 1e-9 and table["orthogonal"]["wins_knn"] == "1/2"
    assert "| orthogonal | 0.730 ± 0.028 (n=2)" in printed
    assert table["orthogonal"]["per_seed"]["seed1"] == {"knn": 0.71, "probe": 0.72, "rank": 1.0}
    assert abs(table["plain MAE"]["ep"]["mean"] - 0.85) < 1e-9 and "ep" not in table["orthogonal"]
    assert "| plain MAE | 0.850 ± 0.071 (n=2) | 0.750 ± 0.071 (n=2) | - | - |" in printed
    assert "| orthogonal | 0.850" not in printed
    # once its seed 1 is measured too, the design's EP is paired seed by seed: +0.05 and -0.02
    folder = tmp_path / "runs/clean/seed1/orthogonal/eval-probes/orthogonal"
    folder.mkdir(parents=True)
    probes = [{"metric": "ep", "values": {"top1": 0.88}}, {"metric": "linear_sweep", "values": {"top1": 0.5}}]
    (folder / "eval.json").write_text(json.dumps({"results": probes}))
    printed = run_script(clone, "alternatives/collect_grid.py", str(tmp_path / "runs"), "--out", str(tmp_path / "o"))
    table = json.loads((tmp_path / "o" / "grid.json").read_text())["clean"]
    assert abs(table["orthogonal"]["d_ep"]["mean"] - 0.015) < 1e-9 and table["orthogonal"]["wins_ep"] == "1/2"
    assert "| orthogonal | 0.865 ± 0.021 (n=2) |" in printed
    # --versus: a second pairing, here against the orthogonal design itself (the plain MAE is behind it in seed 0)
    run_script(clone, "alternatives/collect_grid.py", str(tmp_path / "runs"), "--out", str(tmp_path / "v"),
               "--versus", "orthogonal")
    versus = json.loads((tmp_path / "v" / "grid.json").read_text())["clean"]
    assert versus["orthogonal"]["d_knn vs orthogonal"] is None and versus["orthogonal"]["d_knn"] == table["orthogonal"]["d_knn"]
    assert abs(versus["plain MAE"]["d_knn vs orthogonal"]["mean"] + 0.02) < 1e-9
    assert versus["plain MAE"]["wins_knn vs orthogonal"] == "1/2"
    code, _, err = run_python_here(clone / "docs/results/alternatives/collect_grid.py", [str(tmp_path / "runs"), "--out",
                                   str(tmp_path / "b"), "--versus", "decay 0.9"], tmp_path, {})
    assert code == 2 and "--versus 'decay 0.9' is not a design" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "b").exists()

