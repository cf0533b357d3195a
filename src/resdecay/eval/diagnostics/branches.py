"""Branch and shortcut per sub-block: what each add ``alpha * x + g`` mixes.

Per sub-block, over every token of every image (prefix tokens included, as the per-layer profile's
``block_statistics``): the mean per-token norm of the scaled shortcut ``||alpha * x||`` and of the
branch ``||g||`` (``g = beta * f(x)``, gated where adaLN-Zero gates it), their ratio (of the two
means, the profile's ``shortcut / branch`` column), and the mean cosine between ``alpha * x`` and
``g``. A ratio far above 1 means the add passes the stream on almost unchanged; a negative cosine that
the branch removes part of what the shortcut carries. A token whose branch is exactly zero (a
zero-initialised branch) has cosine 0 by convention, and such a sub-block's ratio is None.
"""

from __future__ import annotations

import torch

from ...stream.sites import Site

EPS = 1e-12


class BranchStats:
    """Running sums of per-token norms and cosines, one row per sub-block.

    Args:
        sites: the stream's blocks (their alphas scale the shortcut).
    """

    def __init__(self, sites: list[Site]):
        self.sites = sites
        self.names = [sub.name for site in sites for sub in site.subs]
        self.row = {(i, j): k for k, (i, j) in enumerate(
            (i, j) for i, site in enumerate(sites) for j in range(len(site.subs)))}
        self.sums = torch.zeros(len(self.names), 3, dtype=torch.float64)  # ||alpha x||, ||g||, cos
        self.tokens = torch.zeros(len(self.names), dtype=torch.float64)

    def __call__(self, i: int, j: int, x: torch.Tensor, g: torch.Tensor) -> None:
        """One add's input x and branch g, (B, T, D) each (the record hooks' ``on_pair``)."""
        alpha = self.sites[i].subs[j].alpha
        nx, ng = x.norm(dim=-1), g.norm(dim=-1)  # (B, T)
        dot = torch.bmm(x.reshape(-1, 1, x.shape[-1]), g.reshape(-1, g.shape[-1], 1)).view(nx.shape)  # no (B, T, D) temporary
        sign = 1.0 if alpha >= 0 else -1.0
        cos = torch.where((nx > 0) & (ng > 0), sign * dot / (nx * ng).clamp_min(EPS), torch.zeros_like(dot))
        k = self.row[(i, j)]
        self.sums[k, 0] += abs(alpha) * float(nx.double().sum())
        self.sums[k, 1] += float(ng.double().sum())
        self.sums[k, 2] += float(cos.double().sum())
        self.tokens[k] += nx.numel()

    def summary(self) -> dict:
        """Per sub-block lists: ``shortcut_norm``, ``branch_norm``, ``ratio`` (shortcut / branch; None
        for a branch that is exactly zero), ``cosine``, and the ``alpha`` of each add."""
        mean = self.sums / self.tokens.clamp_min(1).unsqueeze(1)
        ratio = [float(s / b) if b > 0 else None for s, b in mean[:, :2].tolist()]
        return {"sub_block": self.names, "alpha": [sub.alpha for site in self.sites for sub in site.subs],
                "shortcut_norm": mean[:, 0].tolist(), "branch_norm": mean[:, 1].tolist(), "ratio": ratio,
                "cosine": mean[:, 2].tolist()}
