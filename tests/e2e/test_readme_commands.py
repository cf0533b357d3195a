"""The docs are executable: every command README.md and the docs/ pages show (the measurement logs listed
in tests/helpers/readme_commands.py's LOG_PAGES aside), and every ``examples:`` line of ``resdecay
SUBCOMMAND --help``, runs at its smallest size (tiny models, one epoch, fake data in place of real folders,
tiny stand-ins for placeholder paths) and must exit 0; the ones another test runs already are skipped naming
it (once it is checked to exist and to run them), the ones that cannot run here with the reason. A command
added to a page or to --help that the table does not know fails ``test_every_shown_command_has_a_plan``;
the pages' ```python blocks run likewise."""

from __future__ import annotations

import glob
import importlib
import os
import pickle
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import readme_commands as rc
from helpers import seed_proxy_cache
from helpers.readme_blocks import PYTHON_BLOCKS
from helpers.readme_workspace import Workspace
from resdecay.cli import main

COMMANDS = rc.all_commands()
BLOCKS = rc.all_python_blocks()
ROOT = rc.ROOT


@pytest.fixture(scope="session")
def shared(tmp_path_factory):
    return Workspace(tmp_path_factory.mktemp("readme"))


@pytest.fixture
def workspace(shared, monkeypatch, digits_proxy):
    """The shared artifacts; proxy-FID extractors (trained once) are cached inside it, never in the home folder. The
    digits one (`demo --diffusion`'s) is the session's own, trained once for every test that needs it."""
    seed_proxy_cache(digits_proxy, shared.root / "cache" / "resdecay" / "fid")
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared.root / "cache"))
    return shared


def shrink_demo(mp, ctx: rc.Context) -> None:
    """`resdecay demo` has no size flags: its recipes get the tiny sizes, Fashion-MNIST the fake files."""
    from resdecay.commands import demo

    tiny = [o.format_map(ctx) for o in rc.FMNIST if "=" in o and "out_dir" not in o] + ["data.train_subset=96"]
    mp.setattr(demo, "fashion_mnist_available", lambda: True)
    for name, (preset, extra, alpha) in list(demo.DEMO_DATA.items()):
        sized = [o for o in tiny if name != "digits" or not o.startswith("data.path=")]
        mp.setitem(demo.DEMO_DATA, name, (preset, [*extra, *sized], alpha))


def shrink_diffusion_demo(mp, ctx: rc.Context) -> None:
    """`demo --diffusion` on digits (what a machine without Fashion-MNIST runs: its proxy FID reads the
    data set's default folder), tiny U-ViTs, 130 samples of 2 sampler steps."""
    from resdecay.commands import demo, demo_diffusion

    mp.setattr(demo, "fashion_mnist_available", lambda: False)
    extra, *_ = demo_diffusion.DEMO_DATA["digits"]
    tiny = [o for o in rc.UVIT if "=" in o and not o.startswith(("data.path", "train.out_dir"))]
    mp.setitem(demo_diffusion.DEMO_DATA, "digits", ([*extra, *tiny, "data.train_subset=96"], 130, 64, 32))
    mp.setattr(demo_diffusion, "STEPS", 2)


PATCHES = {"demo": shrink_demo, "demo_diffusion": shrink_diffusion_demo}


def killed_run(ctx: rc.Context, argv: list[str]) -> None:
    """The run `--resume auto` continues: trained to the end, then its newest checkpoint and summary
    removed, which is what a kill -9 between two checkpoints leaves."""
    i = argv.index("--resume")
    assert main(argv[1:i] + argv[i + 2:]) == 0
    run = ctx["tmp"] / "run"
    *_, newest = sorted(run.glob("checkpoints/step_*.pt"))
    newest.unlink()
    (run / "summary.json").unlink()


