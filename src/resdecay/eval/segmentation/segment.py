"""Unsupervised semantic segmentation of frozen token features (paper §4.3: "4.10 vs 10.41 mIoU"):
graph, solvers, dataset-level K-Means, matching and scores. Pure math on tensors; the evaluator that
extracts tokens and reads label maps is ``source.py``.

The protocol is the post-processing of Zhang et al. (CVPR 2024) that the paper names, re-implemented
from the description in ``shared/segmentation-protocol.md`` (no code of theirs was copied):

1. graph: cosine kNN over the tokens of a 40-image batch, 50 neighbours in the same image and 50 in
   the other images, weights <= 0.1 dropped, symmetrised W <- (W + W^T) / 2, P = D^-1 W;
2. embedding (``solver``):
   ``exact``   the top eigenvectors of P by ``scipy.sparse.linalg.eigsh`` (deterministic; the laptop
               variant). One graph over all images: the union of the batch graphs of ``graph_rounds``
               seeded shuffles into 40-image batches, so images of different batches are linked (the
               authors link them by re-shuffling batches every epoch);
   ``learned`` the authors' learned soft embedding: a free (C, h, w) table per image, softmax over C,
               loss mean|x_c^T P x_c - 1| + mean_{c != c'} (x_c^T x_c')^2 on column-normalised X,
               AdamW 1e-2, 5 steps per batch graph, EMA 0.99 of the tables (what is read out);
   ``kmeans``  no graph: K-Means on the L2-normalised tokens themselves (the plain baseline);
3. the top K dimensions: for ``learned`` the top K columns of U*S of an uncentred SVD of the stacked
   soft maps (the authors' read-out), for ``exact`` the top K eigenvectors (already orthonormal);
4. one dataset-level K-Means (n_init 10, seeded) into K clusters, nearest-upsampled to the labels;
5. matching clusters to classes on the dataset-wide cluster x class pixel counts: Hungarian
   (one-to-one, ``linear_sum_assignment``; the headline) and majority vote (many-to-one);
6. mIoU from one dataset-wide confusion matrix, ignore label 255 excluded, averaged over all classes
   (a class with an empty union counts as 0, the authors' choice), pixel accuracy and the per-class IoU
   beside it. (A label map's own ignore value, ``ignore_index``, becomes 255 where it is read, and a class
   that no scored label map shows is taken out there, ``seg_folders.without_absent_classes``: it would add
   an IoU of 0 and take one of the K clusters. So every class of the evaluation has pixels, and the mean is
   over the classes present.)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Annotated

import numpy as np
import torch
import torch.nn.functional as F

from ...errors import UserError
from ...io import progress_bar
from ..options import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, POSITIVE, SEED, Limit

if TYPE_CHECKING:
    import scipy.sparse as sp

IGNORE = 255  # COCO-Stuff's "unlabelled" and VOC's boundary label: never counted
SOLVERS = ("exact", "learned", "kmeans")


@dataclass(frozen=True)
class SegProtocol:
    """Every constant of the segmentation protocol, in one place (it travels into the protocol card). Each
    number's range (``Annotated[..., Limit]``) is checked where it is set (``--seg-*``, ``--metric-option``)."""

    solver: str = "exact"
    k: Annotated[int, Limit(least=2)] | None = None  # clusters; None: the number of classes (the authors' K = K_gt)
    layer_tokens: str = "patch tokens of the block output, cls dropped, no masking"
    batch_images: Annotated[int, AT_LEAST_ONE] = 40  # images per graph
    intra: Annotated[int, AT_LEAST_ONE] = 50  # neighbours in the same image (scaled down when an image has fewer tokens)
    inter: Annotated[int, NON_NEGATIVE] = 50  # neighbours in the other images of the batch
    min_weight: Annotated[float, Limit(least=-1, most=1)] = 0.1  # cosine weights <= this are dropped
    dims: Annotated[int, AT_LEAST_ONE] = 100  # eigenvectors (exact) / table channels C (learned)
    graph_rounds: Annotated[int, AT_LEAST_ONE] = 10  # exact: union of this many seeded batchings
    lr: Annotated[float, POSITIVE] = 1e-2  # learned: AdamW, weight decay 0
    steps_per_batch: Annotated[int, AT_LEAST_ONE] = 5
    ema: Annotated[float, FRACTION] = 0.99
    epochs: Annotated[int, AT_LEAST_ONE] = 200  # learned: passes over the images, re-shuffled each time
    n_init: Annotated[int, AT_LEAST_ONE] = 10  # K-Means restarts (sklearn < 1.4's default, pinned)
    seed: Annotated[int, SEED] = 0
    images: Annotated[int, AT_LEAST_ONE] = 100  # evaluation images (the authors' loader returns 100)
    ignore_index: Annotated[int, Limit(least=0, most=65535)] = IGNORE  # unlabelled pixels' value in your label maps
    # where the label maps come from (the card names them itself: data set, folder, images drawn)
    data: str | None = None  # a seg_masks.SEG_DATA name, or NAME:DIR (default: the evaluation's data set)
    path: str | None = None  # the cocostuff27 / voc / folder folder

    def validate(self) -> None:
        if self.solver not in SOLVERS:
            raise UserError(f"--seg-solver {self.solver!r} is unknown; choose one of {', '.join(SOLVERS)}")
        if self.k is not None and self.k < 2:
            raise UserError(f"--seg-k must be at least 2 clusters, got {self.k}")
        if self.images < 1:
            raise UserError(f"--seg-images must be a positive number of images, got {self.images}")

    def card(self) -> dict:
        c = asdict(self)
        for key in ("data", "path"):  # the test card says which images were read
            c.pop(key)
        if self.solver != "learned":
            for key in ("lr", "steps_per_batch", "ema", "epochs"):
                c.pop(key)
        if self.solver == "kmeans":
            for key in ("batch_images", "intra", "inter", "min_weight", "dims", "graph_rounds"):
                c.pop(key)
        if self.solver != "exact":
            c.pop("graph_rounds", None)
        return c


