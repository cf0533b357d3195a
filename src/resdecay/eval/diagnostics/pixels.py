"""Pixel detail at depth: how much of each patch's own pixels is linearly decodable
from that patch's token at each layer, the paper's "shallow, high-frequency detail" as one number per
layer.

Samples are (image, patch) pairs: the token of a patch (prefix tokens such as cls dropped) is the
input, that patch's pixels the output. Two targets:

* ``pixels``: the patch normalised by its own mean and variance, ``(p - mean) / sqrt(var + 1e-6)``
  over its ph*pw*C values (unbiased variance): the MAE target with ``norm_pix_loss`` (paper-notes §2).
* ``high_freq``: the image minus a Gaussian-blurred copy (sigma = patch side / 4 pixels by default,
  reflect padding), patchified and divided by the same per-patch scale: the detail finer than a
  quarter patch, the part of the normalised target a blurry copy would not give.

Regression: ridge with an intercept, closed form in float64, fitted on the train images' tokens and
scored on the test images' tokens: ``W = (Xc^T Xc + lambda I)^-1 Xc^T Yc`` with X, Y centred on
their train means (scikit-learn's ``Ridge(alpha=lambda, fit_intercept=True)``). lambda is fixed, not
tuned: ``ridge * trace(Xc^T Xc) / D``, i.e. ``ridge`` (default 1e-3) times the summed variance of one
average feature, so it scales with the layer's feature norm and the number of tokens; the lambda used
is reported per layer. Score: R^2 ``variance_weighted`` as scikit-learn's ``r2_score`` (1 - total
squared error / total variance of the test targets about their own mean, over all output columns),
so that pixels with little variance weigh little. Everything is computed from sums over tokens (one
Gram matrix per layer and split), so no token is kept in memory.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...errors import UserError

NORM_EPS = 1e-6  # MAE's norm_pix_loss: (x - mean) / (var + 1e-6) ** 0.5


def patchify(images: torch.Tensor, patch: tuple[int, int]) -> torch.Tensor:
    """(B, C, H, W) -> (B, N, ph*pw*C), patches row-major, pixels (p, q, c) as MAE's ``patchify``."""
    B, C, H, W = images.shape
    ph, pw = patch
    gh, gw = H // ph, W // pw
    x = images[:, :, :gh * ph, :gw * pw].reshape(B, C, gh, ph, gw, pw)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(B, gh * gw, ph * pw * C)


