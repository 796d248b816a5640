"""fashion-mnist: 60,000 + 10,000 28x28 grey images from Debian's `dataset-fashion-mnist`."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import torch

from ringps.data import DATASETS, Dataset, Split
from ringps.errors import DataError

ROOT = Path("/usr/share/datasets/fashion-mnist")


def read_idx(path: Path) -> np.ndarray:
    """idx format: 2 zero bytes, a type byte (0x08 = uint8), the rank, then big-endian sizes."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] != 0x08:
        raise DataError(f"fashion-mnist: {path} is not a uint8 idx file")
    rank = raw[3]
    dims = np.frombuffer(raw[4 : 4 + 4 * rank], dtype=">u4").astype(int)
    data = np.frombuffer(raw[4 + 4 * rank :], dtype=np.uint8)
    if data.size != int(np.prod(dims)):
        raise DataError(f"fashion-mnist: {path} is truncated")
    return data.reshape(dims)


@DATASETS.register("fashion-mnist")
def fashion_mnist(cfg, root: Path = ROOT) -> Dataset:
    names = ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]
    missing = [n for n in names if not (root / n).is_file()]
    if missing:
        raise DataError(
            f"fashion-mnist: {root}/{missing[0]} is missing; install the Debian package: "
            "apt-get install dataset-fashion-mnist"
        )
    xtr, ytr, xte, yte = (read_idx(root / n) for n in names)

    def split(x: np.ndarray, y: np.ndarray) -> Split:
        return Split(torch.from_numpy(x.copy()).unsqueeze(1), torch.from_numpy(y.astype(np.int64)))

    return Dataset("fashion-mnist", split(xtr, ytr), split(xte, yte), 10, augment=False)