def neighbour_counts(tokens_per_image: int, batch: int, p: SegProtocol) -> tuple[int, int]:
    """(intra, inter) neighbour counts, scaled down where an image or a batch has fewer tokens."""
    return min(p.intra, tokens_per_image - 1), min(p.inter, (batch - 1) * tokens_per_image)


# ----------------------------------------------------------------------------- graph
def batch_graph(x: torch.Tensor, p: SegProtocol) -> sp.csr_matrix:
    """The symmetric sparse cosine kNN graph W over the tokens of one batch.

    Args:
        x: (B, T, D) tokens of B images; p: the protocol (neighbour counts, weight floor).
    """
    import scipy.sparse as sp  # loaded when a graph is built, not with the command line

    b, t, _ = x.shape
    z = F.normalize(x.reshape(b * t, -1).float(), dim=1)
    sim = z @ z.T
    image = torch.arange(b).repeat_interleave(t)
    same = image[:, None] == image[None, :]
    sim.fill_diagonal_(-1e5)  # never one's own neighbour
    k_in, k_out = neighbour_counts(t, b, p)
    rows, cols, vals = [], [], []
    for mask, k in ((same, k_in), (~same, k_out)):
        if k < 1:
            continue
        v, j = sim.masked_fill(~mask, -1e5).topk(k, dim=1)
        rows.append(torch.arange(b * t).repeat_interleave(k))
        cols.append(j.reshape(-1))
        vals.append(v.reshape(-1))
    r, c, v = torch.cat(rows), torch.cat(cols), torch.cat(vals)
    keep = v > p.min_weight  # the protocol drops weak (and negative) similarities
    w = sp.coo_matrix((v[keep].numpy(), (r[keep].numpy(), c[keep].numpy())), shape=(b * t, b * t)).tocsr()
    return ((w + w.T) * 0.5).tocsr()


def batchings(n: int, p: SegProtocol, rounds: int, seed: int):
    """``rounds`` seeded shuffles of n images into batches of ``p.batch_images`` (the last may be smaller)."""
    g = np.random.default_rng(seed)
    for _ in range(rounds):
        order = g.permutation(n)
        yield [order[i:i + p.batch_images] for i in range(0, n, p.batch_images)]


