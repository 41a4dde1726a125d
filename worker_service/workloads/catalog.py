"""The catalog: every job type of Gavel's throughput table -> a workload that really trains.

``entry_for("ResNet-18 (batch size 32)")`` parses the job type and returns a ``Workload``; its
``build(config)`` makes the job (model, optimizers, data, ``train_step``). The batch size is part
of the job's identity: a "small" build shrinks models and inputs, never the batch.

This module imports no torch (each family's module is imported by ``build``), so the worker and
the runner can check a job type in milliseconds.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from worker_service.workloads.config import WorkloadConfig
from worker_service.workloads.errors import UnknownWorkloadError

if TYPE_CHECKING:
    from worker_service.workloads.job import TrainingJob

_JOB_TYPE = re.compile(r"\s*(?P<family>.+?)\s*\(\s*batch size\s+(?P<batch>\S+?)\s*\)\s*")


@dataclass(frozen=True)
class Family:
    """One model family. ``batch_sizes`` are those of Gavel's table (any positive size builds);
    ``fixed_batch_size`` is set for families whose job type names no batch size."""

    name: str
    builder: str  # "module:function", imported on build (keeps torch out of this module)
    summary: str
    batch_sizes: tuple[int, ...] = ()
    fixed_batch_size: int | None = None

    @property
    def job_type_form(self) -> str:
        return self.name if self.fixed_batch_size is not None else f"{self.name} (batch size N)"


_PACKAGE = "worker_service.workloads"

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("ResNet-18", f"{_PACKAGE}.image_classification:build_resnet18",
               "image classification, CIFAR-10 (3x32x32, 10 classes)", (16, 32, 64, 128, 256)),
        Family("ResNet-50", f"{_PACKAGE}.image_classification:build_resnet50",
               "image classification, ImageNet (3x224x224, 1000 classes)", (16, 32, 64, 128)),
        Family("Transformer", f"{_PACKAGE}.translation:build",
               "translation, encoder-decoder Transformer (Multi30k-like)", (16, 32, 64, 128, 256)),
        Family("LM", f"{_PACKAGE}.language_model:build",
               "language modelling, 2-layer LSTM, 35-token BPTT (WikiText-2-like)", (5, 10, 20, 40, 80)),
        Family("Recommendation", f"{_PACKAGE}.recommendation:build",
               "autoencoder over user-item rating vectors (ML-20M-like)", (512, 1024, 2048, 4096, 8192)),
        # Gavel's A3C job type names no batch size; ours steps 32 actors (its 32 workers) in lockstep (see its module).
        Family("A3C", f"{_PACKAGE}.actor_critic:build",
               "reinforcement learning, actor-critic on gymnasium CartPole-v1", fixed_batch_size=32),
        # CycleGAN trains on one image pair per step, as in Gavel (and the paper).
        Family("CycleGAN", f"{_PACKAGE}.cyclegan:build",
               "unpaired image translation, two generators and two discriminators", fixed_batch_size=1),
    )
}


@dataclass(frozen=True)
class Workload:
    """A job type resolved: its family and batch size (the job's identity)."""

    job_type: str
    family: str
    batch_size: int

    def build(self, config: WorkloadConfig | None = None) -> TrainingJob:
        """The job, ready to train. Raises DataDirError when ``config.data_dir`` lacks the files
        this family reads."""
        module_name, _, function = FAMILIES[self.family].builder.partition(":")
        builder = getattr(importlib.import_module(module_name), function)
        return builder(self.batch_size, config or WorkloadConfig())


def known_job_types() -> str:
    return ", ".join(f.job_type_form for f in FAMILIES.values())


def _family(name: str, job_type: str) -> Family:
    for family in FAMILIES.values():
        if family.name.lower() == name.lower():
            return family
    raise UnknownWorkloadError(f"unknown job type {job_type!r}; known: {known_job_types()}")


def entry_for(job_type: str) -> Workload:
    """The workload of a job type such as "LM (batch size 20)", "A3C" or "CycleGAN".

    Raises UnknownWorkloadError (a ValueError) for an unknown family, a batch size that is not a
    positive integer, or a batch size given to a family whose job type names none (or missing).
    """
    match = _JOB_TYPE.fullmatch(job_type)
    if match is None:
        family = _family(job_type.strip(), job_type)
        if family.fixed_batch_size is None:
            raise UnknownWorkloadError(f"job type {job_type!r} names no batch size; expected {family.job_type_form!r}")
        return Workload(family.name, family.name, family.fixed_batch_size)
    family = _family(match["family"], job_type)
    if family.fixed_batch_size is not None:
        raise UnknownWorkloadError(f"job type {job_type!r}: {family.name} takes no batch size; expected {family.name!r}")
    text = match["batch"]
    if not text.isdigit() or int(text) <= 0:
        raise UnknownWorkloadError(f"job type {job_type!r}: the batch size must be a positive integer")
    batch_size = int(text)
    return Workload(f"{family.name} (batch size {batch_size})", family.name, batch_size)