def cifar100(ctx: rc.Context, argv: list[str]) -> None:
    """CIFAR-100's python pickles beside the fake CIFAR-10 in /data/cifar's stand-in."""
    folder = ctx["fake_cifar10"] / "cifar-100-python"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 8), ("test", 4)):
        with open(folder / split, "wb") as f:
            pickle.dump({"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), "fine_labels": list(range(n))}, f)


def imported_vitmae(ctx: rc.Context, argv: list[str]) -> None:
    """imported.pt in the test's folder, as docs/plug-and-play.md's import-weights line writes it."""
    assert main(["import-weights", str(ctx["vitmae"]), "--format", "hf-vitmae", "--preset", "mae-tiny-digits-plain",
                 "--out", str(ctx["tmp"] / "imported.pt")]) == 0


SEG_FOLDER = "docs/segmentation.md: Your own images and label maps (`--seg-data folder:DIR`)"


def seg_folder(ctx: rc.Context, argv: list[str]) -> None:
    """my-seg/ in the test's folder, written by docs/segmentation.md's own python block."""
    exec(compile(BLOCKS[SEG_FOLDER], SEG_FOLDER, "exec"), {})


SETUPS = {"killed_run": killed_run, "cifar100": cifar100, "imported_vitmae": imported_vitmae, "seg_folder": seg_folder}


def run_subprocess(argv: list[str], cwd: Path, timeout: int) -> tuple[int, str]:
    """torchrun lines with 2 CPU processes (a free port), benchmark scripts with the test's python.
    A command still running after ``timeout`` seconds is killed with all its processes (torchrun's workers)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if argv[0] == "torchrun":
        i = argv.index("--nproc_per_node")
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *argv[i + 2:]]
        if "--device" not in argv:
            argv.append("train.device=cpu")
    else:  # .venv/bin/python benchmarks/x.py: this python, the script in the checkout
        argv = [sys.executable, str(ROOT / argv[1]), *argv[2:]]
    log = cwd / "subprocess.log"  # a file, not a pipe: a stray worker holding it open cannot block the test
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()  # torchrun passes SIGTERM on to its workers, which run in sessions of their own
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            f.write(f"\n(killed after {timeout} s)")
    return proc.returncode, log.read_text()[-6000:]


def check_runs(nodeid: str, *needles: str) -> None:
    """The test (or fixture) ``nodeid`` exists and its body still says each of ``needles``."""
    path, name = nodeid.split("::")
    body = re.search(rf"^def {name}\(.*?(?=^def |^@|\Z)", (ROOT / path).read_text(), re.S | re.M)
    for needle in needles:
        assert body and needle in body.group(0), f"{nodeid} does not exist or no longer runs {needle!r}"


def skip_if_covered(nodeid: str, needle: str) -> None:
    """Skip, naming the test that runs this already, once that test is checked to exist and to mention it."""
    check_runs(nodeid, needle)
    pytest.skip(f"{needle!r} runs in {nodeid}")


def one_process(argv: list[str], torchrun_in: str) -> list[str]:
    """A torchrun line's ``resdecay SUBCOMMAND ...`` for this process, once ``torchrun_in`` is checked to launch that
    subcommand on 2 processes: each launch starts 3 interpreters (~10 CPU-s here; the three lines took 52.6 CPU-s
    launched, 22.6 here), and what the 2-process run adds (the split, the global means, rank 0 alone writing) is
    what that test asserts."""
    sub = argv[argv.index("resdecay") + 1]
    check_runs(torchrun_in, "torch.distributed.run", f'"{sub}"')
    return argv[argv.index("resdecay"):]


def _params(table: dict, known: dict):
    for name in known:
        plan = table.get(name)
        if plan is None:
            continue
        marks = [pytest.mark.xfail(reason=plan.xfail, strict=not plan.racy)] if plan.xfail else []
        yield pytest.param(name, marks=marks, id=name)


def test_every_shown_command_has_a_plan():
    """A command added to README.md, to a docs/ page or to a --help example must be added to the table too."""
    shown = rc.page_commands()
    unknown = [f"{c} ({', '.join(shown.get(c, ['--help']))})" for c in COMMANDS if c not in rc.PLANS]
    assert not unknown, f"add to PLANS in tests/helpers/readme_commands.py (how to shrink it, or why it is skipped): {unknown}"
    stale = [c for c in rc.PLANS if c not in COMMANDS]
    assert not stale, f"PLANS has commands README, docs/ and --help no longer show: {stale}"
    assert sorted(BLOCKS) == sorted(PYTHON_BLOCKS), "add the page's new ```python block to PYTHON_BLOCKS"


def test_every_docs_page_is_covered_or_a_listed_log():
    """README and every docs/*.md page are read for commands, but for the measurement logs named (with a reason)."""
    covered = {rc.page_name(p) for p in rc.pages()}
    everything = {"README.md", *(rc.page_name(p) for p in rc.DOCS.glob("*.md"))}
    assert covered == everything - set(rc.LOG_PAGES) and "README.md" in covered
    assert set(rc.LOG_PAGES) <= everything, f"LOG_PAGES names pages that do not exist: {set(rc.LOG_PAGES) - everything}"
    assert all(reason for reason in rc.LOG_PAGES.values())
    assert set(rc.page_commands()) <= set(COMMANDS)


def test_readme_links_every_docs_page_and_every_link_resolves():
    """README is the front door: it links each docs/ page, and no relative link of README or docs/ is broken."""
    readme = rc.README.read_text()
    unlinked = [p.name for p in rc.DOCS.glob("*.md") if f"](docs/{p.name}" not in readme]
    assert not unlinked, f"README's table of contents does not link {unlinked}"
    broken = []
    for page in [rc.README, *rc.DOCS.glob("*.md")]:
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            path = target.split("#")[0]
            if path and not re.match(r"[a-z]+:", path) and not (page.parent / path).exists():
                broken.append(f"{rc.page_name(page)}: {target}")
    assert not broken, f"links to files that do not exist: {broken}"


def resolves(dotted: str) -> bool:
    """Whether ``resdecay.a.b.name`` names something: its longest importable module, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for name in parts[i:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


def test_every_resdecay_name_the_pages_give_exists():
    """Issue 38.8: docs/data-at-scale.md named resdecay.data.hf_datasets.save_hf_dataset, an ImportError. Every
    ``resdecay.x.y`` in inline code and every ``from resdecay.x import y`` of README and the docs pages resolves."""
    missing = []
    for page in rc.pages():
        text = page.read_text()
        names = [n for code in re.findall(r"`[^`\n]+`", text)
                 for n in re.findall(r"(?<![\w./-])resdecay(?:\.[A-Za-z_]\w*)+", code)]
        names += [f"{module}.{n}" for module, listed in re.findall(r"^\s*from (resdecay[\w.]*) import ([\w, ()]+)", text, re.M)
                  for n in re.findall(r"\w+", listed)]
        missing += [f"{rc.page_name(page)}: {n}" for n in dict.fromkeys(names) if not resolves(n)]
    assert not missing, f"the pages name what resdecay does not have: {missing}"


def test_readme_front_door_keeps_the_setup_commands_first():
    """CI (.ci/run) runs README's test command; the demo and the test set-up stay README's first two code blocks."""
    readme = rc.README.read_text()
    first, second = re.findall(r"^```\w*\n(.*?)^```", readme, re.S | re.M)[:2]
    assert first.strip().endswith(".venv/bin/resdecay demo") and first.startswith("python3 -m venv .venv")
    assert second.strip() == ("python3 -m venv .venv && .venv/bin/pip install torch==2.14.1 torchvision==0.29.1 && "
                              ".venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest -q -m 'not gpu' -n auto")
    assert ".venv/bin/python -m pytest -q -m 'not gpu' -n auto\n" in (rc.ROOT / ".ci" / "run").read_text()
    assert len(readme.splitlines()) <= 200 and "](docs/img/" in "\n".join(readme.splitlines()[:40])


def test_commands_are_read_as_a_shell_would():
    """Comments dropped, quotes removed, `&&` chains split, other lines ignored: what the table's keys are made of."""
    text = ("```bash\nresdecay ablate --only \"plain MAE,alpha 0.8\"   # a note\n"
            "python3 -m venv v && .venv/bin/pip install -e '.[test]'\necho not a command\n```\n"
            "```python\nresdecay.alpha_schedule(12, 0.6)\n```\n")
    cmds = rc.readme_bash_commands(text)
    assert cmds == [["resdecay", "ablate", "--only", "plain MAE,alpha 0.8"], ["python3", "-m", "venv", "v"],
                    [".venv/bin/pip", "install", "-e", ".[test]"]]
    assert rc.key(cmds[0]) not in rc.PLANS  # a new command like this one fails test_every_shown_command_has_a_plan
    # a bare ``` block is a shell block too, a trailing backslash joins the next line, other languages are not read
    text = ("```\nresdecay submit --nodes 2 \\\n    pretrain --preset mae-b16   # a note\n```\n"
            "```json\n{\"command\": \"x\"}\npython is not run here\n```\n```text\nresdecay printed this\n```\n")
    assert rc.readme_bash_commands(text) == [["resdecay", "submit", "--nodes", "2", "pretrain", "--preset", "mae-b16"]]
    assert rc.python_blocks("# T\n```python\na = 1\n```\n## H\n```python\nb = 2\n```\n", "p.md") == {
        "p.md: # T": "a = 1\n", "p.md: H": "b = 2\n"}


@pytest.mark.parametrize("command", list(_params(rc.PLANS, COMMANDS)))
def test_readme_command(command, workspace, tmp_path, request, capsys, monkeypatch):
    """One README / --help command, shrunk as its Plan says, exits 0 and writes and says what it should."""
    plan = rc.PLANS[command]
    if plan.skip:
        pytest.skip(f"{command!r}: {plan.skip}")
    if plan.covered:
        skip_if_covered(plan.covered, plan.needle or Path(command.split()[1]).stem)  # the script's or command's name
    monkeypatch.chdir(tmp_path)  # relative outputs (runs/alpha, mae.pt, vit.safetensors) land here
    torch.set_num_threads(1)  # tiny models gain nothing from a second thread; FID's 2048x2048 eigvals lose much on a busy host
    ctx = rc.Context(request, workspace, tmp_path)
    if plan.setup in SETUPS:
        SETUPS[plan.setup](ctx, rc.resolve(COMMANDS[command], rc.Plan(add=plan.add), ctx))
    elif plan.setup:
        getattr(workspace, plan.setup)
    if plan.patch:
        PATCHES[plan.patch](monkeypatch, ctx)
    argv = rc.resolve(COMMANDS[command], plan, ctx)
    if plan.torchrun_in:
        argv = one_process(argv, plan.torchrun_in)
    if argv[0] == "resdecay" or argv[0].endswith("/resdecay"):
        code = main(argv[1:])
        log = "".join(capsys.readouterr())
    else:
        code, log = run_subprocess(argv, tmp_path, plan.timeout)
    assert code == 0, f"{' '.join(argv)}\n{log[-6000:]}"
    for text in plan.says:
        assert text.format_map(ctx) in log, f"{command}: the output does not say {text.format_map(ctx)!r}\n{log[-3000:]}"
    for pattern in plan.expect:
        pattern, _, text = pattern.format_map(ctx).partition("::")
        found = glob.glob(pattern)
        assert found, f"{command}: nothing written at {pattern}\n{log[-3000:]}"
        assert not text or text in Path(found[0]).read_text(errors="replace"), f"{command}: {found[0]} does not say {text!r}"


@pytest.mark.parametrize("title", sorted(BLOCKS))
def test_readme_python_block(title, workspace, tmp_path, monkeypatch):
    """The pages' ```python blocks as written (bar the listed size replacements), and their stated values."""
    plan = PYTHON_BLOCKS.get(title)
    if isinstance(plan, tuple):
        skip_if_covered(*plan)
    code = BLOCKS[title]
    for old, new in (plan or {}).items():
        assert old in code, f"block {title!r} no longer contains {old!r}: update PYTHON_BLOCKS"
        code = code.replace(old, new)
    monkeypatch.chdir(tmp_path)
    scope: dict = {"MAE_CKPT": str(workspace.mae_ckpt)} if "MAE_CKPT" in code else {}
    exec(compile(code, title, "exec"), scope)
    CHECKS[title](scope)


def check_decayify(scope: dict) -> None:
    alphas = scope["resdecay"].alphas_of(scope["resnet"])
    assert alphas[0] == ("layer1.0", (1.0,)) and alphas[1][0] == "layer1.1" and round(alphas[1][1][0], 3) == 0.957
    assert alphas[-1] == ("layer4.1", (0.7,)) and scope["resnet"].resdecay_spec["alpha_min"] == 0.7
    assert Path("vit.pt").is_file()


def check_train_hooks(scope: dict) -> None:
    assert scope["steps"].seen == [(0, 22), (1, 44)]  # 1,437 digits, batch 64: 22 steps an epoch
    assert scope["summary"]["checkpoint"].endswith("runs/hooks-demo/checkpoints/step_00000044.pt")
    assert Path(scope["summary"]["checkpoint"]).is_file()


def check_library(scope: dict) -> None:
    r = scope["resdecay"]
    assert f"{r.effective_decay(scope['a']):.2e}" == "3.58e-03" and f"{r.solve_alpha_min(24, 5e-3):.4f}" == "0.7951"
    with torch.device("meta"):  # the ViT-B/16 U-Net MAE's size as README states it, without allocating it
        vit_b = scope["MaskedAutoencoder"](scope["MAEConfig"](alpha_min=0.6))
    assert round(sum(p.numel() for p in vit_b.parameters()) / 1e6, 2) == 117.29
    x = torch.randn(2, 5, 384)
    assert torch.equal(scope["block"](x), 0.85 * (0.9 * x))  # README: "== 0.85 * (0.9 * x) exactly"
    assert scope["pred"].shape[:2] == (2, 4) and [f.shape for f in scope["feats"]] == [(2, 5, 32)] * 2
    assert scope["cfg"].model.alpha_min == 0.6 and torch.isfinite(scope["loss"])


def check_sharing(scope: dict) -> None:
    assert Path("mae-hf/README.md").is_file() and Path("mae-hf/model.safetensors").is_file()
    config, cfg = scope["config"], scope["cfg"]
    assert config["alpha"]["alpha_min"] == cfg.model.alpha_min and 0 < config["alpha"]["alpha_eff"] <= 1
    x = torch.randn(2, cfg.model.in_chans, cfg.model.img_size, cfg.model.img_size)
    reloaded, _ = scope["resdecay"].load_model(scope["MAE_CKPT"])
    assert torch.equal(scope["model"].forward_features(x), reloaded.eval().forward_features(x))


def check_front_door(scope: dict) -> None:
    alphas = scope["resdecay"].alphas_of(scope["vit"])
    assert alphas[0] == ("blocks.0", (1.0, alphas[0][1][1])) and len(alphas) == 12  # ViT-B/16 and the tiny one: 12 blocks
    name, (a_attn, a_mlp) = alphas[-1]
    assert name == "blocks.11" and round(a_attn, 3) == 0.617 and a_mlp == 0.6  # README: ("blocks.11", (0.617, 0.6))
    saved = torch.load("vit.pt", weights_only=True)
    assert saved["resdecay_spec"]["alpha_min"] == 0.6 and set(saved["model"]) == set(scope["vit"].state_dict())


def check_seg_folder(scope: dict) -> None:
    from PIL import Image

    root = Path("my-seg")
    assert len(list((root / "images").glob("*.png"))) == 6 and len(list((root / "images").glob("*.jpg"))) == 6
    maps = [np.asarray(Image.open(p)) for p in sorted((root / "labels").glob("*.png"))]
    assert len(maps) == 12 and set(np.unique(np.stack(maps)).tolist()) == {0, 1, 2, 255}
    assert (root / "classes.txt").read_text().split() == ["ground", "square", "disc"]


def check_diagnose(scope):
    """A fresh MAE's branches are zero-initialised: the direct path is the whole stream at every depth."""
    shares = scope["report"]["paths"]["direct_projection"]
    assert len(shares) == scope["model"].num_blocks and all(abs(s - 1) < 1e-5 for s in shares)


CHECKS = {"README.md: Decayed shortcuts in your model": check_front_door,
          "docs/diagnostics.md: # Residual-stream diagnostics: what the identity path carries": check_diagnose,
          SEG_FOLDER: check_seg_folder,
          "docs/interop.md: Decayed shortcuts in models you already have": check_decayify,
          "docs/python-api.md: Library": check_library, "docs/trackers-and-sharing.md: Sharing a model": check_sharing,
          "docs/python-api.md: Training from Python: `train(cfg, hooks=[...])`": check_train_hooks}
