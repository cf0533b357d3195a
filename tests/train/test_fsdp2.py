"""Past DDP on this machine's CPUs (gloo): ``train.parallel=hsdp | fsdp2`` against one process, HSDP on two "nodes"
of two processes killed -9 (every rank) and its DCP checkpoint resumed as FSDP2 on another number of processes, and
the single-file conversion against the state gathered from the live shards.

Every run is the same tiny digits MAE (4 blocks of width 32, 640 images, 32 per optimizer step: 20 steps, a log row
each, checkpoints every 10) with an EMA and a learnable α (0-d parameters, which FSDP2 cannot split: kept whole on
every rank, their gradients averaged) and ``train.noise_scope=global``, so its losses depend on the effective batch, not on how
many processes share it: one process (this one) is the reference of every other layout. Starting torchrun costs ~10 s
of a 2-core machine, so the runs are module fixtures, each read by several checks.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from helpers import free_port, model_overrides
from resdecay.errors import CheckpointError, ConfigError, UserError
from resdecay.train import checkpoint as ckpt
from resdecay.train import train
from resdecay.train.config import load_config
from resdecay.train.parallel import check_layout
from resdecay.train.sharded_checkpoint import consolidate, read_meta

pytestmark = pytest.mark.slow

STEPS = 20
COMMON = ["--preset", "mae-tiny-digits", "--no-progress", *model_overrides("mae"), "data.train_subset=640",
          "train.epochs=1", "train.warmup_epochs=0.5", "train.log_every=1", "train.ckpt_every=10", "train.threads=1",
          "train.noise_scope=global", "train.ema_decay=0.9", "model.shortcut=learnable"]

# `resdecay ARGS` as one rank, recording what the checks read: the process's RANK / LOCAL_RANK and the local
# rank resdecay took (HSDP's two nodes), and, at every sharded save, the model gathered from its live shards.
DRIVER = textwrap.dedent('''
    import json, os, pathlib, sys
    import torch
    from resdecay.cli import main
    from resdecay.train import checkpoint, distributed

    record = pathlib.Path(sys.argv[1])
    real_setup, real_save = distributed.setup, checkpoint.sharded.save_sharded

    def setup(*a, **k):
        env = real_setup(*a, **k)
        ranks = {"RANK": os.environ["RANK"], "LOCAL_RANK": os.environ["LOCAL_RANK"], "local_rank": env.local_rank}
        (record / f"rank{env.rank}.json").write_text(json.dumps(ranks))
        return env

    def save_sharded(folder, tensors, meta, is_main, keep_last):
        gathered = {k: v.full_tensor() if hasattr(v, "full_tensor") else v  # a collective: every rank
                    for k, v in tensors["model"].items()}  # (the learnable alphas are whole on every rank)
        if is_main:
            torch.save(gathered, record / f"gathered_{pathlib.Path(folder).name}.pt")
        return real_save(folder, tensors, meta, is_main, keep_last)

    distributed.setup, checkpoint.sharded.save_sharded = setup, save_sharded
    sys.exit(main(sys.argv[2:]))
''')


def launch(tmp, name, procs, *settings, nodes=1, resume=None, wait=True):
    """``torchrun`` (``nodes`` launches of ``procs`` processes each, as two machines would) of ``COMMON`` into
    ``tmp/name``; returns the run folder (or, ``wait=False``, the launches' Popens)."""
    record, out = tmp / f"{name}-record", tmp / name
    record.mkdir(exist_ok=True)
    (record / "driver.py").write_text(DRIVER)
    port, env = free_port(), {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [str(record / "driver.py"), str(record), "pretrain", *COMMON, *settings, f"train.out_dir={out}",
            *(["--resume", resume] if resume else [])]
    procs_ = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--node_rank",
                                str(n), "--nproc_per_node", str(procs), "--master_addr", "127.0.0.1", "--master_port",
                                str(port), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                               start_new_session=True) for n in range(nodes)]
    if not wait:
        return procs_
    outs = [p.communicate(timeout=600)[0] for p in procs_]
    assert all(p.returncode == 0 for p in procs_), "\n".join(outs)[-4000:]
    (out / "stdout.txt").write_text(outs[0])
    return out


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc: each process's parent is the 4th field of its stat)."""
    parents = {}
    for stat in os.listdir("/proc"):
        if stat.isdigit():
            try:
                parents[int(stat)] = int(open(f"/proc/{stat}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [pid]
    while frontier:
        kids = [p for p, parent in parents.items() if parent in frontier]
        found, frontier = found + kids, kids
    return found


def losses(out) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if "loss" in r}


def final(out) -> dict:
    return ckpt.load_checkpoint(ckpt.list_checkpoints(out / "checkpoints")[-1])


def assert_same_run(run, reference, rel=1e-5, atol=1e-6):
    a, b = losses(run), losses(reference)
    assert a and set(a) <= set(b)
    for step in a:
        assert abs(a[step] - b[step]) <= rel * abs(b[step]), (step, a[step], b[step])
    x, y = final(run), final(reference)
    assert x["train_state"]["step"] == y["train_state"]["step"] == STEPS
    for part in ("model", "ema"):
        for k in y[part]:
            torch.testing.assert_close(x[part][k], y[part][k], rtol=0, atol=atol, msg=f"{part} {k}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One process (the reference, 32 images a step, in this process), and HSDP on two "nodes" of 2 processes (8 images
    each; two torchrun launches, ``--nnodes 2``) killed -9, both torchruns and every rank at once, once its step-10
    checkpoint is on disk, then finished by ``--resume auto`` as FSDP2 on 2 processes (16 each): DCP reshards the
    2-D mesh's checkpoint (replicate 2 x shard 2) onto a 1-D mesh of 2."""
    tmp = tmp_path_factory.mktemp("fsdp2")
    reference = tmp / "reference"
    train(tiny(reference, "train.batch_size=32"), progress=False)
    out = tmp / "sharded"
    nodes = launch(tmp, "sharded", 2, "train.batch_size=8", "train.parallel=hsdp", nodes=2, wait=False)
    deadline = time.time() + 300
    while (not ckpt.list_checkpoints(out / "checkpoints") and time.time() < deadline
           and all(p.poll() is None for p in nodes)):
        time.sleep(0.05)
    for pid in [q for p in nodes for q in (p.pid, *descendants(p.pid))]:  # both torchruns and their ranks at once
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    record = tmp / "sharded-record"
    killed = {"returncodes": [p.wait() for p in nodes], "stdout": nodes[0].stdout.read(), "losses": losses(out),
              "checkpoints": [p.name for p in ckpt.list_checkpoints(out / "checkpoints")],
              "ranks": [json.loads((record / f"rank{r}.json").read_text()) for r in range(4)]}
    launch(tmp, "sharded", 2, "train.batch_size=16", "train.parallel=fsdp2", resume="auto")
    return {"reference": reference, "sharded": out, "killed": killed, "tmp": tmp}


def test_hsdp_on_two_nodes_killed_then_resumed_as_fsdp2_on_two_trains_as_one_process(runs):
    # every loss, before the kill (HSDP, 4 ranks) and after the resume (FSDP2, 2 ranks), and the gathered end state
    # (weights, EMA, learnable alphas) are the uninterrupted one-process run's: to 1e-5 and 1e-6, the reductions add
    # in another order
    killed, out = runs["killed"], runs["sharded"]
    assert killed["returncodes"] == [-signal.SIGKILL] * 2, "the run finished before it could be killed"
    assert killed["checkpoints"] == ["step_00000010"] and min(killed["losses"]) == 1
    assert "mesh replicate 2 node(s) x shard 2 per node" in killed["stdout"]
    # the second node's ranks 2 and 3 are its local ranks 0 and 1 (willisma/SiT#8: a device from the global rank)
    assert [(int(r["RANK"]), r["local_rank"]) for r in killed["ranks"]] == [(0, 0), (1, 1), (2, 0), (3, 1)]
    reference = losses(runs["reference"])
    assert all(abs(loss - reference[s]) <= 1e-5 * reference[s] for s, loss in killed["losses"].items() if s <= 10)
    stdout = (out / "stdout.txt").read_text()
    assert "resumed from" in stdout and "step_00000010 at step 10" in stdout and "mesh shard 2" in stdout
    steps = [json.loads(line)["step"] for line in (out / "log.jsonl").read_text().splitlines() if '"loss"' in line]
    assert steps == list(range(1, STEPS + 1))  # the log continues without duplicates
    assert_same_run(out, runs["reference"])
    folders = ckpt.list_checkpoints(out / "checkpoints")
    assert [f.name for f in folders] == ["step_00000010", "step_00000020"] and all(f.is_dir() for f in folders)


def test_consolidated_checkpoint_equals_the_state_gathered_from_the_shards(runs, capsys):
    folder = ckpt.list_checkpoints(runs["sharded"] / "checkpoints")[-1]
    gathered = torch.load(runs["tmp"] / "sharded-record" / f"gathered_{folder.name}.pt", weights_only=True)
    state = consolidate(folder, read_meta(folder, ckpt.FORMAT))
    assert gathered.keys() == state["model"].keys()
    assert all(torch.equal(gathered[k], state["model"][k]) for k in gathered)
    # the command writes it as one file that loads as a training checkpoint and as a model
    from resdecay.cli import main
    out = runs["tmp"] / "one.pt"
    assert main(["checkpoint", "consolidate", str(folder), "--out", str(out)]) == 0
    one = ckpt.load_checkpoint(out)
    assert all(torch.equal(one["model"][k], gathered[k]) for k in gathered)
    assert sorted(one["optimizer"]["state"]) == list(range(len(one["optimizer"]["state"])))
    model, _ = ckpt.load_model(folder)  # every command reads the folder itself too
    weights = model.state_dict()
    assert all(torch.equal(weights[k], gathered[k]) for k in gathered)
    assert main(["export", str(folder), "--to", "hf", "--out", str(runs["tmp"] / "hf")]) == 0  # (timm: no learnable alpha)
    from resdecay.interop.import_weights import load_pretrained
    pretrained = load_pretrained(folder).state["model"]  # what pretrain --from and finetune read
    assert all(torch.equal(pretrained[k], gathered[k]) for k in gathered)
    assert main(["checkpoint", "consolidate", str(folder), "--out", str(out)]) == 2  # never overwritten silently
    assert "exists" in capsys.readouterr().err


# ----------------------------------------------------------------------------- one process, bad input
def tiny(tmp_path, *more):
    overrides = [*COMMON[3:], *more, f"train.out_dir={tmp_path}"]
    return load_config("mae-tiny-digits", [o for o in overrides if o != "--no-progress"])


def test_one_process_bad_inputs(tmp_path, capsys):
    sharded = tmp_path / "sharded"
    train(tiny(sharded, "train.parallel=fsdp2", "train.batch_size=32"), progress=False)  # a one-rank mesh, said once
    assert capsys.readouterr().out.count("fsdp2 on one process: nothing to shard") == 1
    kept = ckpt.list_checkpoints(sharded / "checkpoints")
    folder = kept[-1]
    with pytest.raises(CheckpointError, match="sharded .DCP. checkpoint, but train.parallel=ddp"):
        train(tiny(sharded, "train.batch_size=32", "train.epochs=2"), resume="auto", progress=False)
    with pytest.raises(CheckpointError, match="different model .model.depth"):
        train(tiny(sharded, "train.parallel=fsdp2", "train.batch_size=32", "model.depth=6", "train.epochs=2"),
              resume="auto", progress=False)
    single = tmp_path / "single"
    train(tiny(single, "train.batch_size=32"), progress=False)
    with pytest.raises(CheckpointError, match="single-file .DDP. checkpoint, but train.parallel=fsdp2"):
        train(tiny(single, "train.parallel=fsdp2", "train.batch_size=32", "train.epochs=2"), resume="auto", progress=False)
    shard = folder / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"incomplete: shard __0_0.distcp holds \d+ of its \d+ bytes .truncated"):
        train(tiny(sharded, "train.parallel=fsdp2", "train.batch_size=32", "train.epochs=2"), resume=str(folder),
              progress=False)
    with pytest.raises(CheckpointError, match="incomplete"):
        ckpt.load_checkpoint(folder)
    assert ckpt.list_checkpoints(sharded / "checkpoints") == kept  # nothing lost