def dataset_graph(x: torch.Tensor, p: SegProtocol, progress: bool = False) -> sp.csr_matrix:
    """One graph over all tokens of all images (node i*T + t): the union (elementwise max) of the
    batch graphs of ``p.graph_rounds`` seeded batchings, so batches are linked to each other."""
    import scipy.sparse as sp  # loaded when a graph is built, not with the command line

    n, t, _ = x.shape
    total, rounds = None, p.graph_rounds if n > p.batch_images else 1
    for split in progress_bar(batchings(n, p, rounds, p.seed), total=rounds, desc="kNN graph (rounds)",
                              disable=not progress, leave=False):
        for idx in split:
            nodes = (idx[:, None] * t + np.arange(t)[None]).reshape(-1)
            w = batch_graph(x[torch.from_numpy(idx)], p).tocoo()
            g = sp.coo_matrix((w.data, (nodes[w.row], nodes[w.col])), shape=(n * t, n * t)).tocsr()
            total = g if total is None else total.maximum(g)
    return total


def random_walk(w: sp.csr_matrix) -> sp.csr_matrix:
    """P = D^-1 W, the epsilon inside the reciprocal (an isolated node gives a zero row, not inf)."""
    import scipy.sparse as sp  # loaded when a graph is built, not with the command line

    deg = np.asarray(w.sum(1)).ravel()
    return (sp.diags(1.0 / (deg + 1e-12)) @ w).tocsr()


# ----------------------------------------------------------------------------- solvers
def _fix_signs(u: np.ndarray) -> np.ndarray:
    """Each vector's largest-magnitude entry made positive, so runs and tests are reproducible."""
    idx = np.abs(u).argmax(0)
    return u * np.where(u[idx, np.arange(u.shape[1])] < 0, -1.0, 1.0)


def exact_eigenvectors(w: sp.csr_matrix, dims: int, dense_below: int = 300) -> tuple[np.ndarray, np.ndarray]:
    """The top ``dims`` eigenvectors of P = D^-1 W, as u = D^-1/2 v with v the top eigenvectors of
    the symmetric S = D^-1/2 W D^-1/2 (same eigenvalues). Returns (eigenvalues descending, (n, dims)).

    Args:
        w: symmetric non-negative affinity; dims: how many; dense_below: graphs with fewer nodes use
            ``numpy.linalg.eigh`` (eigsh needs dims < n and is slower there).
    """
    import scipy.sparse as sp  # loaded when a graph is built, not with the command line

    n = w.shape[0]
    dims = min(dims, n - 1)
    d = np.asarray(w.sum(1)).ravel()
    inv_sqrt = 1.0 / np.sqrt(d + 1e-12)
    s = sp.diags(inv_sqrt) @ w @ sp.diags(inv_sqrt)
    if n < dense_below:
        vals, vecs = np.linalg.eigh(s.toarray())
        vals, vecs = vals[::-1][:dims], vecs[:, ::-1][:, :dims]
    else:
        from scipy.sparse.linalg import eigsh

        v0 = np.full(n, 1.0 / np.sqrt(n))  # a fixed start vector: eigsh's default is random
        vals, vecs = eigsh(s.tocsr(), k=dims, which="LA", v0=v0, tol=1e-8)
        order = np.argsort(-vals)
        vals, vecs = vals[order], vecs[:, order]
    u = inv_sqrt[:, None] * vecs
    return vals, _fix_signs(u / np.maximum(np.linalg.norm(u, axis=0, keepdims=True), 1e-12))


DENSE_NODES = 4096  # batch graphs up to this many nodes are multiplied densely (faster on a CPU)


def _torch_matrix(p: sp.csr_matrix) -> torch.Tensor:
    if p.shape[0] <= DENSE_NODES:
        return torch.from_numpy(p.toarray()).float()
    c = p.tocoo()
    idx = torch.from_numpy(np.vstack([c.row, c.col]).astype(np.int64))
    return torch.sparse_coo_tensor(idx, torch.from_numpy(c.data).float(), c.shape, check_invariants=False).coalesce()


