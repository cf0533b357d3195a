"""Fashion-MNIST-M: Fashion-MNIST garments composited onto photographic backgrounds.

A nuisance-rich second benchmark, after MNIST-M (Ganin & Lempitsky, 2015), built in memory from
what every machine has: Fashion-MNIST's own train/test garments (so the splits share no garment)
and scikit-learn's two embedded sample photographs (``load_sample_images``: a temple and a flower)
as backgrounds. Nothing is downloaded.

Why it exists: on clean Fashion-MNIST the pixels already carry the class (a plain MAE reaches kNN
≈ 0.88), whereas on ImageNet most pixel detail is nuisance (a plain ViT-B MAE's kNN is 27 %). The
paper's argument is that the identity path "echoes" such detail into deep layers; this data set
makes pixel detail mostly nuisance while keeping ten well-defined classes, so the argument can be
tested on a CPU.

Each image (``canvas`` × ``canvas`` RGB) is drawn from its own generator seeded by
(seed, split, index), so the same index always gives the same image, whatever else is built.
The nuisances, each switchable (``data.nuisances``):

    background  a crop of one of the two photographs at a random scale (crop side 1/2 to 1/8 of
                the photograph's short side), random position, random horizontal flip and a random
                permutation of its RGB channels; off: a black background
    colour      the garment is painted in a random RGB colour (each channel 64..255); off: white
    scale       the garment is resized to a random side in [canvas/2, canvas·7/8]; off: 3/4·canvas
    position    the garment is placed at a random position on the canvas; off: centred

The garment's grey level is used as its opacity, so its texture survives the colouring.

``data.composition=textures`` is a second generator, drawn differently on purpose (a rule read off one generator
need not transfer): milder nuisances of other kinds, the same four switches.

    background  a procedural texture instead of a photograph: a mid-tone colour, two sinusoidal gratings of random
                orientation, frequency (1 to 5 cycles per canvas), phase and colour, and smooth blotches (4 x 4
                noise upsampled); contrast about +-60 grey levels; off: black
    colour      a pastel colour (each channel 128..255); off: white
    scale       a side in [canvas·5/8, canvas] (larger garments); off: 3/4·canvas
    position    a jitter of the centre by at most a quarter of the free margin; off: centred
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

NUISANCES = ("background", "colour", "scale", "position")
SPLIT_IDS = {"train": 0, "test": 1}
MIN_CANVAS, MAX_CANVAS = 16, 128
MASK_OPACITY = 0.5  # a pixel is the garment's where the garment covers at least half of it
_CROP_FRACTIONS = (1 / 2, 1 / 3, 1 / 4, 1 / 5, 1 / 6, 1 / 8)  # background crop side / photograph's short side


def _photo_pyramid(canvas: int) -> list[list[torch.Tensor]]:
    """For each photograph, one float copy per crop scale, resized so that a canvas-sized window
    of it is a crop of that fraction of the photograph: a crop then is plain slicing."""
    from sklearn.datasets import load_sample_images

    photos = [torch.from_numpy(np.array(im)).permute(2, 0, 1).float() for im in load_sample_images().images]
    pyramid = []
    for p in photos:
        short = min(p.shape[-2:])
        levels = []
        for frac in _CROP_FRACTIONS:
            factor = canvas / (frac * short)  # the crop of side frac*short becomes canvas pixels
            size = (max(canvas, round(p.shape[-2] * factor)), max(canvas, round(p.shape[-1] * factor)))
            levels.append(F.interpolate(p[None], size=size, mode="area" if factor < 1 else "bilinear",
                                        align_corners=None if factor < 1 else False)[0])
        pyramid.append(levels)
    return pyramid


def _draw(rng: np.random.Generator, canvas: int, on: frozenset) -> dict:
    """The random choices for one image (always drawn in the same order, so switching one
    nuisance off never changes the draws of the others)."""
    lo, hi = canvas // 2, (canvas * 7) // 8
    d = {"photo": int(rng.integers(2)), "level": int(rng.integers(len(_CROP_FRACTIONS))), "u": rng.random(2),
         "flip": bool(rng.integers(2)), "perm": rng.permutation(3), "colour": rng.integers(64, 256, 3),
         "size": int(rng.integers(lo, hi + 1)), "pos": rng.random(2)}
    return _switched_off(d, canvas, on)


def _switched_off(d: dict, canvas: int, on: frozenset) -> dict:
    """A draw with each nuisance that is off at its fixed value: 3/4 of the canvas, white, centred."""
    if "scale" not in on:
        d["size"] = (canvas * 3) // 4
    if "colour" not in on:
        d["colour"] = np.array([255, 255, 255])
    if "position" not in on:
        d["pos"] = np.array([0.5, 0.5])
    return d


def _draw_textured(rng: np.random.Generator, canvas: int, on: frozenset) -> dict:
    """``_draw`` of ``composition=textures``: the texture's parameters, a pastel colour, larger garments, a jitter."""
    lo = (canvas * 5) // 8
    d = {"base": rng.uniform(60, 190, 3), "waves": [(rng.uniform(0, np.pi), rng.uniform(1, 5), rng.uniform(0, 2 * np.pi),
                                                     rng.uniform(-30, 30, 3)) for _ in range(2)],
         "blotches": rng.normal(0, 15, (3, 4, 4)), "colour": rng.integers(128, 256, 3),
         "size": int(rng.integers(lo, canvas + 1)), "pos": 0.5 + rng.uniform(-0.25, 0.25, 2)}
    return _switched_off(d, canvas, on)


