"""Exact path decomposition of the residual stream (issue 40 item 1).

Unrolling ``x_{l+1} = alpha_l * x_l + g_l`` (one l per sub-block, attention and MLP separately;
``g_l = beta_l * f_l(x_l)``, with the adaLN gate where there is one) gives, at the output of block L,

    stream_L = (prod_{k<=L} alpha_k) * x_0 + sum_{l<=L} (prod_{l<k<=L} alpha_k) * g_l

where x_0 is the stream entering the first block (after the patch and position embedding, with cls).
Between two blocks a model may add to the stream outside any block (SiT's long skips): that
difference, ``x_in(block i) - x_out(block i-1)``, is one more part, ``between:<block>``, carried on by
the later alphas like a branch. The first term is the *direct path*: what arrives in layer L straight
from the patch embedding, scaled down by the decay (paper eq. 3-5); the decay's claim is that this
term dominates a plain ViT's deep layers and not a decayed one's.

Per depth L and part P (coefficient included), over all tokens of all images:

* energy share ``||P||^2 / ||stream_L||^2``. Parts are not orthogonal, so these do **not** sum to 1.
* projection share ``<P, stream_L> / ||stream_L||^2``. Linear in P, so over all parts these **sum to 1**
  (exactly, up to the reconstruction error below); a part can be negative (it cancels others).
* the same two after centring every part and the stream over images (each token position and
  channel minus its mean over the images): the shares of the variance across images, which leave
  out what every image has alike (the position embedding, a constant offset).
* ``reconstruction_error``: ``||stream_L - sum of parts|| / ||stream_L||``, the parts summed in
  float64 against the stream the model computed: float round-off when the blocks, alphas and branches
  were read right (<= 1e-5 in float32, ~1e-15 in float64).

The final norm of a model (if any) is outside the stream and outside this decomposition.
Everything is accumulated as one Gram matrix of [parts, streams] per batch (sums over images and
tokens in float64), so the cost does not grow with the number of images held in memory.
"""

from __future__ import annotations

import torch

from .record import Pass
from .sites import Site

CHUNK_ELEMENTS = 1 << 23  # elements of one stacked chunk of [parts, streams]: bounds the extra memory


def part_names(sites: list[Site]) -> list[str]:
    """The parts in stream order: x0, then per block ``between:<block>`` (from the second block on) and
    its sub-blocks' branches."""
    names = ["x0"]
    for i, site in enumerate(sites):
        if i:
            names.append(f"between:{site.name}")
        names += [sub.name for sub in site.subs]
    return names


def coefficients(sites: list[Site]) -> torch.Tensor:
    """(L, parts) float64: the factor each part carries in the stream after block L (0 before it enters):
    the product of the alphas of the adds after it, up to that block."""
    c = torch.zeros(len(part_names(sites)), dtype=torch.float64)
    c[0], k, rows = 1.0, 1, []
    for i, site in enumerate(sites):
        if i:
            c[k], k = 1.0, k + 1  # a between-blocks part enters unscaled
        for sub in site.subs:
            c *= sub.alpha  # this add scales everything already in the stream ...
            c[k], k = 1.0, k + 1  # ... and adds its branch
        rows.append(c.clone())
    return torch.stack(rows)


def parts_of(rec: Pass, sites: list[Site]) -> list[torch.Tensor]:
    """The parts of one recorded pass, in ``part_names`` order, each (B, T, D)."""
    parts = [rec.inputs[0]]
    for i, site in enumerate(sites):
        if i:
            parts.append(rec.inputs[i] - rec.outputs[i - 1])  # exactly 0 where nothing acts between blocks
        parts += [rec.branches[(i, j)] for j in range(len(site.subs))]
    return parts