def gaussian_blur(images: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur of (B, C, H, W), reflect padding, radius ceil(3 sigma) (at most side - 1)."""
    B, C, H, W = images.shape
    r = min(math.ceil(3 * sigma), H - 1, W - 1)
    if sigma <= 0 or r < 1:
        return images.clone()
    t = torch.arange(-r, r + 1, dtype=torch.float64)
    k = torch.exp(-0.5 * (t / sigma) ** 2)
    k = (k / k.sum()).to(images.dtype).to(images.device)
    x = F.pad(images, (r, r, r, r), mode="reflect")
    x = F.conv2d(x, k.view(1, 1, 1, -1).expand(C, 1, 1, -1), groups=C)  # along width
    return F.conv2d(x, k.view(1, 1, -1, 1).expand(C, 1, -1, 1), groups=C)  # along height


def pixel_targets(images: torch.Tensor, patch: tuple[int, int], sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(normalised pixels, their high-frequency part), each (B, N, ph*pw*C); see the module docstring."""
    raw = patchify(images, patch)
    mean, var = raw.mean(-1, keepdim=True), raw.var(-1, keepdim=True)
    scale = (var + NORM_EPS).sqrt()
    high = patchify(images - gaussian_blur(images, sigma), patch)
    return (raw - mean) / scale, high / scale


class RidgeStats:
    """Sums over samples (float64) from which a ridge fit and its R^2 follow in closed form.

    Args:
        dim: input width D.
        outputs: output columns P.
        layers: a leading axis on the input sums (several layers' tokens against the same outputs), or None.
    """

    def __init__(self, dim: int, outputs: int, layers: int | None = None):
        f = dict(dtype=torch.float64)
        lead = () if layers is None else (layers,)
        self.n = 0
        self.sx, self.sy = torch.zeros(*lead, dim, **f), torch.zeros(outputs, **f)
        self.sxx, self.sxy = torch.zeros(*lead, dim, dim, **f), torch.zeros(*lead, dim, outputs, **f)
        self.syy = torch.zeros(outputs, **f)  # per column sum of squares

    def layer(self, k: int) -> RidgeStats:
        """The sums of layer ``k`` of stacked sums, as a single-layer ``RidgeStats``."""
        one = RidgeStats(self.sx.shape[-1], self.sy.shape[-1])
        one.n, one.sx, one.sy, one.sxx, one.sxy, one.syy = self.n, self.sx[k], self.sy, self.sxx[k], self.sxy[k], self.syy
        return one

    def add(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """x (n, D), y (n, P)."""
        x, y = x.double(), y.double()
        self.n += len(x)
        self.sx += x.sum(0).cpu()
        self.sy += y.sum(0).cpu()
        self.sxx += (x.T @ x).cpu()
        self.sxy += (x.T @ y).cpu()
        self.syy += y.pow(2).sum(0).cpu()

    def centred(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(mean x, mean y, Xc^T Xc, Xc^T Yc)."""
        mx, my = self.sx / self.n, self.sy / self.n
        return mx, my, self.sxx - self.n * torch.outer(mx, mx), self.sxy - self.n * torch.outer(mx, my)


def default_lambda(train: RidgeStats, ridge: float) -> float:
    """``ridge * trace(Xc^T Xc) / D``: the ridge penalty relative to one average feature's summed variance."""
    _, _, cxx, _ = train.centred()
    return float(ridge * cxx.trace() / cxx.shape[0])


def ridge_fit(train: RidgeStats, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(W (D, P), b (P)) minimising ||Y - X W - b||^2 + lam ||W||^2 (scikit-learn's Ridge, fit_intercept=True)."""
    mx, my, cxx, cxy = train.centred()
    A = cxx + lam * torch.eye(len(cxx), dtype=torch.float64)
    W = torch.linalg.solve(A, cxy)
    return W, my - mx @ W


def r2_variance_weighted(test: RidgeStats, W: torch.Tensor, b: torch.Tensor, cols: slice = slice(None)) -> float:
    """R^2 of ``X W + b`` on the test sums, scikit-learn's ``r2_score(..., multioutput="variance_weighted")``,
    over the output columns ``cols``: 1 - sum_j SSE_j / sum_j SST_j, SST about the test targets' own means."""
    W, b = W[:, cols], b[cols]
    sxy, sy, syy = test.sxy[:, cols], test.sy[cols], test.syy[cols]
    # sum ||y - xW - b||^2 expanded into the sums: y.y - 2 y.(xW + b) + ||xW + b||^2
    sse = (syy.sum() - 2 * (W * sxy).sum() - 2 * (b * sy).sum() + ((test.sxx @ W) * W).sum()
           + 2 * (b * (test.sx @ W)).sum() + test.n * b.pow(2).sum())
    sst = (syy - sy.pow(2) / test.n).sum()
    return float(1.0 - sse / sst) if sst > 0 else float("nan")


def ridge_r2(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor,
             lam: float | None = None, ridge: float = 1e-3) -> tuple[float, float]:
    """(R^2 variance-weighted on the test set, lambda) of a ridge fitted on the train set, from tensors.

    Args:
        train_x, test_x: inputs (n, D).
        train_y, test_y: outputs (n, P).
        lam: the penalty; default ``default_lambda(train, ridge)``.
        ridge: the relative penalty used when ``lam`` is None.
    """
    train, test = RidgeStats(train_x.shape[1], train_y.shape[1]), RidgeStats(test_x.shape[1], test_y.shape[1])
    train.add(train_x, train_y)
    test.add(test_x, test_y)
    lam = default_lambda(train, ridge) if lam is None else float(lam)
    W, b = ridge_fit(train, lam)
    return r2_variance_weighted(test, W, b), lam


def layer_patch(shape: tuple, grid: tuple[int, int] | None, image: tuple[int, int], patch: tuple[int, int] | None,
                strict: bool) -> tuple[tuple[int, int], int] | None:
    """(patch size in pixels, prefix tokens) of one layer's tokens (B, T, D) on ``image`` (H, W) pixels, or None.

    A feature map's grid gives its patch exactly (side / rows); token sequences take the model's ``patch`` (the
    tokens beyond its patches are a prefix: cls, registers) or, where fewer tokens than its patches remain (a
    stage that merged them: LeViT), the square patch that tiles the image into exactly T tokens.

    Raises:
        UserError: ``strict`` (a patch size the caller gave) and fewer tokens than its patches.
    """
    (H, W), T = image, shape[1]
    if grid is not None:
        return ((H // grid[0], W // grid[1]), 0) if H % grid[0] == 0 and W % grid[1] == 0 else None
    if patch is not None:
        N = (H // patch[0]) * (W // patch[1])
        if T >= N:
            return patch, T - N
        if strict:
            raise UserError(f"diagnostics: {N} patches of {patch[0]}x{patch[1]} pixels but only {T} tokens in the "
                            "stream; pass the model's patch_size")
    side = math.isqrt(H * W // T) if T else 0
    return ((side, side), 0) if side and H % side == 0 and W % side == 0 and (H // side) * (W // side) == T else None


class PixelStats:
    """Per layer (x0, then every block output) and split, the ridge sums of tokens -> (pixels, high_freq); the
    layers of one patch size and width stacked, so that one batched product per batch serves them all.

    Args:
        patches: per layer, (its patch size in pixels, its prefix tokens) (``layer_patch``), or None for a layer
            whose tokens map to no patches.
        sigma: the low-pass blur's sigma in pixels (None: each patch size's side / 4).
        per_image: patches sampled per image (None: all), the same positions for a given seed and batch order.
        seed: the sampling seed.
    """

    def __init__(self, patches: list, sigma: float | None, per_image: int | None = None, seed: int = 0):
        self.layers, self.patches, self.per_image = len(patches), patches, per_image
        self.sigmas = {p: (sigma if sigma is not None else min(p) / 4) for p in {q for q, _ in filter(None, patches)}}
        self.groups: dict[tuple, list[int]] = {}  # (patch, width) -> its layers, filled by the first batch
        self.gen = torch.Generator().manual_seed(seed)
        self.sums: dict[tuple, dict[str, RidgeStats]] = {}  # group -> split -> sums with a leading layer axis
        self.P: dict[tuple, int] = {}
        self.used = 0

    def update(self, split: str, tokens: list[torch.Tensor], images: torch.Tensor) -> None:
        """Add one batch: ``tokens`` per layer (B, T, D), the prefix first, then the patches in image order."""
        if not self.groups:
            for k, (t, pp) in enumerate(zip(tokens, self.patches, strict=True)):
                if pp is not None:
                    self.groups.setdefault((pp[0], t.shape[-1]), []).append(k)
        for (patch, width), layers in self.groups.items():
            self._update_group((patch, width), split, [tokens[k] for k in layers], [self.patches[k][1] for k in layers],
                               images)

    def _update_group(self, key: tuple, split: str, tokens: list[torch.Tensor], prefixes: list[int],
                      images: torch.Tensor) -> None:
        patch = key[0]
        pix, high = pixel_targets(images, patch, self.sigmas[patch])
        y = torch.cat([pix, high], dim=-1)  # (B, N, 2P): one solve serves both targets
        B, N, _ = y.shape
        self.P[key], self.used = pix.shape[-1], N if self.per_image is None else min(self.per_image, N)
        patches = [t[:, pre:pre + N] for t, pre in zip(tokens, prefixes, strict=True)]  # (B, N, D): prefix dropped
        if self.per_image is not None and self.per_image < N:
            idx = torch.rand(B, N, generator=self.gen).argsort(1)[:, :self.per_image].to(y.device)  # (B, k)
            y = torch.gather(y, 1, idx.unsqueeze(-1).expand(-1, -1, y.shape[-1]))
            patches = [torch.gather(t, 1, idx.unsqueeze(-1).expand(-1, -1, t.shape[-1])) for t in patches]
        x = torch.stack(patches)  # (layers, B, k, D)
        X, Y = x.reshape(len(x), -1, x.shape[-1]).double(), y.reshape(-1, y.shape[-1]).double()  # (layers, n, D), (n, 2P)
        s = self.sums.setdefault(key, {}).get(split)
        if s is None:
            s = self.sums[key][split] = RidgeStats(X.shape[-1], Y.shape[-1], layers=len(X))
        s.n += Y.shape[0]
        s.sx += X.sum(1).cpu()
        s.sy += Y.sum(0).cpu()
        s.sxx += torch.bmm(X.mT, X).cpu()
        s.sxy += (X.transpose(0, 1).reshape(Y.shape[0], -1).T @ Y).view(s.sxy.shape).cpu()  # one GEMM, all layers
        s.syy += Y.pow(2).sum(0).cpu()

    def summary(self, ridge: float) -> dict:
        """Per layer: R^2 of the normalised pixels and of their high-frequency part, and the lambda used (None for
        a layer whose tokens map to no patches)."""
        if not self.sums or any(not {"train", "test"} <= set(by) for by in self.sums.values()):
            raise UserError("diagnostics: the pixel ridge needs train and test images (give train_images, or at "
                            "least two images)")
        first = next(iter(self.sums.values()))
        out: dict = {"layer": list(range(self.layers)), "r2_pixels": [None] * self.layers,
                     "r2_high_freq": [None] * self.layers, "lambda": [None] * self.layers,
                     "train_tokens": first["train"].n, "test_tokens": first["test"].n, "patches_per_image": self.used,
                     "r2": "variance_weighted", "ridge": ridge}
        for key, layers in self.groups.items():
            train, test, P = self.sums[key]["train"], self.sums[key]["test"], self.P[key]
            for row, layer in enumerate(layers):
                tr, te = train.layer(row), test.layer(row)
                lam = default_lambda(tr, ridge)
                W, b = ridge_fit(tr, lam)
                out["r2_pixels"][layer] = r2_variance_weighted(te, W, b, slice(0, P))
                out["r2_high_freq"][layer] = r2_variance_weighted(te, W, b, slice(P, None))
                out["lambda"][layer] = lam
        sizes = sorted({p for p, _ in filter(None, self.patches)})
        out["sigma"] = self.sigmas[sizes[0]] if len(sizes) == 1 else {f"{p[0]}x{p[1]}": self.sigmas[p] for p in sizes}
        out["patch"] = list(sizes[0]) if len(sizes) == 1 else [list(pp[0]) if pp else None for pp in self.patches]
        return out
