"""Image classification: ResNet-18 on CIFAR-10, ResNet-50 on ImageNet (Gavel's two vision jobs).

Synthetic data (the default) is learnable, not noise: each class has a fixed low-resolution
prototype (drawn from the task seed), and a sample is its class's prototype, upsampled to the
image size, plus Gaussian noise. ``--data-dir`` reads CIFAR-10's python batches or
``images.npy`` + ``labels.npy`` (docs/workloads.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from worker_service.workloads.config import WorkloadConfig
from worker_service.workloads.data import (
    Batches,
    check_images,
    epoch_order,
    first_existing,
    image_tensor,
    load_array,
    load_cifar10,
    require_dir,
    sample_generator,
    task_generator,
)
from worker_service.workloads.errors import DataDirError
from worker_service.workloads.job import TrainingJob, seeded_module
from worker_service.workloads.resnet import resnet18_cifar, resnet50_imagenet

PROTOTYPE_PX = 4  # class prototypes are 4 x 4 images, upsampled: coarse shapes a CNN can tell apart
NOISE_STD = 0.5


@dataclass(frozen=True)
class ImageShape:
    image_px: int  # square images, 3 channels
    base_width: int  # channels of the first stage (64 in the papers)
    classes: int
    samples_per_epoch: int  # the real dataset's training-set size


RESNET18 = {
    "small": ImageShape(image_px=32, base_width=16, classes=10, samples_per_epoch=50_000),
    "full": ImageShape(image_px=32, base_width=64, classes=10, samples_per_epoch=50_000),
}
# 224 x 224 is ImageNet's training crop; at 64 x 64 and a quarter of the widths a CPU step of
# batch 16 takes a fraction of a second (docs/workloads.md has the measurements).
RESNET50 = {
    "small": ImageShape(image_px=64, base_width=16, classes=1000, samples_per_epoch=1_281_167),
    "full": ImageShape(image_px=224, base_width=64, classes=1000, samples_per_epoch=1_281_167),
}

ARRAYS_EXPECTED = "images.npy (N, 3, H, W) or (N, H, W, 3), uint8 or float, and labels.npy (N,) integer classes"
CIFAR_EXPECTED = f"CIFAR-10 python batches (data_batch_1..5) or {ARRAYS_EXPECTED}"


class SyntheticImages(Batches[tuple[Tensor, Tensor]]):
    def __init__(self, shape: ImageShape, batch_size: int, task_seed: int, sample_seed: int) -> None:
        super().__init__(shape.samples_per_epoch // batch_size)
        self.shape, self.batch_size, self.seed = shape, batch_size, sample_seed
        self.prototypes = torch.randn(shape.classes, 3, PROTOTYPE_PX, PROTOTYPE_PX, generator=task_generator(task_seed))

    def make(self, epoch: int, index: int) -> tuple[Tensor, Tensor]:
        g = sample_generator(self.seed, epoch, index)
        labels = torch.randint(self.shape.classes, (self.batch_size,), generator=g)
        px = self.shape.image_px
        images = F.interpolate(self.prototypes[labels], size=(px, px), mode="bilinear", align_corners=False)
        return images + NOISE_STD * torch.randn(images.shape, generator=g), labels


class ArrayImages(Batches[tuple[Tensor, Tensor]]):
    """A local dataset in memory (or memory-mapped), read in a shuffled order per epoch."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, image_px: int, batch_size: int, seed: int) -> None:
        super().__init__(len(labels) // batch_size)
        self.images, self.labels, self.image_px, self.batch_size, self.seed = images, labels, image_px, batch_size, seed
        self._order: tuple[int, np.ndarray] | None = None

    def make(self, epoch: int, index: int) -> tuple[Tensor, Tensor]:
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, epoch_order(self.seed, epoch, len(self.labels)))
        rows = self._order[1][index * self.batch_size : (index + 1) * self.batch_size]
        images = image_tensor(self.images[rows], self.image_px)
        return images, torch.from_numpy(np.asarray(self.labels[rows], dtype=np.int64))


def read_images(family: str, directory: Path, shape: ImageShape, *, cifar: bool) -> tuple[np.ndarray, np.ndarray]:
    expected = CIFAR_EXPECTED if cifar else ARRAYS_EXPECTED
    require_dir(directory, family, expected)
    found = load_cifar10(directory) if cifar else None
    if found is None:
        images_path = first_existing(directory, ["images.npy"])
        labels_path = first_existing(directory, ["labels.npy"])
        if images_path is None or labels_path is None:
            raise DataDirError(f"{family} --data-dir {directory}: expected {expected}")
        images = check_images(load_array(images_path, family, expected), images_path, family, expected)
        labels = load_array(labels_path, family, expected)
        found = (images, labels)
    images, labels = found
    if labels.ndim != 1 or len(labels) != len(images) or not np.issubdtype(labels.dtype, np.integer):
        raise DataDirError(f"{family} --data-dir {directory}: labels must be (N,) integers, one per image; expected {expected}")
    if len(labels) and (labels.min() < 0 or labels.max() >= shape.classes):
        raise DataDirError(f"{family} --data-dir {directory}: labels must be in 0..{shape.classes - 1}")
    return images, labels


class ImageClassificationJob(TrainingJob):
    def step(self, batch: tuple[Tensor, Tensor]) -> float:
        images, labels = (t.to(self.device, non_blocking=True) for t in batch)
        net = self.nets["model"]
        net.train()
        loss = F.cross_entropy(net(images), labels)
        optimizer = self.optimizers["sgd"]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()


def _build(family: str, shapes: dict[str, ImageShape], batch_size: int, config: WorkloadConfig, *, cifar: bool) -> ImageClassificationJob:
    shape = shapes[config.size]
    if config.data_dir is None:
        data: Batches = SyntheticImages(shape, batch_size, config.seed, config.sample_seed)
    else:
        images, labels = read_images(family, config.data_dir, shape, cifar=cifar)
        if len(labels) < batch_size:
            raise DataDirError(f"{family} --data-dir {config.data_dir}: {len(labels)} images, fewer than one batch of {batch_size}")
        data = ArrayImages(images, labels, shape.image_px, batch_size, config.sample_seed)
    make = resnet18_cifar if cifar else resnet50_imagenet
    model = seeded_module(config.seed, lambda: make(base_width=shape.base_width, classes=shape.classes)).to(config.device)
    # SGD with momentum 0.9 and weight decay, as Gavel's image-classification jobs; the learning
    # rate follows the linear scaling rule (Goyal et al., 2017: 0.1 per 128 CIFAR / 256 ImageNet
    # images), so that the small batches of the table do not diverge in their first steps.
    reference_batch = 128 if cifar else 256
    optimizer = torch.optim.SGD(
        model.parameters(), lr=0.1 * batch_size / reference_batch, momentum=0.9, weight_decay=5e-4 if cifar else 1e-4
    )
    return ImageClassificationJob(
        family=family, batch_size=batch_size, config=config, model=model, optimizers={"sgd": optimizer}, data=data
    )


def build_resnet18(batch_size: int, config: WorkloadConfig) -> ImageClassificationJob:
    return _build("ResNet-18", RESNET18, batch_size, config, cifar=True)


def build_resnet50(batch_size: int, config: WorkloadConfig) -> ImageClassificationJob:
    return _build("ResNet-50", RESNET50, batch_size, config, cifar=False)
