"""Data streams every family shares: resumable, deterministic epochs of batches, and the readers
of the simple local formats ``--data-dir`` takes (docs/workloads.md lists them per family).

A stream's whole state is its position (epoch, index): batch ``index`` of epoch ``epoch`` is a
function of the seed and that position alone (synthetic samples drawn from a generator seeded
with both; a real dataset read in an order shuffled per epoch). So a checkpoint of the position
resumes the stream exactly, and no sample is generated or read before it is needed.
"""

from __future__ import annotations

import pickle
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
import torch
import torch.nn.functional as F

from worker_service.workloads.errors import DataDirError

B = TypeVar("B")


# What a seed is drawn for: the same seed gives unrelated numbers for each purpose.
SAMPLES, ORDER, TASK, ENVIRONMENT, ACTIONS = range(5)


def position_seed(seed: int, purpose: int, epoch: int = 0, index: int = 0) -> int:
    """A well-mixed 63-bit seed for one position of one purpose of stream ``seed`` (neighbouring
    positions and neighbouring seeds give unrelated numbers). All arguments are >= 0."""
    words = np.random.SeedSequence([seed, purpose, epoch, index]).generate_state(2, dtype=np.uint32)
    return (int(words[0]) << 31) ^ int(words[1])


def generator(seed: int, purpose: int, epoch: int = 0, index: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(position_seed(seed, purpose, epoch, index))


def sample_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """The generator of synthetic batch ``index`` of ``epoch``."""
    return generator(seed, SAMPLES, epoch, index)


def task_generator(seed: int, part: int = 0) -> torch.Generator:
    """The generator of a synthetic task's fixed structure (prototypes, token tables)."""
    return generator(seed, TASK, part)


def epoch_order(seed: int, epoch: int, count: int) -> np.ndarray:
    """The order in which a dataset of ``count`` samples is read in ``epoch``."""
    return np.random.default_rng(position_seed(seed, ORDER, epoch)).permutation(count)


class Batches(ABC, Generic[B]):
    """Epochs of ``batches_per_epoch`` batches; each ``iter()`` yields the rest of the current
    epoch (a new one if it is complete), which is what the lease iterator cycles over."""

    def __init__(self, batches_per_epoch: int) -> None:
        if batches_per_epoch < 1:
            raise ValueError("a data stream needs at least one batch per epoch")
        self.batches_per_epoch = batches_per_epoch
        self.epoch = 0
        self.index = 0  # the next batch of the epoch

    @abstractmethod
    def make(self, epoch: int, index: int) -> B:
        """Batch ``index`` of ``epoch`` (CPU tensors; the job moves them to its device)."""

    def __iter__(self) -> Iterator[B]:
        if self.index >= self.batches_per_epoch:
            self.epoch, self.index = self.epoch + 1, 0
        while self.index < self.batches_per_epoch:
            batch = self.make(self.epoch, self.index)
            self.index += 1  # before the yield: a checkpoint taken after this step resumes past it
            yield batch

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])


# -- readers of local datasets ---------------------------------------------------------------------


def first_existing(directory: Path, names: Sequence[str]) -> Path | None:
    for name in names:
        if (directory / name).is_file():
            return directory / name
    return None


def require_dir(directory: Path, family: str, expected: str) -> None:
    if not directory.is_dir():
        raise DataDirError(f"{family} --data-dir {directory}: not a directory (expected {expected})")


def load_array(path: Path, family: str, expected: str) -> np.ndarray:
    """A ``.npy`` array, memory-mapped (a large dataset is read batch by batch, not at once)."""
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        raise DataDirError(f"{family} --data-dir: {path} is not a readable .npy array ({e}); expected {expected}") from e


def check_images(images: np.ndarray, path: Path, family: str, expected: str) -> np.ndarray:
    """Images as (N, 3, H, W) or (N, H, W, 3), uint8 (0..255) or floating point."""
    if images.ndim != 4 or 3 not in (images.shape[1], images.shape[3]):
        raise DataDirError(f"{family} --data-dir: {path} has shape {images.shape}; expected {expected}")
    if not (images.dtype == np.uint8 or np.issubdtype(images.dtype, np.floating)):
        raise DataDirError(f"{family} --data-dir: {path} holds {images.dtype}; expected uint8 or float images")
    return images


def image_tensor(images: np.ndarray, size_px: int) -> torch.Tensor:
    """A batch of images as float (B, 3, size, size) in [-1, 1] (uint8 input) or as stored (float
    input), resized when the dataset's images have another size."""
    batch = torch.from_numpy(np.ascontiguousarray(images))
    if batch.shape[1] != 3:
        batch = batch.permute(0, 3, 1, 2)
    batch = batch.float() / 127.5 - 1.0 if batch.dtype == torch.uint8 else batch.float()
    if tuple(batch.shape[2:]) != (size_px, size_px):
        batch = F.interpolate(batch, size=(size_px, size_px), mode="bilinear", antialias=True, align_corners=False)
    return batch.contiguous()


def load_cifar10(directory: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """CIFAR-10's python batches (``data_batch_1`` .. ``data_batch_5``, in ``directory`` or in its
    ``cifar-10-batches-py``), as (N, 3, 32, 32) uint8 images and (N,) labels; None if absent.
    These are pickles, as the dataset ships them: read only a copy you trust."""
    for root in (directory, directory / "cifar-10-batches-py"):
        files = sorted(root.glob("data_batch_*"))
        if files:
            images, labels = [], []
            for path in files:
                with path.open("rb") as f:
                    batch = pickle.load(f, encoding="bytes")  # noqa: S301 (the dataset's own format)
                images.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
                labels.append(np.asarray(batch[b"labels"], dtype=np.int64))
            return np.concatenate(images), np.concatenate(labels)
    return None


def read_words(path: Path) -> list[list[str]]:
    """A text file as lines of whitespace-separated words."""
    with path.open(encoding="utf-8", errors="replace") as f:
        return [line.split() for line in f]


class Vocabulary:
    """Words -> ids, in order of first appearance (deterministic), after the reserved ``specials``."""

    def __init__(self, specials: Sequence[str] = ()) -> None:
        self.ids: dict[str, int] = {}
        for word in specials:
            self.add(word)

    def add(self, word: str) -> int:
        return self.ids.setdefault(word, len(self.ids))

    def __len__(self) -> int:
        return len(self.ids)
