"""docs/plug-and-play.md, "Training in the library's own loop" (b): a diffusers ``DiTTransformer2DModel`` with
decayed identity shortcuts (``resdecay.decayify``), trained with diffusers' ``DDPMScheduler`` (epsilon
objective: ``add_noise``, MSE to the noise) and sampled with the scheduler's own ``step`` loop.

The smallest sizes, on scikit-learn's embedded digits (nothing is downloaded): each 8x8 digit is upsampled to
16x16 and folded into a latent-like (4, 8, 8) stack by ``pixel_unshuffle`` (each 2x2 pixel block becomes
4 channels; ``pixel_shuffle`` undoes it exactly for the picture), class labels are the digit labels
(``num_embeds_ada_norm=10``). The DiT has 2 layers, 2 heads of 16 dims and 2x2 patches (16 tokens; with
8-dim heads the 16-wide stream is as narrow as a patch's 16 values and the loss stalls near 0.2).
``decayify`` replaces the forward of each ``BasicTransformerBlock`` (its adaLN-Zero gate multiplies the branch
inline, so no hook can reach the add) and adds no parameter: the optimizer and ``save_pretrained`` see the
library's own model. The decay settings are written beside the weights (OUT/model/resdecay.json), and
``reload`` is diffusers' own ``from_pretrained`` plus ``decayify(model, **settings)``.

    python docs/examples/diffusers_dit.py --steps 150 --out runs/diffusers-dit --seed 0

prints a (step, loss) table, the mean loss of the first and last 10 steps, and writes OUT/samples.png: one
sample per class and row, drawn with ``--sample-steps`` DDPM steps (mean and std of the samples beside the
data's).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ALPHA_MIN = 0.6  # the factor of the last residual add (2 blocks x 2 adds: 1, 0.87, 0.73, 0.6)
TRAIN_TIMESTEPS = 1000


class _OneLineParser(argparse.ArgumentParser):
    """Bad arguments are one line on stderr and exit status 2 (no usage block)."""

    def error(self, message: str):  # noqa: D401
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _OneLineParser(prog="diffusers_dit.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=150, help="optimizer steps (at least 20)")
    p.add_argument("--out", default="runs/diffusers-dit", help="output folder (samples.png, model/)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights, batches, noise and sampling")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (constant after a short warmup)")
    p.add_argument("--batch-size", type=int, default=64, help="examples per step")
    p.add_argument("--sample-steps", type=int, default=30, help="DDPM inference steps of the sampling loop")
    p.add_argument("--rows", type=int, default=2, help="samples per class in the grid")
    a = p.parse_args(argv)
    if a.steps < 20:
        p.error(f"--steps must be at least 20 (the table compares the first and last 10 steps), got {a.steps}")
    if not 0 <= a.seed < 2**32:
        p.error(f"--seed must lie in [0, 2**32), got {a.seed}")
    if not a.lr > 0:
        p.error(f"--lr must be positive, got {a.lr}")
    if a.batch_size < 1:
        p.error(f"--batch-size must be at least 1, got {a.batch_size}")
    if not 1 <= a.sample_steps <= TRAIN_TIMESTEPS:
        p.error(f"--sample-steps must lie in [1, {TRAIN_TIMESTEPS}], got {a.sample_steps}")
    if a.rows < 1:
        p.error(f"--rows must be at least 1, got {a.rows}")
    if Path(a.out).exists() and not Path(a.out).is_dir():
        p.error(f"--out {a.out} is a file; give a folder")
    return a


def digit_latents():
    """scikit-learn's digits as (N, 4, 8, 8) latent-like stacks in [-1, 1], and their labels (N,)."""
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 8.0 - 1.0  # 0..16 -> [-1, 1]
    x = F.interpolate(x, size=(16, 16), mode="bilinear", align_corners=False)
    return F.pixel_unshuffle(x, 2), torch.tensor(d.target, dtype=torch.long)


def to_images(latents):
    """(N, 4, 8, 8) -> (N, 16, 16) grey images in [0, 1] (``pixel_shuffle``, the inverse of the stacking)."""
    import torch.nn.functional as F

    return ((F.pixel_shuffle(latents, 2)[:, 0] + 1) / 2).clamp(0, 1)


