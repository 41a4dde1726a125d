"""CycleGAN (Zhu et al., 2017): two generators translate between unpaired image domains A and B,
two discriminators tell real from translated, and a cycle loss asks A -> B -> A to return home.
Gavel's job trains it on monet2photo at 256 x 256, one image pair per step, with ResNet generators
(9 residual blocks), PatchGAN discriminators, least-squares adversarial losses, cycle weight 10,
identity weight 5, and Adam (2e-4, betas 0.5 / 0.999) for the generators and each discriminator.

Not kept: the pools of past translations the discriminators also see (a 50-image history), and
the learning-rate decay after epoch 100; a step depends on the model, the optimizers and its
batch only.

Synthetic domains (the default): A is smooth random scenes; B is such scenes under a fixed colour
transform (drawn from the task seed), so there is a translation to learn. ``--data-dir`` reads
``A.npy`` and ``B.npy``: images (N, 3, H, W) or (N, H, W, 3), uint8 or float in [-1, 1], resized
to the model's size; the two sets need not be the same size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from worker_service.workloads.config import WorkloadConfig
from worker_service.workloads.data import (
    ORDER,
    Batches,
    check_images,
    first_existing,
    image_tensor,
    load_array,
    position_seed,
    require_dir,
    sample_generator,
    task_generator,
)
from worker_service.workloads.errors import DataDirError
from worker_service.workloads.job import TrainingJob, seeded_module

CYCLE_WEIGHT = 10.0
IDENTITY_WEIGHT = 5.0
SCENE_PX = 8  # synthetic scenes: 8 x 8 random fields, upsampled (smooth, like photographs at a distance)
EXPECTED = "A.npy and B.npy: images (N, 3, H, W) or (N, H, W, 3), uint8 or float in [-1, 1]"


@dataclass(frozen=True)
class CycleGANShape:
    image_px: int
    generator_width: int  # channels of the generators' first layer (64 in the paper)
    residual_blocks: int
    discriminator_width: int
    samples_per_epoch: int = 6_287  # monet2photo: as many steps as photographs (the larger set)


SHAPES = {
    "small": CycleGANShape(image_px=64, generator_width=16, residual_blocks=3, discriminator_width=16),
    "full": CycleGANShape(image_px=256, generator_width=64, residual_blocks=9, discriminator_width=64),
}


class ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.ReflectionPad2d(1), nn.Conv2d(channels, channels, 3), nn.InstanceNorm2d(channels), nn.ReLU(inplace=True),
            nn.ReflectionPad2d(1), nn.Conv2d(channels, channels, 3), nn.InstanceNorm2d(channels),
        )

    def forward(self, x: Tensor) -> Tensor:
        return x + self.body(x)


def generator_net(width: int, residual_blocks: int) -> nn.Sequential:
    """7x7 in, two stride-2 downsamplings, residual blocks at a quarter resolution, two
    upsamplings, 7x7 out to three channels in [-1, 1]."""
    layers: list[nn.Module] = [nn.ReflectionPad2d(3), nn.Conv2d(3, width, 7), nn.InstanceNorm2d(width), nn.ReLU(inplace=True)]
    channels = width
    for _ in range(2):
        layers += [nn.Conv2d(channels, channels * 2, 3, stride=2, padding=1), nn.InstanceNorm2d(channels * 2), nn.ReLU(inplace=True)]
        channels *= 2
    layers += [ResidualBlock(channels) for _ in range(residual_blocks)]
    for _ in range(2):
        layers += [
            nn.Upsample(scale_factor=2), nn.Conv2d(channels, channels // 2, 3, padding=1),
            nn.InstanceNorm2d(channels // 2), nn.ReLU(inplace=True),
        ]
        channels //= 2
    layers += [nn.ReflectionPad2d(3), nn.Conv2d(channels, 3, 7), nn.Tanh()]
    return nn.Sequential(*layers)


def discriminator_net(width: int) -> nn.Sequential:
    """PatchGAN: one real/fake score per patch, on a grid of 1/16 of the image's side."""
    layers: list[nn.Module] = []
    channels = 3
    for i, out in enumerate((width, width * 2, width * 4, width * 8)):
        layers.append(nn.Conv2d(channels, out, 4, stride=2, padding=1))
        if i > 0:  # no normalisation on the first layer, as in the paper
            layers.append(nn.InstanceNorm2d(out))
        layers.append(nn.LeakyReLU(0.2, inplace=True))
        channels = out
    layers += [nn.ZeroPad2d((1, 0, 1, 0)), nn.Conv2d(channels, 1, 4, padding=1)]
    return nn.Sequential(*layers)


