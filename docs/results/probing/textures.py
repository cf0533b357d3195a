"""Issue 50 item 7: Fashion-MNIST-M's two generators side by side (textures.png): the same ten training garments
composited by the photographs generator and by the procedural-textures one (``data.composition=textures``), with all
four nuisances, with the background alone, and clean (where the two are the same image).

    .venv/bin/python docs/results/probing/textures.py [--fmnist DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from resdecay.data.datasets import _load_fashion_mnist
from resdecay.data.fashion_mnist_m import NUISANCES
from resdecay.data.seg_masks import FASHION_NAMES
from resdecay.viz.plots import plot_nuisance_samples

HERE = Path(__file__).resolve().parent
ROWS = {"photographs, all four": (NUISANCES, "photos"), "textures, all four": (NUISANCES, "textures"),
        "textures, background only": (("background",), "textures"), "clean (both generators)": ((), "textures")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fmnist", default=None, help="Fashion-MNIST's IDX folder (default: the Debian package's)")
    p.add_argument("--out", type=Path, default=HERE / "textures.png")
    a = p.parse_args()
    garments, labels = _load_fashion_mnist(a.fmnist, True)
    names = [FASHION_NAMES[int(y)] for y in labels[:10]]
    print(plot_nuisance_samples(garments[:10], names, {k: v[0] for k, v in ROWS.items()}, a.out,
                                compositions={k: v[1] for k, v in ROWS.items()},
                                title="Fashion-MNIST-M: photographs (data.composition=photos) vs procedural textures"))


if __name__ == "__main__":
    main()