def test_hsdp_nodes_must_divide_the_processes():
    check_layout("hsdp", 4, 2)
    with pytest.raises(ConfigError, match="2 node.s. does not divide the 3 processes"):
        check_layout("hsdp", 3, 2)
    with pytest.raises(ConfigError, match="hsdp_nodes must be a positive integer"):
        load_config("mae-tiny-digits", ["train.hsdp_nodes=0"])
    with pytest.raises(ConfigError, match="train.aux=dispersive keeps its projector"):
        load_config("sit-tiny-fmnist", ["train.parallel=fsdp2", "train.aux=dispersive"])


def test_consolidate_refuses_what_is_not_a_dcp_folder(tmp_path):
    from resdecay.commands.consolidate import run_consolidate
    with pytest.raises(CheckpointError, match="not a sharded .DCP. resdecay checkpoint"):
        run_consolidate(str(tmp_path), str(tmp_path / "x.pt"))
    with pytest.raises((UserError, CheckpointError)):
        run_consolidate(str(tmp_path / "missing"), str(tmp_path / "x.pt"))



def one_rank_gradients_match(model, x) -> list:
    """``parallelize`` ``model`` on a one-rank mesh (in this process) and check the sharded model's gradients of one
    forward equal the unsharded copy's; returns the modules it sharded one by one."""
    import copy

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from resdecay.train.parallel import parallelize, shard_units

    plain, units = copy.deepcopy(model), shard_units(model)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        sharded = parallelize(model, init_device_mesh("cpu", (1,)))
        for m in (plain, sharded):  # the root forward: FSDP2 gathers the root's own weights there
            torch.manual_seed(1)  # the same masks
            out = m(x)
            (out[0] if isinstance(out, tuple) else out).square().mean().backward()
        grads = {n: p.grad for n, p in plain.named_parameters()}
        for n, p in sharded.named_parameters():
            if p.grad is not None:
                g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                torch.testing.assert_close(g, grads[n], rtol=1e-5, atol=1e-7, msg=n)
    finally:
        dist.destroy_process_group()
    return units


