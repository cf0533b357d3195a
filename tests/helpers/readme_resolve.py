"""How a command the pages show becomes the command the executable-docs test runs: the pages' placeholder paths
replaced by the test session's tiny artifacts, shell globs expanded, a plan's sizes appended (``resolve``). The
table of plans is ``readme_commands.py``."""

from __future__ import annotations

import glob
import re
from pathlib import Path

# The pages' placeholder paths -> artifacts built once per test session ({name}: Workspace attributes,
# {fake_*}: tests/conftest.py fixtures, {tmp}: the test's own folder). Replaced where a token is the
# path, starts with it followed by "/", or ends with "=path".
PLACEHOLDERS = {
    "runs/mae-tiny-fmnist/checkpoints/step_00007020.pt": "{mae_ckpt}",
    "runs/mae-tiny-fmnist": "{mae_run}", "runs/mae-tiny-fmnist-plain": "{mae_plain_run}",
    "RUN_A": "{mae_plain_run}", "RUN_B": "{mae_run}", "RUN_06": "{mae_plain_run}", "RUN_08": "{mae_run}",
    "RUN_10": "{mae_run_07}", "CKPT": "{mae_ckpt}", "PLAIN_CKPT": "{mae_plain_ckpt}", "DECAYED_CKPT": "{mae_ckpt}",
    "PLAIN/checkpoints/step_00007020.pt": "{mae_plain_ckpt}", "DECAYED/checkpoints/step_00007020.pt": "{mae_ckpt}",
    "runs/uvit-tiny-fmnist": "{uvit_run}", "runs/sit-tiny-fmnist": "{sit_run}", "runs/sit-tiny-fmnist-plain": "{sit_plain_run}",
    "runs/sit-xl2/checkpoints/step_00400000.pt": "{sit_latent_ckpt}",
    "/data/imagenet": "{imagefolder}", "/data/imagenet100": "{imagefolder}", "/data/in100": "{imagefolder}",
    "/data/cifar": "{fake_cifar10}", "/data/imagenet-latents": "{latents}", "/data/in100-latents": "{tmp}/latents",
    "/models/sd-vae-ft-ema": "{vae}", "samples.npz": "{cifar_samples}", "pt_inception-2015-12-05-6726825d.pth": "{inception}",
    "mae_pretrain_vit_base.pth": "{mae_pth}", "unet_mae.pth": "{unet_pth}", "vit.pth": "{timm_pth}",
    # docs/finetune.md, docs/data-at-scale.md: an ImageNet-preset run (on the ImageFolder), its shards, a datasets folder
    "runs/mae-b16": "{mae_b16_run}", "runs/mae-b16/checkpoints/step_00500000.pt": "{mae_b16_ckpt}",
    "/data/in100-shards": "{shards}", "/data/shards": "{brace_shards}", "/data/in100-hf": "{hf_folder}",
    "vit-mae-base": "{vitmae}", "./vit-mae-folder": "{vitmae}",  # a transformers ViTMAEForPreTraining folder
}


class Context(dict):
    """Template values: conftest fixtures (fake_*, through pytest's request), the test's folder (tmp), and
    the session's artifacts (any other name: an attribute of test_readme_commands.Workspace, built on first use)."""

    def __init__(self, request, ws, tmp: Path):
        super().__init__(tmp=tmp)
        self.request, self.ws = request, ws

    def __missing__(self, name: str):
        value = self.request.getfixturevalue(name) if name.startswith("fake_") else getattr(self.ws, name)
        self[name] = value
        return value


PLACEHOLDER = re.compile(r"(^|=)(" + "|".join(sorted(map(re.escape, PLACEHOLDERS), key=len, reverse=True)) + r")(?=/|$)")


def resolve(argv: list[str], plan, ctx: Context) -> list[str]:
    """The command as it runs here: placeholders -> artifacts, globs expanded as a shell would, plan.add appended.

    Args:
        argv: the command as README shows it (``split_commands``).
        plan: its entry in PLANS.
        ctx: the values of the ``{name}`` templates.
    """
    out = []
    for tok in plan.instead or argv:
        tok = PLACEHOLDER.sub(lambda m: m.group(1) + PLACEHOLDERS[m.group(2)].format_map(ctx), tok)
        out += (sorted(glob.glob(tok)) or [tok]) if "*" in tok else [tok]  # an unmatched glob stays, as in bash
    return out + [a.format_map(ctx) for a in plan.add]