def build_model(seed: int, alpha_min: float = ALPHA_MIN):
    """The smallest class-conditional DiT for (4, 8, 8) inputs, decayified."""
    import torch
    from diffusers import DiTTransformer2DModel

    import resdecay

    torch.manual_seed(seed)
    model = DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=16, in_channels=4, num_layers=2,
                                  sample_size=8, patch_size=2, num_embeds_ada_norm=10, norm_num_groups=1)
    return resdecay.decayify(model, alpha_min=alpha_min)


def reload(folder: str | Path):
    """diffusers' own from_pretrained, then one resdecay call re-applying the decay saved beside the weights."""
    import json

    from diffusers import DiTTransformer2DModel

    import resdecay

    model = DiTTransformer2DModel.from_pretrained(folder)
    return resdecay.decayify(model, **json.loads((Path(folder) / "resdecay.json").read_text())).eval()


def sample(model, scheduler, labels, steps: int, generator):
    """The scheduler's own loop: x_T ~ N(0, I), then ``scheduler.step`` with the model's epsilon."""
    import torch

    scheduler.set_timesteps(steps)
    x = torch.randn(len(labels), 4, 8, 8, generator=generator)
    with torch.no_grad():
        for t in scheduler.timesteps:
            eps = model(x, timestep=t.expand(len(labels)), class_labels=labels).sample
            x = scheduler.step(eps, t, x, generator=generator).prev_sample
    return x


def save_grid(images, labels, rows: int, path: Path) -> None:
    """One column per class, ``rows`` samples each, as a PNG (matplotlib, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = len(images) // rows
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 0.8, rows * 0.9), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.imshow(images[i].numpy(), cmap="gray", vmin=0, vmax=1)
        ax.set_axis_off()
        if i < cols:
            ax.set_title(str(int(labels[i])), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    import json

    import torch
    import torch.nn.functional as F
    from diffusers import DDPMScheduler

    import resdecay

    torch.set_num_threads(min(2, torch.get_num_threads()))
    latents, labels = digit_latents()
    model = build_model(args.seed)
    scheduler = DDPMScheduler(num_train_timesteps=TRAIN_TIMESTEPS)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    warmup = max(1, args.steps // 20)
    lr_at = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    g = torch.Generator().manual_seed(args.seed)
    alphas = " ".join(f"{a:.2f}" for _, pair in resdecay.alphas_of(model) for a in pair)
    print(f"DiTTransformer2DModel, decayify alpha_min {ALPHA_MIN}: alphas {alphas}; "
          f"{sum(p.numel() for p in model.parameters())} parameters; {len(latents)} digits as (4, 8, 8) stacks")
    print(" step  loss")
    every, losses = max(1, args.steps // 10), []
    model.train()
    for step in range(1, args.steps + 1):
        idx = torch.randint(0, len(latents), (args.batch_size,), generator=g)
        x0, y = latents[idx], labels[idx]
        noise = torch.randn(x0.shape, generator=g)
        t = torch.randint(0, TRAIN_TIMESTEPS, (len(x0),), generator=g)
        loss = F.mse_loss(model(scheduler.add_noise(x0, noise, t), timestep=t, class_labels=y).sample, noise)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lr_at.step()
        losses.append((step, loss.item()))
        if step == 1 or step % every == 0 or step == args.steps:
            print(f"{step:>5d}  {loss.item():.4f}", flush=True)

    model.eval()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out / "model")  # diffusers' own format (config.json + safetensors) ...
    (out / "model" / "resdecay.json").write_text(json.dumps(model.resdecay_spec) + "\n")  # ... and the decay
    classes = torch.arange(10).repeat(args.rows)
    samples = sample(model, scheduler, classes, args.sample_steps, torch.Generator().manual_seed(args.seed + 1))
    png = out / "samples.png"
    save_grid(to_images(samples), classes, args.rows, png)
    first = sum(v for _, v in losses[:10]) / 10
    last = sum(v for _, v in losses[-10:]) / 10
    print(f"loss: first 10 steps {first:.4f}, last 10 steps {last:.4f}")
    print(f"samples: {tuple(samples.shape)} in {args.sample_steps} DDPM steps, "
          f"{'all finite' if bool(torch.isfinite(samples).all()) else 'NOT FINITE'}, "
          f"mean {samples.mean():.2f} std {samples.std():.2f} (data: {latents.mean():.2f}, {latents.std():.2f}); "
          f"grid {png}")
    return {"losses": losses, "model": model, "samples": samples, "classes": classes, "png": png}


if __name__ == "__main__":
    r = main()
    sys.exit(0 if bool(r["samples"].isfinite().all()) else 1)
