"""docs/plug-and-play.md, "Training in the library's own loop" (c): a diffusers ``SD3Transformer2DModel`` (the
MM-DiT of Stable Diffusion 3) with decayed identity shortcuts (``resdecay.decayify``) in both of its streams,
trained on diffusers' flow-matching objective (``FlowMatchEulerDiscreteScheduler``: x_t = (1 - sigma) * x0 +
sigma * noise, the model predicts noise - x0, as diffusers' SD3 training scripts do) and sampled with the
scheduler's own ``step`` loop.

The smallest sizes, on scikit-learn's embedded digits (nothing is downloaded): each 8x8 digit is upsampled to
16x16 and folded into a latent-like (4, 8, 8) stack by ``pixel_unshuffle``; the "text" of a digit is its class's
random embedding (4 tokens, fixed by the seed; its pooled projection too). The MM-DiT has 3 joint blocks (the
last one ``context_pre_only``), 2 heads of 16 dims, 2x2 patches. ``decayify(model, alpha_min=0.6,
zero_init=True, context_stream=...)`` replaces each ``JointTransformerBlock``'s forward (its adaLN-Zero gates
multiply the branches inline) and zeroes every branch's last layer, the paper's init: alpha falls from 1 at the
first image-stream add to 0.6 at the last, and the context stream's adds of a block take its alphas
(``--context-stream plain`` keeps them at 1). No parameter is added: the optimizer and ``save_pretrained`` see
the library's own model, and diffusers' ``from_pretrained`` followed by ``resdecay.interop.restore`` (which reads
the decay the model's config recorded) gives the trained model back.

    python docs/examples/diffusers_sd3.py --steps 120 --out runs/diffusers-sd3 --seed 0

prints a (step, loss) table, the mean loss of the first and last 10 steps, the reload check, and writes
OUT/summary.json (the decay, the alphas, the losses, the samples' statistics, the reload check) and OUT/model/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from diffusers_dit import _OneLineParser, digit_latents  # noqa: E402  (the DiT example's arguments rule and data)

ALPHA_MIN = 0.6  # the factor of the last residual add (3 blocks x 2 image adds: 1, 0.92, 0.84, 0.76, 0.68, 0.6)
TRAIN_TIMESTEPS = 1000
TEXT_TOKENS, TEXT_DIM, POOLED_DIM = 4, 16, 16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _OneLineParser(prog="diffusers_sd3.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=120, help="optimizer steps (at least 20)")
    p.add_argument("--out", default="runs/diffusers-sd3", help="output folder (summary.json, model/)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights, text embeddings, batches and noise")
    p.add_argument("--lr", type=float, default=2e-3, help="AdamW learning rate (constant after a short warmup)")
    p.add_argument("--batch-size", type=int, default=64, help="examples per step")
    p.add_argument("--sample-steps", type=int, default=10, help="flow-matching Euler steps of the sampling loop")
    p.add_argument("--context-stream", choices=("decay", "plain"), default="decay",
                   help="the context (text) stream's adds: the alphas of the image adds of their block, or 1")
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
    if Path(a.out).exists() and not Path(a.out).is_dir():
        p.error(f"--out {a.out} is a file; give a folder")
    return a


def class_text(seed: int):
    """One random "prompt" per digit class: (10, TEXT_TOKENS, TEXT_DIM) token embeddings and (10, POOLED_DIM)
    pooled embeddings, fixed by the seed (the part a text encoder plays in SD3)."""
    import torch

    g = torch.Generator().manual_seed(seed + 7)
    return torch.randn(10, TEXT_TOKENS, TEXT_DIM, generator=g), torch.randn(10, POOLED_DIM, generator=g)


def build_model(seed: int, alpha_min: float = ALPHA_MIN, context_stream: str = "decay"):
    """The smallest SD3 MM-DiT for (4, 8, 8) inputs, decayified with the paper's zero init."""
    import torch
    from diffusers import SD3Transformer2DModel

    import resdecay

    torch.manual_seed(seed)
    model = SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_layers=3, attention_head_dim=16,
                                  num_attention_heads=2, joint_attention_dim=TEXT_DIM, caption_projection_dim=32,
                                  pooled_projection_dim=POOLED_DIM, out_channels=4, pos_embed_max_size=8)
    return resdecay.decayify(model, alpha_min=alpha_min, zero_init=True, context_stream=context_stream)


def reload(folder: str | Path):
    """diffusers' own from_pretrained, then one resdecay call re-applying the decay the config recorded."""
    from diffusers import SD3Transformer2DModel

    from resdecay.interop import restore

    return restore(SD3Transformer2DModel.from_pretrained(folder)).eval()


def predict(model, x, t, labels, text, pooled):
    """The model's velocity (noise - x0) for the classes' "prompts"."""
    return model(x, encoder_hidden_states=text[labels], pooled_projections=pooled[labels], timestep=t).sample


