"""Data: the ORL loader and its repair, Fashion-MNIST, synthetic, folders, and per-worker shards."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from ringps.config import validate
from ringps.data import load_dataset
from ringps.data.fashion import ROOT as FASHION_ROOT
from ringps.data.loader import ShardedLoader, shard_indices
from ringps.data.orl import load_orl
from ringps.errors import DataError

# sha256 of the 400 repaired images, in person/image order (112 x 92 bytes each)
ORL_SHA256 = "9868432c04b06f35eef2719f39d79a5d78fe646d8c2eea48ad4698a003a4c143"


def test_orl_has_400_images_of_40_people_and_known_pixels():
    x, y = load_orl()
    assert x.shape == (400, 1, 112, 92) and x.dtype == torch.uint8
    assert torch.equal(torch.bincount(y), torch.full((40,), 10))
    assert hashlib.sha256(x.numpy().tobytes()).hexdigest() == ORL_SHA256


def test_orl_repair_makes_faces_recognisable():
    """1-nearest-neighbour on raw pixels scores about 90% when the images are intact (PLATFORM.md);
    unrepaired files would be shifted by their extra bytes and score far lower."""
    x, y = load_orl()
    flat = x.reshape(400, -1).float()
    train = (torch.arange(400) % 10) < 5
    d = torch.cdist(flat[~train], flat[train])
    acc = (y[train][d.argmin(1)] == y[~train]).float().mean().item()
    assert acc >= 0.88


def test_orl_split_is_per_person():
    ds = load_dataset(validate({"train_per_class": 7}).data)
    assert len(ds.train.labels) == 280 and len(ds.test.labels) == 120
    assert torch.equal(torch.bincount(ds.test.labels), torch.full((40,), 3))
    assert ds.shape == (1, 112, 92) and ds.num_classes == 40


@pytest.mark.skipif(not FASHION_ROOT.is_dir(), reason="Debian package dataset-fashion-mnist is not installed")
def test_fashion_mnist():
    ds = load_dataset(validate({"dataset": "fashion-mnist"}).data)
    assert ds.train.images.shape == (60000, 1, 28, 28) and ds.test.images.shape == (10000, 1, 28, 28)
    assert torch.equal(torch.bincount(ds.train.labels), torch.full((10,), 6000))


def test_fashion_mnist_missing_names_the_package(tmp_path):
    from ringps.data.fashion import fashion_mnist

    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist"):
        fashion_mnist(None, root=tmp_path)


def test_synthetic_any_size():
    ds = load_dataset(validate({"dataset": "synthetic", "synthetic_samples": 50, "synthetic_shape": "3,9,7"}).data)
    assert ds.train.images.shape == (50, 3, 9, 7) and ds.num_classes == 10


def test_folder_dataset(tmp_path):
    import matplotlib.image as mpimg

    for c in ("cats", "dogs"):
        (tmp_path / c).mkdir()
        for i in range(5):
            mpimg.imsave(tmp_path / c / f"{i}.png", np.full((12, 10), 30 * i + (100 if c == "dogs" else 0), np.uint8), cmap="gray")
    ds = load_dataset(validate({"dataset": f"folder:{tmp_path}"}).data)
    assert ds.num_classes == 2 and ds.shape == (1, 12, 10)
    assert len(ds.train.labels) + len(ds.test.labels) == 10 and len(ds.test.labels) == 2
    with pytest.raises(DataError, match="at least two subfolders"):
        load_dataset(validate({"dataset": f"folder:{tmp_path / 'cats'}"}).data)


@pytest.mark.parametrize("n, workers", [(280, 4), (281, 4), (10, 3), (7, 7), (100, 1)])
def test_shards_are_disjoint_and_complete(n, workers):
    for epoch in range(3):
        shards = [shard_indices(n, w, workers, seed=5, epoch=epoch) for w in range(workers)]
        allidx = torch.cat(shards)
        assert len(allidx) == n and len(torch.unique(allidx)) == n
        assert max(map(len, shards)) - min(map(len, shards)) <= 1
    # a new epoch reshuffles
    assert not torch.equal(shard_indices(n, 0, workers, 5, 0), shard_indices(n, 0, workers, 5, 1)) or n <= workers


@pytest.mark.parametrize("n, workers, batch", [(280, 4, 16), (281, 3, 16), (10, 3, 64), (9, 4, 2)])
def test_loader_gives_every_worker_the_same_number_of_steps(n, workers, batch):
    from ringps.data import Split

    split = Split(torch.zeros(n, 1, 4, 4, dtype=torch.uint8), torch.arange(n) % 3)
    loaders = [ShardedLoader(split, w, workers, batch, seed=1) for w in range(workers)]
    seen = []
    for ld in loaders:
        bs = list(ld.epoch(0))
        assert len(bs) == len(ld) == len(loaders[0]) and all(len(b.targets) >= 1 for b in bs)
        assert max(len(b.targets) for b in bs) <= batch + 1
        seen.append(torch.cat([b.indices for b in bs]))
    assert sorted(torch.cat(seen).tolist()) == list(range(n))


def test_too_few_samples_for_the_workers():
    from ringps.data import Split

    with pytest.raises(DataError, match="fewer than --workers 4"):
        ShardedLoader(Split(torch.zeros(3, 1, 2, 2, dtype=torch.uint8), torch.zeros(3, dtype=torch.long)), 0, 4, 8, 0)
