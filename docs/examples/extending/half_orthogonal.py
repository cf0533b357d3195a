"""A residual update of one's own: remove only half of the branch's projection on the stream,
``u(x, f) = f - 0.5 * (<x, f> / (||x||^2 + eps)) x`` per token, between the plain add (0) and the orthogonal
update (1). One update, one formula naming it: ``model.shortcut=half_orthogonal`` then trains with it."""

from resdecay.nn.residual import register_shortcut
from resdecay.nn.updates import EPS, register_update


@register_update("half_orthogonal")
def half_orthogonal(x, f):
    coef = (x * f).sum(-1, keepdim=True) / ((x * x).sum(-1, keepdim=True) + EPS)  # per token, over channels
    return f - 0.5 * coef.to(x.dtype) * x


@register_shortcut("half_orthogonal", update="half_orthogonal")
def plain_factors(depth: int, alpha_min: float, schedule: str, adds_per_block: int):
    return 1.0, 1.0  # (alphas, betas): alpha * x + beta * u(x, f)
