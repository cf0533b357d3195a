"""Exact path decomposition of the residual stream: what reaches each depth straight from the patch embedding.

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
* ``reconstruction_error``: ``||stream_L - sum of parts|| / ||stream_L||``, the parts summed (in the
  model's dtype) against the stream the model computed: float round-off when the blocks, alphas and
  branches were read right (~1e-7 in float32, ~1e-16 in float64), and far more when they were not.

The final norm of a model (if any) is outside the stream and outside this decomposition.
Everything is accumulated as one Gram matrix of [parts, streams] per batch (sums over images and
tokens in float64), so the cost does not grow with the number of images held in memory.
"""

from __future__ import annotations

import torch

from ...stream.record import Pass
from ...stream.sites import Site

CHUNK_ELEMENTS = 1 << 23  # elements of one stacked chunk of [parts, streams]: bounds the extra memory and the
#                           length of each float32 dot product


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


def parts_of(rec: Pass, sites: list[Site]) -> list[torch.Tensor | None]:
    """The parts of one recorded pass, in ``part_names`` order, each (B, T, D); a between-blocks part is
    None where block i's input *is* block i-1's output (the same tensor: nothing acts between them)."""
    parts: list[torch.Tensor | None] = [rec.inputs[0]]
    for i, site in enumerate(sites):
        if i:
            same = rec.inputs[i] is rec.outputs[i - 1]
            parts.append(None if same else rec.inputs[i] - rec.outputs[i - 1])
        parts += [rec.branches[(i, j)] for j in range(len(site.subs))]
    return parts


class PathStats:
    """Running sums for the decomposition: the Gram matrix of [parts, streams] taken about a fixed
    reference (one image of the first batch), so that neither centring over images nor the mean part
    common to all images costs precision, the per-part sums over images, and the reconstruction error.

    Each chunk of a few images is written, minus the reference, into one reused buffer and multiplied
    as one GEMM; the uncentred and the centred Gram matrices both follow from it in float64 at the end.
    (On the CPU this step is bound by memory traffic, not by the products: one pass over the parts.)

    Args:
        sites: the stream's blocks (their alphas are the decomposition's).
    """

    def __init__(self, sites: list[Site]):
        self.sites, self.names, self.coef = sites, part_names(sites), coefficients(sites)
        n = len(self.names) + len(sites)
        self.shifted = torch.zeros(n, n, dtype=torch.float64)  # sum_i (v_i - r)(v_i - r)^T
        self.sum: torch.Tensor | None = None  # (n, T*D) float64: sum_i (v_i - r)
        self.ref: torch.Tensor | None = None  # (n, T*D): r, in the parts' dtype
        self.count = 0
        self.err = torch.zeros(len(sites), dtype=torch.float64)
        self._bufs: dict[str, torch.Tensor] = {}

    def _buffer(self, name: str, numel: int, like: torch.Tensor) -> torch.Tensor:
        """A flat scratch tensor of at least ``numel`` elements, kept between batches (no fresh pages)."""
        buf = self._bufs.get(name)
        if buf is None or buf.numel() < numel or buf.dtype != like.dtype or buf.device != like.device:
            buf = self._bufs[name] = torch.empty(numel, dtype=like.dtype, device=like.device)
        return buf[:numel]

    def update(self, rec: Pass) -> None:
        """Add one batch's pass."""
        vecs = parts_of(rec, self.sites) + [rec.outputs[i] for i in range(len(self.sites))]
        live = [k for k, v in enumerate(vecs) if v is not None]  # absent parts are zero rows
        V = [vecs[k] for k in live]
        B, T, D = V[0].shape
        m, idx = len(live), torch.tensor(live)
        if self.ref is None:
            self.ref = torch.zeros(len(vecs), T * D, dtype=V[0].dtype, device=V[0].device)
            for k, v in zip(live, V, strict=True):
                self.ref[k] = v[0].reshape(-1)
            self.sum = torch.zeros(len(vecs), T * D, dtype=torch.float64, device=V[0].device)
        ix = (idx[:, None], idx[None, :])
        per = max(1, CHUNK_ELEMENTS // (m * T * D))  # images per chunk
        for b0 in range(0, B, per):
            c = min(per, B - b0)
            flat = self._buffer("chunk", m * c * T * D, V[0]).view(m, c, T * D)
            for row, k, v in zip(flat, live, V, strict=True):  # copy and shift in one pass
                torch.sub(v[b0:b0 + c].reshape(c, T * D), self.ref[k], out=row)
            g = flat.view(m, -1)  # (m, c*T*D): one GEMM sums over images and tokens at once
            self.shifted[ix] += (g @ g.T).double().cpu()
            self.sum[idx.to(self.sum.device)] += flat.sum(1).double()
        self.count += B
        self._reconstruct(rec, vecs)

    def _reconstruct(self, rec: Pass, vecs: list[torch.Tensor | None]) -> None:
        """The sum of parts, built as the blocks build the stream (in the parts' dtype), against each block output."""
        x0 = vecs[0]
        s = self._buffer("sum", x0.numel(), x0).view(x0.shape)
        tmp = self._buffer("diff", x0.numel(), x0)
        s.copy_(x0)
        k = 1
        for i, site in enumerate(self.sites):
            if i:
                if vecs[k] is not None:
                    s.add_(vecs[k])
                k += 1
            for sub in site.subs:
                torch.add(vecs[k], s, alpha=sub.alpha, out=s)  # alpha * s + g, one pass
                k += 1
            torch.sub(rec.outputs[i].reshape(-1), s.view(-1), out=tmp)
            self.err[i] += float(torch.dot(tmp, tmp))

    def grams(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(uncentred, centred over images) Gram matrices of [parts, streams], float64, from the shifted one:
        sum_i v_i v_i^T = S + w r^T + r w^T + N r r^T and sum_i (v_i - mean)(v_i - mean)^T = S - w w^T / N,
        with S = sum_i (v_i - r)(v_i - r)^T and w = sum_i (v_i - r)."""
        r, w, N = self.ref.double().cpu(), self.sum.cpu(), self.count
        cross = w @ r.T
        return self.shifted + cross + cross.T + N * (r @ r.T), self.shifted - (w @ w.T) / N

    def summary(self) -> dict:
        """Per depth (block output 1..L) lists; ``energy`` / ``projection`` rows hold one share per part
        (``parts``), 0 for parts that have not entered the stream yet."""
        P, L = len(self.names), len(self.sites)
        gram, centred = self.grams()
        out: dict = {"parts": self.names, "depth": list(range(1, L + 1)),
                     "alpha_product": [float(self.coef[d, 0]) for d in range(L)],
                     "reconstruction_error": (self.err / gram.diagonal()[P:].clamp_min(1e-300)).sqrt().tolist()}
        for g, tag in ((gram, ""), (centred, "_centred")):
            energy, projection = [], []
            for d in range(L):
                c, s = self.coef[d], P + d
                total = g[s, s].clamp_min(1e-300)
                energy.append((c ** 2 * g.diagonal()[:P] / total).tolist())
                projection.append((c * g[:P, s] / total).tolist())
            out[f"energy{tag}"], out[f"projection{tag}"] = energy, projection
            out[f"direct_energy{tag}"] = [row[0] for row in energy]
            out[f"direct_projection{tag}"] = [row[0] for row in projection]
        return out