class CycleGenerators(nn.Module):
    """Both generators and every translation the generators' loss needs, in one forward (so that
    DistributedDataParallel sees each module called once per step)."""

    def __init__(self, shape: CycleGANShape) -> None:
        super().__init__()
        self.a_to_b = generator_net(shape.generator_width, shape.residual_blocks)
        self.b_to_a = generator_net(shape.generator_width, shape.residual_blocks)

    def forward(self, real_a: Tensor, real_b: Tensor) -> dict[str, Tensor]:
        fake_b, fake_a = self.a_to_b(real_a), self.b_to_a(real_b)
        return {
            "fake_a": fake_a,
            "fake_b": fake_b,
            "cycled_a": self.b_to_a(fake_b),
            "cycled_b": self.a_to_b(fake_a),
            "same_a": self.b_to_a(real_a),  # identity: a generator leaves its target domain alone
            "same_b": self.a_to_b(real_b),
        }


def normal_init(module: nn.Module) -> None:
    """The paper's initialisation: N(0, 0.02) convolution weights."""
    if isinstance(module, nn.Conv2d):
        nn.init.normal_(module.weight, 0.0, 0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


def make_model(shape: CycleGANShape) -> nn.ModuleDict:
    model = nn.ModuleDict(
        {
            "generators": CycleGenerators(shape),
            "discriminator_a": discriminator_net(shape.discriminator_width),
            "discriminator_b": discriminator_net(shape.discriminator_width),
        }
    )
    model.apply(normal_init)
    return model


class SyntheticDomains(Batches[tuple[Tensor, Tensor]]):
    def __init__(self, shape: CycleGANShape, batch_size: int, task_seed: int, sample_seed: int) -> None:
        super().__init__(shape.samples_per_epoch // batch_size)
        self.shape, self.batch_size, self.seed = shape, batch_size, sample_seed
        g = task_generator(task_seed)
        self.colour = torch.eye(3) + 0.5 * torch.randn(3, 3, generator=g)  # B's look: a colour mix and a tint
        self.tint = 0.3 * torch.randn(3, 1, 1, generator=g)

    def _scenes(self, g: torch.Generator) -> Tensor:
        coarse = torch.randn(self.batch_size, 3, SCENE_PX, SCENE_PX, generator=g)
        px = self.shape.image_px
        return torch.tanh(F.interpolate(coarse, size=(px, px), mode="bicubic", align_corners=False))

    def make(self, epoch: int, index: int) -> tuple[Tensor, Tensor]:
        g = sample_generator(self.seed, epoch, index)
        a, scenes = self._scenes(g), self._scenes(g)
        b = torch.tanh(torch.einsum("ij,bjhw->bihw", self.colour, scenes) + self.tint)
        return a, b


class ImageDomains(Batches[tuple[Tensor, Tensor]]):
    """Unpaired: each domain read in its own shuffled order; an epoch covers the larger one."""

    def __init__(self, a: np.ndarray, b: np.ndarray, image_px: int, batch_size: int, seed: int) -> None:
        super().__init__(max(len(a), len(b)) // batch_size)
        self.domains, self.image_px, self.batch_size, self.seed = (a, b), image_px, batch_size, seed
        self._orders: tuple[int, list[np.ndarray]] | None = None

    def make(self, epoch: int, index: int) -> tuple[Tensor, Tensor]:
        if self._orders is None or self._orders[0] != epoch:
            self._orders = (
                epoch,
                [np.random.default_rng(position_seed(self.seed, ORDER, epoch, d)).permutation(len(x)) for d, x in enumerate(self.domains)],
            )
        batches = []
        for images, order in zip(self.domains, self._orders[1], strict=True):
            rows = [order[(index * self.batch_size + i) % len(order)] for i in range(self.batch_size)]
            batches.append(image_tensor(images[rows], self.image_px))
        return batches[0], batches[1]


def read_domains(directory: Path) -> tuple[np.ndarray, np.ndarray]:
    require_dir(directory, "CycleGAN", EXPECTED)
    paths = [first_existing(directory, [name]) for name in ("A.npy", "B.npy")]
    if paths[0] is None or paths[1] is None:
        raise DataDirError(f"CycleGAN --data-dir {directory}: expected {EXPECTED}")
    a, b = (check_images(load_array(p, "CycleGAN", EXPECTED), p, "CycleGAN", EXPECTED) for p in (paths[0], paths[1]))
    return a, b


class CycleGANJob(TrainingJob):
    def _discriminator_step(self, name: str, real: Tensor, fake: Tensor) -> Tensor:
        # Real and translated images in one forward (instance norm keeps samples independent).
        scores = self.nets[name](torch.cat([real, fake.detach()]))
        n = real.shape[0]
        loss = (F.mse_loss(scores[:n], torch.ones_like(scores[:n])) + F.mse_loss(scores[n:], torch.zeros_like(scores[n:]))) / 2
        optimizer = self.optimizers[name]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()

    def step(self, batch: tuple[Tensor, Tensor]) -> float:
        real_a, real_b = (t.to(self.device, non_blocking=True) for t in batch)
        for net in self.nets.values():
            net.train()
        out = self.nets["generators"](real_a, real_b)
        # The generators' adversarial loss: the plain discriminators, frozen, so that this
        # backward computes no discriminator gradients (and never touches their DDP wrappers).
        discriminators = [self.model["discriminator_a"], self.model["discriminator_b"]]
        for d in discriminators:
            d.requires_grad_(False)
        score_a, score_b = discriminators[0](out["fake_a"]), discriminators[1](out["fake_b"])
        adversarial = (F.mse_loss(score_a, torch.ones_like(score_a)) + F.mse_loss(score_b, torch.ones_like(score_b))) / 2
        cycle = (F.l1_loss(out["cycled_a"], real_a) + F.l1_loss(out["cycled_b"], real_b)) / 2
        identity = (F.l1_loss(out["same_a"], real_a) + F.l1_loss(out["same_b"], real_b)) / 2
        loss_g = adversarial + CYCLE_WEIGHT * cycle + IDENTITY_WEIGHT * identity
        optimizer = self.optimizers["generators"]
        optimizer.zero_grad(set_to_none=True)
        loss_g.backward()
        optimizer.step()
        for d in discriminators:
            d.requires_grad_(True)
        loss_d = (
            self._discriminator_step("discriminator_a", real_a, out["fake_a"])
            + self._discriminator_step("discriminator_b", real_b, out["fake_b"])
        ) / 2
        return (loss_g.detach() + loss_d).item()


def build(batch_size: int, config: WorkloadConfig) -> CycleGANJob:
    shape = SHAPES[config.size]
    if config.data_dir is None:
        data: Batches = SyntheticDomains(shape, batch_size, config.seed, config.sample_seed)
    else:
        a, b = read_domains(config.data_dir)
        if min(len(a), len(b)) < 1:
            raise DataDirError(f"CycleGAN --data-dir {config.data_dir}: A.npy and B.npy must each hold an image")
        data = ImageDomains(a, b, shape.image_px, batch_size, config.sample_seed)
    model = seeded_module(config.seed, lambda: make_model(shape)).to(config.device)
    betas = (0.5, 0.999)
    optimizers = {name: torch.optim.Adam(model[name].parameters(), lr=2e-4, betas=betas) for name in model}
    return CycleGANJob(family="CycleGAN", batch_size=batch_size, config=config, model=model, optimizers=optimizers, data=data)