class PathStats:
    """Running sums for the decomposition: Gram matrices of [parts, streams] (uncentred, and about a
    reference so that centring over images loses no precision), per-part sums over images, and the
    reconstruction error of the float64 sum of parts.

    Args:
        sites: the stream's blocks (their alphas are the decomposition's).
    """

    def __init__(self, sites: list[Site]):
        self.sites, self.names, self.coef = sites, part_names(sites), coefficients(sites)
        n = len(self.names) + len(sites)
        self.gram = torch.zeros(n, n, dtype=torch.float64)
        self.shifted = torch.zeros(n, n, dtype=torch.float64)
        self.sum: torch.Tensor | None = None  # (n, T*D) float64
        self.ref: torch.Tensor | None = None  # (n, T*D): the first batch's mean, the centring's reference
        self.count = 0
        self.err = torch.zeros(len(sites), dtype=torch.float64)
        self.energy = torch.zeros(len(sites), dtype=torch.float64)

    def update(self, rec: Pass) -> None:
        """Add one batch's pass."""
        vecs = parts_of(rec, self.sites) + [rec.outputs[i] for i in range(len(self.sites))]
        B, T, D = vecs[0].shape
        n = len(vecs)
        if self.ref is None:
            self.ref = torch.stack([v.mean(0) for v in vecs]).reshape(n, T * D)
            self.sum = torch.zeros(n, T * D, dtype=torch.float64, device=vecs[0].device)
        step = max(1, CHUNK_ELEMENTS // (B * n * D))
        for t0 in range(0, T, step):
            V = torch.stack([v[:, t0:t0 + step] for v in vecs], 1).reshape(B, n, -1)  # (B, n, chunk*D)
            W = V - self.ref[:, t0 * D:(t0 + step) * D]
            self.gram += torch.bmm(V, V.mT).double().sum(0).cpu()
            self.shifted += torch.bmm(W, W.mT).double().sum(0).cpu()
            self.sum[:, t0 * D:(t0 + step) * D] += V.double().sum(0)
        self.count += B
        self._reconstruct(rec, vecs)

    def _reconstruct(self, rec: Pass, vecs: list[torch.Tensor]) -> None:
        """The sum of parts, built as the blocks build the stream but in float64, against each block output."""
        s, k = vecs[0].double(), 1
        for i, site in enumerate(self.sites):
            if i:
                s, k = s + vecs[k].double(), k + 1
            for sub in site.subs:
                s, k = sub.alpha * s + vecs[k].double(), k + 1
            out = rec.outputs[i].double()
            self.err[i] += float((out - s).pow(2).sum())
            self.energy[i] += float(out.pow(2).sum())

    def centred_gram(self) -> torch.Tensor:
        """The Gram matrix of parts and streams each centred over images: sum_i (v_i - mean)(v_i - mean)^T."""
        d = (self.sum / self.count - self.ref.double()).cpu()
        return self.shifted - self.count * (d @ d.T)

    def summary(self) -> dict:
        """Per depth (block output 1..L) lists; ``energy`` / ``projection`` rows hold one share per part
        (``parts``), 0 for parts that have not entered the stream yet."""
        P, L = len(self.names), len(self.sites)
        out: dict = {"parts": self.names, "depth": list(range(1, L + 1)),
                     "alpha_product": [float(self.coef[d, 0]) for d in range(L)],
                     "reconstruction_error": (self.err / self.energy.clamp_min(1e-300)).sqrt().tolist()}
        for gram, tag in ((self.gram, ""), (self.centred_gram(), "_centred")):
            energy, projection = [], []
            for d in range(L):
                c, s = self.coef[d], P + d
                total = gram[s, s].clamp_min(1e-300)
                energy.append((c ** 2 * gram.diagonal()[:P] / total).tolist())
                projection.append((c * gram[:P, s] / total).tolist())
            out[f"energy{tag}"], out[f"projection{tag}"] = energy, projection
            out[f"direct_energy{tag}"] = [row[0] for row in energy]
            out[f"direct_projection{tag}"] = [row[0] for row in projection]
        return out
