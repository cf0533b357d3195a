"""docs/examples/diffusers_sd3.py at CI size: a decayified SD3 MM-DiT (both streams on the schedule, the paper's zero
init) trained on diffusers' flow-matching objective on scikit-learn's digits, saved with ``save_pretrained`` and
reloaded by diffusers' ``from_pretrained`` + ``resdecay.interop.restore``: the loss falls, and the reloaded model's
alphas and outputs are the trained one's."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "docs" / "examples" / "diffusers_sd3.py"


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def test_sd3_trains_with_flow_matching_and_reloads_through_from_pretrained_and_restore(tmp_path, capsys):
    from diffusers import SD3Transformer2DModel

    import resdecay

    ex = runpy.run_path(str(SCRIPT), run_name="example_diffusers_sd3")
    run = ex["main"](["--steps", "30", "--batch-size", "8", "--sample-steps", "2", "--out", str(tmp_path / "run"),
                      "--seed", "0"])
    out = capsys.readouterr().out
    steps, losses = zip(*run["losses"], strict=True)
    assert list(steps) == list(range(1, 31))
    assert mean(losses[-10:]) < 0.8 * mean(losses[:10]), losses
    assert " step  loss" in out and "    1  " in out and "   30  " in out
    assert "from_pretrained + restore: outputs identical, alphas identical" in out and "all finite" in out

    # the decay is on, in both streams, and recorded where diffusers' save_pretrained keeps it
    model = run["model"].eval()
    alphas = [a for _, pair in resdecay.alphas_of(model) for a in pair]
    assert len(alphas) == 6 and alphas[0] == 1.0 and alphas[-1] == pytest.approx(0.6)
    folder = run["folder"]
    step = json.loads((folder / "config.json").read_text())["resdecay"]["steps"][0]
    assert step == {"op": "decayify", "on": "SD3Transformer2DModel", "alpha_min": 0.6, "schedule": "linear",
                    "branches": "both", "context_stream": "decay"}
    summary = json.loads(run["summary"].read_text())
    assert summary["decayify"]["context_stream"] == "decay" and summary["reloaded_outputs_identical"] is True
    assert summary["loss_last_10"] < summary["loss_first_10"] and summary["samples"]["finite"] is True

    # the test's own reload, as a user does it: diffusers' from_pretrained, then restore
    reloaded = restore_like_a_user(folder)
    assert resdecay.alphas_of(reloaded) == resdecay.alphas_of(model)
    assert reloaded.transformer_blocks[0].resdecay_options == {"context_stream": "decay"}
    x, t, y = run["latents"][:8], torch.arange(8) * 120.0 + 1, run["labels"][:8]
    text, pooled = run["text"][y], run["pooled"][y]
    with torch.no_grad():
        want = model(x, encoder_hidden_states=text, pooled_projections=pooled, timestep=t).sample
        assert torch.equal(reloaded(x, encoder_hidden_states=text, pooled_projections=pooled, timestep=t).sample, want)
        plain = SD3Transformer2DModel.from_pretrained(folder).eval()  # without restore: the weights, no decay
        assert not torch.allclose(plain(x, encoder_hidden_states=text, pooled_projections=pooled, timestep=t).sample,
                                  want, atol=1e-4)


def restore_like_a_user(folder):
    from diffusers import SD3Transformer2DModel

    from resdecay.interop import restore
    return restore(SD3Transformer2DModel.from_pretrained(folder)).eval()


@pytest.mark.parametrize("args, says", [
    (["--steps", "3"], "--steps must be at least"),
    (["--context-stream", "sideways"], "invalid choice: 'sideways'"),
    (["--out", "FILE"], "is a file; give a folder"),
])
def test_bad_arguments_are_one_line_and_exit_2(args, says, tmp_path):
    (tmp_path / "FILE").write_text("x")
    args = [str(tmp_path / "FILE") if a == "FILE" else a for a in args]
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1 and says in proc.stderr, proc.stderr


def test_the_guide_shows_the_command():
    text = (ROOT / "docs" / "plug-and-play.md").read_text()
    section = text[text.index("## Training in the library's own loop"):]
    assert "python docs/examples/diffusers_sd3.py --steps" in section
