"""How a workload is built: one frozen value, the same for every family."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Size = Literal["small", "full"]
SIZES: tuple[Size, ...] = ("small", "full")


@dataclass(frozen=True)
class WorkloadConfig:
    """``size``: "full" is the model and input shapes Gavel measured on GPUs (ResNet-50 on 224 x 224
    images, a 6+6-layer Transformer, ...); "small" keeps every shape that names the job (its batch
    size, CIFAR's 32 x 32 images, the LM's 35-token sequences) and narrows widths and shrinks
    inputs elsewhere, so that one step takes well under a second on one CPU thread.

    ``seed`` fixes the model's initial weights and the synthetic task (class prototypes, token
    tables); ``data_seed`` (default: ``seed``) fixes the stream of samples and the job's own
    random numbers (dropout, actions): the ranks of a gang share the first and differ in the second.
    ``data_dir``: read this local dataset instead of generating one (see docs/workloads.md).
    """

    size: Size = "small"
    seed: int = 0
    data_seed: int | None = None
    device: str = "cpu"
    data_dir: Path | None = None

    def __post_init__(self) -> None:
        if self.size not in SIZES:
            raise ValueError(f"size must be one of {', '.join(SIZES)}, got {self.size!r}")

    @property
    def sample_seed(self) -> int:
        return self.seed if self.data_seed is None else self.data_seed


def default_size(device: str) -> Size:
    """What a device runs unless told: the real shapes on an accelerator, small ones on a CPU."""
    return "small" if device == "cpu" else "full"
