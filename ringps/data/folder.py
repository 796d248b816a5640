"""folder:PATH: one subfolder per class of images (PGM/PNG/JPEG), split 80/20 per class.

Images are converted to grey and resized to the first image's size, so any folder of photos works.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ringps.data import DATASETS, Dataset, Split
from ringps.errors import DataError

SUFFIXES = {".pgm", ".png", ".jpg", ".jpeg", ".bmp"}


def _read(path: Path, size: tuple[int, int] | None) -> np.ndarray:
    from matplotlib.image import imread  # reads PNG natively and other formats through Pillow

    try:
        img = np.asarray(imread(path))
    except Exception as e:  # noqa: BLE001 - any decoder failure is a data error for the user
        raise DataError(f"folder: cannot read {path}: {e}") from None
    if img.ndim == 3:
        img = img[..., :3].mean(axis=2)
    if img.dtype != np.uint8:
        img = (img * 255 if img.max() <= 1.0 else img).clip(0, 255).astype(np.uint8)
    if size is not None and img.shape != size:
        t = torch.from_numpy(img.astype(np.float32))[None, None]
        img = torch.nn.functional.interpolate(t, size=size, mode="bilinear").squeeze().clamp(0, 255).byte().numpy()
    return img


@DATASETS.register("folder")
def folder(cfg, path: str) -> Dataset:
    root = Path(path)
    classes = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if len(classes) < 2:
        raise DataError(f"folder:{path}: needs at least two subfolders, one per class")
    train, test, size = [], [], None
    for label, cdir in enumerate(classes):
        files = sorted(f for f in cdir.iterdir() if f.suffix.lower() in SUFFIXES)
        if len(files) < 2:
            raise DataError(f"folder:{path}: class {cdir.name!r} has fewer than two images")
        n_test = max(1, len(files) // 5)
        for i, f in enumerate(files):
            img = _read(f, size)
            size = size or img.shape
            (test if i >= len(files) - n_test else train).append((img, label))

    def split(items: list) -> Split:
        x = torch.from_numpy(np.stack([i for i, _ in items])).unsqueeze(1)
        return Split(x, torch.tensor([l for _, l in items]))

    return Dataset(f"folder:{path}", split(train), split(test), len(classes), augment=True)
