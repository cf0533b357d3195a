"""``resdecay demo``: its options checked once, before anything trains, then the MAE demo (demo.py)
or, with ``--diffusion``, the diffusion demo (demo_diffusion.py)."""

from __future__ import annotations

from ..errors import UserError
from .demo import check_demo_args, run_demo
from .demo_diffusion import run_diffusion_demo

DIFFUSION_ALPHA_MIN = 0.7  # the diffusion demo's decayed model: Table 4's best


def run_demo_command(diffusion: bool = False, data: str = "auto", out: str | None = None, epochs: int | None = None,
                     alpha_min: float | None = None, seed: int = 0, progress: bool = True, threads: int | None = None,
                     samples: int | None = None, max_images: int | None = None) -> None:
    """Check the demo's options, each refused in one line naming its flag, and run the demo.

    Args:
        diffusion: the U-ViT demo instead of the MAE one; data, epochs, seed, progress: as either demo;
        out: the output folder (default runs/demo, runs/demo_diffusion with ``diffusion``);
        alpha_min: the decayed model's (default: the demo's own); threads: the MAE demo's torch threads;
        samples, max_images: the diffusion demo's.
    """
    if epochs is not None and epochs < 1:
        raise UserError(f"--epochs must be a positive integer, got {epochs}")
    if alpha_min is None and diffusion:
        alpha_min = DIFFUSION_ALPHA_MIN
    if alpha_min is not None and not 0 < alpha_min <= 1:
        raise UserError(f"--alpha-min must lie in (0, 1], got {alpha_min}")
    if threads is not None and threads < 1:
        raise UserError(f"--threads must be a positive integer, got {threads}")
    if diffusion and threads is not None:
        raise UserError("--threads is an option of the MAE demo; with --diffusion set OMP_NUM_THREADS=N instead")
    check_demo_args(out or ("runs/demo_diffusion" if diffusion else "runs/demo"), seed)
    if diffusion:
        run_diffusion_demo(data=data, out_dir=out or "runs/demo_diffusion", epochs=epochs, alpha_min=alpha_min,
                           seed=seed, progress=progress, samples=samples, max_images=max_images)
        return
    for flag, value in (("--samples", samples), ("--max-images", max_images)):
        if value is not None:
            raise UserError(f"{flag} is an option of the diffusion demo: use it with --diffusion")
    run_demo(data=data, out_dir=out or "runs/demo", epochs=epochs, alpha_min=alpha_min, seed=seed,
             progress=progress, threads=threads)
