"""The one way a fixed number N of a split's images is chosen: a seeded, class-balanced subset.

Every "use N images" setting goes through ``balanced_indices``: ``data.train_subset`` (training),
``train.online_eval_size`` (the online kNN bank, probe set and queries) and ``--max-train`` /
``--max-test`` of ``resdecay eval`` / ``eval-diffusion`` (a grid's ``max_train``). Why not the first
N: an ImageFolder lists its files class by class, so on a 10-class folder the first 2,000 training
images were 1,971 of one class and 29 of another (a kNN of 0.50 that measured nothing), and
``data.train_subset=6000`` trained on 3 classes.

The draw: each class's indices are shuffled by a generator seeded with ``seed`` (``data.subset_seed``,
0 by default, recorded in the run config), then classes take turns (class 0's first, class 1's
first, ..., class 0's second, ...) until N are chosen, so every class gets N / C images (a class
with fewer gives its share to the others). The indices are returned sorted, so the same N images
are read in file order every time, whatever reads them.
"""

from __future__ import annotations

import numpy as np
import torch

SUBSET_SEED = 0  # the default data.subset_seed


def balanced_indices(labels, n: int, seed: int = SUBSET_SEED) -> np.ndarray:
    """Sorted indices of ``n`` items, as even over the classes as their sizes allow.

    Args:
        labels: the class of every item of the split (a sequence, array or tensor of ints).
        n: how many to choose; all of them (``arange``) when ``n`` >= their number.
        seed: the draw's seed (the same seed, labels and n give the same indices).
    """
    labels = np.asarray(labels.cpu() if isinstance(labels, torch.Tensor) else labels).reshape(-1)
    if n >= len(labels):
        return np.arange(len(labels))
    rng = np.random.default_rng(seed)  # not seeded by n: a larger subset holds every image of a smaller one
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)]
    # position k of every class's shuffled list, class by class: a turn-by-turn deal, cut at n
    rank = np.concatenate([np.arange(len(p)) for p in pools])
    order = np.lexsort((np.concatenate([np.full(len(p), c) for c, p in enumerate(pools)]), rank))
    return np.sort(np.concatenate(pools)[order[:n]])


def label_map_order(present, seed: int = SUBSET_SEED) -> np.ndarray:
    """The order in which a seeded class-balanced draw takes label maps: the first N of it are the draw of N.

    A label map shows several classes, so ``balanced_indices``' deal is made over the classes it shows: the maps
    are shuffled by a generator seeded with ``seed``; then classes take turns, the rarest (shown by the fewest
    maps) first, each taking the next map in the shuffle that shows it and is not taken yet; maps that show no
    class (all pixels ignored) come last. So a class shown by few maps is in the draw from its first turns, and
    a larger draw holds every map of a smaller one.

    Args:
        present: per label map, the classes it shows (an array of ints each).
        seed: the draw's seed.
    """
    shuffled = np.random.default_rng(seed).permutation(len(present))
    lists: dict[int, list[int]] = {}
    for i in shuffled:
        for c in np.unique(np.asarray(present[i])):
            lists.setdefault(int(c), []).append(int(i))
    turns = sorted(lists, key=lambda c: (len(lists[c]), c))
    taken, cursor, order = np.zeros(len(present), dtype=bool), dict.fromkeys(turns, 0), []
    moved = True
    while moved:
        moved = False
        for c in turns:
            items, k = lists[c], cursor[c]
            while k < len(items) and taken[items[k]]:
                k += 1
            if k < len(items):
                taken[items[k]], moved = True, True
                order.append(items[k])
                k += 1
            cursor[c] = k
    order += [int(i) for i in shuffled if not taken[i]]
    return np.asarray(order, dtype=np.int64)


def dataset_labels(dataset) -> np.ndarray:
    """Every item's label, read without decoding an image where the dataset keeps them
    (ImageFolder ``targets``, in-memory ``labels``, through ``Subset`` and ``.dataset`` wrappers);
    otherwise by reading each item once.

    Args:
        dataset: a map-style dataset of (image, label) items.
    """
    if isinstance(dataset, torch.utils.data.Subset):
        return dataset_labels(dataset.dataset)[np.asarray(dataset.indices)]
    for attr in ("targets", "labels"):
        found = getattr(dataset, attr, None)
        if found is not None and len(found) == len(dataset):
            return np.asarray(found.cpu() if isinstance(found, torch.Tensor) else found)
    inner = getattr(dataset, "dataset", None)  # SkipBadFiles and similar wrappers keep the length
    if inner is not None and inner is not dataset and len(inner) == len(dataset):
        return dataset_labels(inner)
    return np.asarray([int(dataset[i][1]) for i in range(len(dataset))])


def balanced_subset(dataset, n: int | None, seed: int = SUBSET_SEED):
    """``dataset`` limited to ``balanced_indices`` of its labels (the whole of it for ``n`` None or
    >= its length).

    Args:
        dataset: a map-style dataset of (image, label) items.
        n: how many items, or None for all.
        seed: the draw's seed.
    """
    if not n or n >= len(dataset):
        return dataset
    return torch.utils.data.Subset(dataset, balanced_indices(dataset_labels(dataset), n, seed).tolist())


def describe_subset(n: int, total: int, split: str, seed: int = SUBSET_SEED) -> str:
    """How ``n`` of ``total`` images were chosen, for protocol cards: "all 360 test images" or
    "2000 of 60000 train images, class-balanced, seed 0"."""
    if n >= total:
        return f"all {total} {split} images"
    return f"{n} of {total} {split} images, class-balanced, seed {seed}"