def test_parallelize_shards_a_decayified_timm_vit_per_block():
    # the function a Lightning ModelParallelStrategy would call, on another library's model (a one-rank mesh here:
    # the several-rank equalities are the torchrun checks above)
    import timm
    from torch.distributed.fsdp import FSDPModule

    from resdecay import decayify

    torch.manual_seed(0)
    vit = decayify(timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=3, num_classes=0),
                   alpha_min=0.6)
    blocks = list(vit.blocks)
    assert one_rank_gradients_match(vit, torch.randn(2, 3, 32, 32)) == blocks  # the blocks decayify found
    assert all(isinstance(b, FSDPModule) for b in vit.blocks) and isinstance(vit, FSDPModule)


def test_parallelize_takes_a_hyper_connected_mae_whole():
    # the streams' steps call each block's branches, not its forward: one unit, gathered at once (still sharded state)
    from resdecay.models import build_model

    cfg = load_config("mae-tiny-digits", [*model_overrides("mae"), "model.hyper_streams=2"])
    torch.manual_seed(0)
    assert one_rank_gradients_match(build_model(cfg.model), torch.randn(2, 1, 8, 8)) == []


def test_bad_sharded_input_is_one_line_at_the_command_and_loses_nothing(tmp_path, capsys):
    from helpers import assert_one_line_error, run

    def pretrain(out, *more):
        return run(capsys, "pretrain", *COMMON, "train.batch_size=32", *more, f"train.out_dir={out}")

    sharded, single = tmp_path / "sharded", tmp_path / "single"
    assert pretrain(sharded, "train.parallel=fsdp2")[0] == 0 and pretrain(single)[0] == 0
    before = {p: p.stat().st_mtime_ns for p in (sharded / "checkpoints").rglob("*")}
    folder = ckpt.list_checkpoints(sharded / "checkpoints")[-1]
    for code_out_err, fragments in [
        (pretrain(sharded, "train.epochs=2", "--resume", "auto"), ("sharded (DCP) checkpoint, but train.parallel=ddp",
                                                                   "resdecay checkpoint consolidate")),
        (pretrain(single, "train.parallel=fsdp2", "train.epochs=2", "--resume", "auto"),
         ("single-file (DDP) checkpoint, but train.parallel=fsdp2",)),
        (pretrain(sharded, "train.parallel=fsdp2", "model.depth=6", "train.epochs=2", "--resume", "auto"),
         ("different model", "model.depth")),
        (pretrain(tmp_path / "x", "train.parallel=fsdp3"), ("train.parallel", "fsdp3")),
        (pretrain(tmp_path / "x", "train.noise_scope=batch"), ("train.noise_scope", "batch")),
        (pretrain(tmp_path / "x", "train.hsdp_nodes=0"), ("train.hsdp_nodes must be a positive integer",)),
        (pretrain(tmp_path / "x", "train.parallel=fsdp2", "train.aux=dispersive"), ("train.aux",)),
        (run(capsys, "checkpoint", "consolidate", str(folder), "--out", str(tmp_path / "one.txt")), ("FILE.pt",)),
        (run(capsys, "checkpoint", "consolidate", str(single), "--out", str(tmp_path / "one.pt")),
         ("not a sharded (DCP) resdecay checkpoint",)),
    ]:
        code, _, err = code_out_err
        assert_one_line_error(code, err, *fragments)
    assert {p: p.stat().st_mtime_ns for p in (sharded / "checkpoints").rglob("*")} == before  # nothing lost
    assert not (tmp_path / "x").exists() and not (tmp_path / "one.txt").exists()
