"""Frozen patch tokens on disk, for the probes that read tokens rather than one pooled vector.

A ``TokenStore`` is one ``.npy`` file of shape (N, T, D) (float16 by default: the protocol card says which), written
batch by batch as the encoder runs and read back through a memory map. When N x T x D fits the memory budget
(``ep.token_budget_mb``, any probing metric's) the tokens are read into memory once; otherwise they are streamed: training visits
chunks of ``budget / bytes per image`` images in a seeded random order, shuffled within each chunk (the reads stay
near each other on disk), and each batch is read image by image, so no more than a batch is ever held (an ImageNet train split's 1.28 M x 196 x 768 fp16 tokens are 385 GB). The file is written
under a temporary name and renamed when complete; a store whose key matches is reused.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from ...errors import UserError
from ...io import atomic_write_text

DTYPES = {"float16": np.float16, "float32": np.float32}


@dataclass
class TokenStore:
    """N images' tokens (N, T, D) in ``path``; ``data`` holds them in memory when they fit the budget.

    Args:
        path: the .npy file; budget_bytes: the most token bytes held in memory at once.
    """

    path: Path | None
    budget_bytes: int
    data: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.path is None:  # tokens handed over in memory (the Python API's ``attentive_probe``): no file
            self._map = self.data.numpy()
            return
        self._map = np.load(self.path, mmap_mode="r")
        if self.data is None and self.nbytes <= self.budget_bytes:
            self.data = torch.from_numpy(np.array(self._map))  # a copy: the map is read-only

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self._map.shape)

    @property
    def nbytes(self) -> int:
        return int(self._map.nbytes)

    @property
    def chunk(self) -> int:
        """Images per streamed chunk (all of them in memory)."""
        return len(self) if self.data is not None else max(1, self.budget_bytes // (self.nbytes // len(self)))

    @property
    def access(self) -> str:
        """How the tokens are read, for the protocol card."""
        if self.data is not None:
            return "in memory"
        return f"streamed from disk in chunks of {self.chunk} images ({self.budget_bytes / 2**20:.0f} MB budget)"

    def __len__(self) -> int:
        return self.shape[0]

    def rows(self, index: torch.Tensor | np.ndarray) -> torch.Tensor:
        """The tokens of the images ``index`` as float32 (B, T, D)."""
        index = np.asarray(index)
        if self.data is not None:
            return self.data[torch.as_tensor(index)].float()
        row = int(np.prod(self.shape[1:])) * self._map.itemsize
        out = np.empty((len(index), *self.shape[1:]), dtype=self._map.dtype)
        with open(self.path, "rb") as f:  # one read per image, not the memory map: only this batch is ever resident
            for j, i in enumerate(index.tolist()):
                out[j] = np.frombuffer(os.pread(f.fileno(), row, self._map.offset + i * row),
                                       dtype=self._map.dtype).reshape(self.shape[1:])
        return torch.from_numpy(out).float()

    def batches(self, index: np.ndarray, batch_size: int, generator: torch.Generator | None) -> Iterator[np.ndarray]:
        """Batches of the images ``index``: shuffled with ``generator`` (None: in order); streamed, the shuffle
        is within chunks of ``chunk`` consecutive images, the chunks themselves in random order."""
        index = np.asarray(index)
        if generator is None:
            order = [index]
        elif self.data is not None:
            order = [index[torch.randperm(len(index), generator=generator).numpy()]]
        else:
            chunks = [index[i:i + self.chunk] for i in range(0, len(index), self.chunk)]
            order = [chunks[int(c)][torch.randperm(len(chunks[int(c)]), generator=generator).numpy()]
                     for c in torch.randperm(len(chunks), generator=generator)]
        for part in order:
            for i in range(0, len(part), batch_size):
                yield part[i:i + batch_size]


class TokenWriter:
    """Writes an (N, T, D) token file batch by batch; ``close()`` renames it into place and returns the store.

    Args:
        path: where the store goes; n: images; dtype: "float16" or "float32"; key: what the tokens are
            (checkpoint, data, split, layer: written beside them and compared when the store is reused).
    """

    def __init__(self, path: Path, n: int, dtype: str, key: dict, budget_bytes: int):
        self.path, self.n, self.dtype, self.key, self.budget = Path(path), n, dtype, key, budget_bytes
        self.tmp, self.map, self.filled = self.path.with_suffix(".tmp.npy"), None, 0

    def add(self, tokens: torch.Tensor) -> None:
        if self.map is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.map = np.lib.format.open_memmap(self.tmp, mode="w+", dtype=DTYPES[self.dtype],
                                                 shape=(self.n, *tokens.shape[1:]))
        self.map[self.filled:self.filled + len(tokens)] = tokens.detach().float().cpu().numpy()
        self.filled += len(tokens)

    def close(self) -> TokenStore:
        if self.map is None or self.filled != self.n:
            raise RuntimeError(f"{self.filled} of {self.n} images' tokens were written")
        self.map.flush()
        del self.map
        self.tmp.replace(self.path)
        atomic_write_text(key_file(self.path), json.dumps(self.key, sort_keys=True))
        return TokenStore(self.path, self.budget)


def key_file(path: Path) -> Path:
    return Path(path).with_suffix(".json")


def reuse(path: Path, key: dict, budget_bytes: int) -> TokenStore | None:
    """The store at ``path`` when it holds the tokens ``key`` names, else None (and the stale file is left to
    be overwritten)."""
    try:
        if Path(path).is_file() and json.loads(key_file(path).read_text()) == json.loads(json.dumps(key, sort_keys=True)):
            return TokenStore(Path(path), budget_bytes)
    except (OSError, ValueError):
        return None
    return None


def check_budget(budget_bytes: int, bytes_per_image: int) -> None:
    """A budget that cannot hold one image's tokens cannot stream them: one line naming the least that works."""
    if budget_bytes < bytes_per_image:
        raise UserError(f"--metric-option ep.token_budget_mb (or attentive.) {budget_bytes / 2**20:g} holds not one image's tokens "
                        f"({bytes_per_image / 2**20:.3f} MB); raise it to at least {bytes_per_image / 2**20:.3f}")