def learned_loss(z: torch.Tensor, p_rw: torch.Tensor) -> torch.Tensor:
    """The learned-eigenvector loss on one graph: z (n, C) soft embedding (softmax over C), p_rw the
    random-walk matrix. Columns are L2-normalised over nodes; their Rayleigh quotients are pushed
    to 1 (the top of P) and their pairwise inner products to 0."""
    xh = F.normalize(z, dim=0)
    lam = ((p_rw @ xh) * xh).sum(0)
    gram = xh.T @ xh
    off = gram - torch.diag(torch.diag(gram))
    c = z.shape[1]
    return (lam - 1).abs().mean() + off.pow(2).sum() / max(c * (c - 1), 1)


def learned_embedding(x: torch.Tensor, grid: tuple[int, int], p: SegProtocol, progress: bool = False) -> torch.Tensor:
    """The authors' learned per-image soft embedding (EMA tables, softmaxed): (N*T, C).

    Args:
        x: (N, T, D) tokens, T = h*w in raster order; grid: (h, w); p: the protocol; progress: a bar.
    """
    n, t, _ = x.shape
    gen = torch.Generator().manual_seed(p.seed)
    c = min(p.dims, n * t)
    tables = torch.randn(n, c, *grid, generator=gen).requires_grad_(True)  # one free table per image, no network
    ema = tables.detach().clone()
    opt = torch.optim.AdamW([tables], lr=p.lr, weight_decay=0.0)
    epochs = list(batchings(n, p, p.epochs, p.seed))
    for split in progress_bar(epochs, desc="learned embedding (epochs)", disable=not progress, leave=False):
        for idx in split:
            if len(split) > 1 and len(idx) < p.batch_images:  # drop_last, as the authors' loader
                continue
            ti = torch.from_numpy(idx)
            p_rw = _torch_matrix(random_walk(batch_graph(x[ti], p)))
            for _ in range(p.steps_per_batch):
                z = tables[ti].softmax(1).permute(0, 2, 3, 1).reshape(-1, c)
                loss = learned_loss(z, p_rw)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            with torch.no_grad():
                ema.mul_(p.ema).add_(tables.detach(), alpha=1 - p.ema)
    return ema.softmax(1).permute(0, 2, 3, 1).reshape(n * t, c)


def uncentred_top(z: np.ndarray, k: int) -> np.ndarray:
    """U*S of an uncentred SVD of the stacked embedding, top k columns (the authors' reduction)."""
    u, s, _ = np.linalg.svd(z, full_matrices=False)
    return u[:, :k] * s[:k]


def embed(x: torch.Tensor, grid: tuple[int, int], p: SegProtocol, progress: bool = False) -> np.ndarray:
    """(N*T, d) per-token embedding of the chosen solver (before the SVD to K)."""
    if p.solver == "kmeans":
        return F.normalize(x.reshape(-1, x.shape[-1]).double(), dim=1).numpy()
    if p.solver == "exact":
        return exact_eigenvectors(dataset_graph(x, p, progress), p.dims)[1]
    return learned_embedding(x, grid, p, progress).double().numpy()


def cluster(z: np.ndarray, k: int, p: SegProtocol) -> np.ndarray:
    """One dataset-level K-Means (n_init pinned, seeded) over every token; the kmeans solver clusters
    the features themselves, the spectral solvers the top-K columns of U*S."""
    from sklearn.cluster import KMeans

    if p.solver == "kmeans":
        data = z
    elif p.solver == "exact":  # orthonormal eigenvectors: an SVD would only rotate them, so take the top k by eigenvalue
        data = z[:, :k]
    else:  # the learned soft maps are not orthogonal: the authors re-orthogonalise with an uncentred SVD
        data = uncentred_top(z, k)
    return KMeans(n_clusters=k, n_init=p.n_init, random_state=p.seed).fit_predict(data.astype(np.float64))