def sample(model, labels, text, pooled, steps: int, generator):
    """The scheduler's own loop: x_1 ~ N(0, I), then ``FlowMatchEulerDiscreteScheduler.step`` with the velocity."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=TRAIN_TIMESTEPS)
    scheduler.set_timesteps(steps)
    x = torch.randn(len(labels), 4, 8, 8, generator=generator)
    with torch.no_grad():
        for t in scheduler.timesteps:
            x = scheduler.step(predict(model, x, t.expand(len(labels)), labels, text, pooled), t, x).prev_sample
    return x


def train(model, latents, labels, text, pooled, args) -> list[tuple[int, float]]:
    """Flow matching as diffusers' SD3 scripts (weighting scheme "none"): uniform timesteps of the scheduler,
    x_t = (1 - sigma) * x0 + sigma * noise, MSE of the prediction to noise - x0."""
    import torch
    import torch.nn.functional as F
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=TRAIN_TIMESTEPS)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    warmup = max(1, args.steps // 20)
    lr_at = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    g = torch.Generator().manual_seed(args.seed)
    every, losses = max(1, args.steps // 10), []
    model.train()
    for step in range(1, args.steps + 1):
        idx = torch.randint(0, len(latents), (args.batch_size,), generator=g)
        x0, y = latents[idx], labels[idx]
        noise = torch.randn(x0.shape, generator=g)
        u = torch.randint(0, TRAIN_TIMESTEPS, (len(x0),), generator=g)
        t, sigma = scheduler.timesteps[u], scheduler.sigmas[u].view(-1, 1, 1, 1)
        x_t = (1.0 - sigma) * x0 + sigma * noise
        loss = F.mse_loss(predict(model, x_t, t, y, text, pooled), noise - x0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lr_at.step()
        losses.append((step, loss.item()))
        if step == 1 or step % every == 0 or step == args.steps:
            print(f"{step:>5d}  {loss.item():.4f}", flush=True)
    return losses


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    import json

    import torch

    import resdecay

    torch.set_num_threads(min(2, torch.get_num_threads()))
    latents, labels = digit_latents()
    text, pooled = class_text(args.seed)
    model = build_model(args.seed, context_stream=args.context_stream)
    alphas = [a for _, pair in resdecay.alphas_of(model) for a in pair]
    print(f"SD3Transformer2DModel, decayify alpha_min {ALPHA_MIN} zero_init, context_stream {args.context_stream}: "
          f"image-stream alphas {' '.join(f'{a:.2f}' for a in alphas)}; {sum(p.numel() for p in model.parameters())} "
          f"parameters; {len(latents)} digits as (4, 8, 8) stacks, one random 4-token prompt per class")
    print(" step  loss")
    losses = train(model, latents, labels, text, pooled, args)

    model.eval()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out / "model")  # diffusers' own format; config.json keeps the decay under "resdecay"
    reloaded = reload(out / "model")
    x, t, y = latents[:16], torch.linspace(1, 999, 16), labels[:16]
    with torch.no_grad():
        same_outputs = torch.equal(predict(reloaded, x, t, y, text, pooled), predict(model, x, t, y, text, pooled))
    same_alphas = resdecay.alphas_of(reloaded) == resdecay.alphas_of(model)
    classes = torch.arange(10)
    samples = sample(model, classes, text, pooled, args.sample_steps, torch.Generator().manual_seed(args.seed + 1))
    first = sum(v for _, v in losses[:10]) / 10
    last = sum(v for _, v in losses[-10:]) / 10
    print(f"loss: first 10 steps {first:.4f}, last 10 steps {last:.4f}")
    print(f"saved {out / 'model'}; SD3Transformer2DModel.from_pretrained + restore: outputs "
          f"{'identical' if same_outputs else 'DIFFERENT'}, alphas {'identical' if same_alphas else 'DIFFERENT'}")
    finite = bool(torch.isfinite(samples).all())
    summary = {"model": "SD3Transformer2DModel", "decayify": model.resdecay_spec, "alphas": alphas,
               "steps": args.steps, "loss_first_10": first, "loss_last_10": last, "losses": [v for _, v in losses],
               "reloaded_outputs_identical": same_outputs, "reloaded_alphas_identical": same_alphas,
               "samples": {"steps": args.sample_steps, "finite": finite, "mean": float(samples.mean()),
                           "std": float(samples.std())},
               "data": {"mean": float(latents.mean()), "std": float(latents.std())}}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"samples: {tuple(samples.shape)} in {args.sample_steps} Euler steps, "
          f"{'all finite' if finite else 'NOT FINITE'}, mean {samples.mean():.2f} std {samples.std():.2f} "
          f"(data: {latents.mean():.2f}, {latents.std():.2f}); summary {out / 'summary.json'}")
    return {"losses": losses, "model": model, "reloaded": reloaded, "same_outputs": same_outputs,
            "same_alphas": same_alphas, "samples": samples, "latents": latents, "labels": labels, "text": text,
            "pooled": pooled, "folder": out / "model", "summary": out / "summary.json"}


if __name__ == "__main__":
    r = main()
    sys.exit(0 if r["same_outputs"] and r["same_alphas"] and bool(r["samples"].isfinite().all()) else 1)