def _texture(d: dict, canvas: int) -> torch.Tensor:
    """The (3, canvas, canvas) float background of one ``_draw_textured`` draw, in grey levels 0..255."""
    yy, xx = np.mgrid[0:canvas, 0:canvas] / canvas
    img = np.broadcast_to(d["base"][:, None, None], (3, canvas, canvas)).copy()
    for theta, freq, phase, colour in d["waves"]:
        img += colour[:, None, None] * np.sin(2 * np.pi * freq * (xx * np.cos(theta) + yy * np.sin(theta)) + phase)
    blotches = F.interpolate(torch.from_numpy(d["blotches"])[None], size=(canvas, canvas), mode="bicubic", align_corners=False)
    return (torch.from_numpy(img) + blotches[0]).clamp_(0, 255).float()


def composite(garments: torch.Tensor, split: str, canvas: int = 32, nuisances=NUISANCES, seed: int = 0,
              offset: int = 0, indices=None, labels: torch.Tensor | None = None, composition: str = "photos"):
    """Composite garments (N, 1, 28, 28) uint8 into (N, 3, canvas, canvas) uint8 images.

    Args:
        garments: Fashion-MNIST images of one split, uint8.
        split: "train" or "test" (part of every image's seed).
        canvas: output side in pixels.
        nuisances: which of ``NUISANCES`` are on.
        seed: data-set seed; image i uses a generator seeded by (seed, split, offset + i).
        offset: index of ``garments[0]`` in its split (so a slice gives the same images as the whole).
        indices: instead of ``offset``, the index in its split of every garment (a subset such as
            ``data.train_subset``'s gives the same images as the whole).
        labels: the garments' classes; given, also return (N, canvas, canvas) uint8 label maps:
            0 background, class + 1 where the garment was pasted with opacity >= ``MASK_OPACITY``
            (the segmentation evaluation's ground truth, 11 classes).
        composition: "photos" (the sample photographs) or "textures" (the second generator, module docstring).
    """
    on, textured = frozenset(nuisances), composition == "textures"
    pyramid = _photo_pyramid(canvas) if "background" in on and not textured else None
    n = len(garments)
    out = torch.zeros(n, 3, canvas, canvas)
    where = range(offset, offset + n) if indices is None else [int(i) for i in indices]
    draw = _draw_textured if textured else _draw
    draws = [draw(np.random.default_rng([seed, SPLIT_IDS[split], i]), canvas, on) for i in where]
    alpha = garments.float().div(255.0)
    masks = torch.zeros(n, canvas, canvas, dtype=torch.uint8) if labels is not None else None
    for i, d in enumerate(draws):
        if textured and "background" in on:
            out[i] = _texture(d, canvas)
        elif pyramid is not None:
            img = pyramid[d["photo"]][d["level"]]
            y = int(d["u"][0] * (img.shape[-2] - canvas + 1))
            x = int(d["u"][1] * (img.shape[-1] - canvas + 1))
            bg = img[:, y:y + canvas, x:x + canvas]
            if d["flip"]:
                bg = bg.flip(-1)
            out[i] = bg[torch.from_numpy(d["perm"])]
    # Garments, grouped by size so each group is resized in one call.
    sizes = np.array([d["size"] for d in draws])
    for s in np.unique(sizes):
        idx = np.nonzero(sizes == s)[0]
        a = F.interpolate(alpha[idx], size=(int(s), int(s)), mode="bilinear", align_corners=False, antialias=True)
        a = a.clamp_(0, 1)
        for j, i in enumerate(idx):
            d = draws[i]
            y = int(round(d["pos"][0] * (canvas - s)))
            x = int(round(d["pos"][1] * (canvas - s)))
            colour = torch.as_tensor(d["colour"], dtype=torch.float32).view(3, 1, 1)
            region = out[i, :, y:y + s, x:x + s]
            out[i, :, y:y + s, x:x + s] = region * (1 - a[j]) + colour * a[j]
            if masks is not None:  # the generator knows where it pasted the garment: that is the label map
                masks[i, y:y + s, x:x + s][a[j, 0] >= MASK_OPACITY] = int(labels[i]) + 1
    images = out.round_().clamp_(0, 255).to(torch.uint8)
    return images if masks is None else (images, masks)


def validate_knobs(canvas: int, nuisances) -> str | None:
    """The problem with these knob values, or None."""
    if not isinstance(canvas, int) or isinstance(canvas, bool) or not MIN_CANVAS <= canvas <= MAX_CANVAS:
        return f"data.canvas must be an integer from {MIN_CANVAS} to {MAX_CANVAS} (pixels), got {canvas!r}"
    bad = [x for x in nuisances if x not in NUISANCES]
    if bad:
        return f"data.nuisances: {bad[0]!r} is unknown; choose any of {', '.join(NUISANCES)} (e.g. data.nuisances=[background,colour])"
    if len(set(nuisances)) != len(nuisances):
        return f"data.nuisances lists a nuisance twice: {list(nuisances)}"
    return None