def upsample(ids: np.ndarray, n: int, grid: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
    """Cluster ids per token -> (N, H, W) label maps by nearest upsampling."""
    t = torch.from_numpy(ids.reshape(n, 1, *grid).astype(np.float32))
    return F.interpolate(t, size=size, mode="nearest")[:, 0].long()


# ----------------------------------------------------------------------------- matching and scores
def cluster_class_counts(pred: torch.Tensor, labels: torch.Tensor, k: int, classes: int) -> np.ndarray:
    """(k, classes) pixel counts of cluster x class over the whole set, the ignore label excluded."""
    valid = labels != IGNORE
    idx = pred[valid].long() * classes + labels[valid].long()
    return torch.bincount(idx, minlength=k * classes).reshape(k, classes).numpy()


def hungarian(counts: np.ndarray) -> np.ndarray:
    """cluster -> class, one-to-one, maximising matched pixels; an unmatched cluster gets -1."""
    from scipy.optimize import linear_sum_assignment

    rows, cols = linear_sum_assignment(counts, maximize=True)
    out = np.full(counts.shape[0], -1)
    out[rows] = cols
    return out


def majority(counts: np.ndarray) -> np.ndarray:
    """cluster -> its most frequent class (many-to-one)."""
    return counts.argmax(1)


def confusion(pred: torch.Tensor, labels: torch.Tensor, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(classes, classes) true x predicted over valid pixels; a prediction of -1 (an unmatched
    cluster) is a miss of its true class and a false positive of none."""
    valid = labels != IGNORE
    y, q = labels[valid].long(), pred[valid].long()
    hit = q >= 0
    conf = torch.bincount(y[hit] * classes + q[hit], minlength=classes * classes).reshape(classes, classes).numpy()
    missed = torch.bincount(y[~hit], minlength=classes).numpy()
    return conf, missed


def scores(pred: torch.Tensor, labels: torch.Tensor, classes: int) -> dict:
    """mIoU over all classes (empty union -> 0), mIoU over present classes (STEGO's), pixel accuracy."""
    conf, missed = confusion(pred, labels, classes)
    tp = np.diag(conf).astype(np.float64)
    fn = conf.sum(1) - tp + missed
    fp = conf.sum(0) - tp
    union = tp + fp + fn
    iou = np.where(union > 0, tp / np.maximum(union, 1), 0.0)
    total = conf.sum() + missed.sum()
    return {"miou": float(iou.mean()), "miou_present": float(iou[union > 0].mean()) if (union > 0).any() else 0.0,
            "pixel_acc": float(tp.sum() / max(total, 1)), "iou": iou.tolist()}


def matched_scores(clusters: torch.Tensor, labels: torch.Tensor, k: int, classes: int) -> dict:
    """Hungarian (headline) and majority-vote scores of (N, H, W) cluster maps against label maps."""
    counts = cluster_class_counts(clusters, labels, k, classes)
    out = {}
    for name, mapping in (("hungarian", hungarian(counts)), ("majority", majority(counts))):
        pred = torch.from_numpy(mapping)[clusters]
        s = scores(pred, labels, classes)
        out[name] = {**s, "mapping": mapping.tolist()}
    return out


def segment(x: torch.Tensor, grid: tuple[int, int], labels: torch.Tensor, classes: int, p: SegProtocol,
            progress: bool = False, names=None) -> dict:
    """The whole protocol on (N, T, D) tokens and (N, H, W) label maps.

    Returns ``{"values": {miou, pixel_acc, miou_majority, ..., iou: {class: IoU}}, "clusters": (N, H, W),
    "embedding": (N*T, d)}``; ``iou`` is the Hungarian per-class IoU, keyed by ``names`` (the class indices
    as text where no names are given).
    """
    k = p.k or classes
    z = embed(x, grid, p, progress)
    ids = cluster(z, k, p)
    maps = upsample(ids, len(x), grid, tuple(labels.shape[-2:]))
    m = matched_scores(maps, labels, k, classes)
    h, v = m["hungarian"], m["majority"]
    keys = list(names) if names is not None and len(names) == classes else [str(c) for c in range(classes)]
    values = {"miou": h["miou"], "pixel_acc": h["pixel_acc"], "miou_present": h["miou_present"],
              "miou_majority": v["miou"], "pixel_acc_majority": v["pixel_acc"],
              "iou": dict(zip(keys, h["iou"], strict=True))}
    return {"values": values, "clusters": maps, "mapping": np.array(h["mapping"]), "embedding": z, "k": k}
