"""docs/EXTENDING.md, example (a): a new residual formula in one file.

    x <- alpha * x + (2 - alpha) * f(x)

The identity path decays as in the paper (alpha from 1 to alpha_min with depth) while the branch is
boosted by as much, so every add keeps alpha + beta = 2. Registering it makes ``model.shortcut=two_minus``
a valid setting for every family (MAE encoder, U-ViT, SiT, ResNet, decayify'd timm / torchvision models).

Run it:  resdecay --plugin docs/examples/extending/two_minus.py ablate --grid docs/examples/extending/two_minus-digits.yaml
"""
from resdecay.nn.residual import register_shortcut
from resdecay.schedule import alpha_schedule


@register_shortcut("two_minus")
def two_minus(depth: int, alpha_min: float, schedule: str, adds_per_block: int):
    alphas = alpha_schedule(depth, alpha_min, schedule, adds_per_block=adds_per_block)  # (depth, adds), 1 -> alpha_min
    return alphas, 2.0 - alphas  # (alphas, betas): the add is alpha * x + beta * f(x)
