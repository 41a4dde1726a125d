"""What every family builds: a ``TrainingJob`` (model, optimizers, data, one training step) whose
``state_dict`` holds everything a resumed job needs to continue exactly where it stopped.

A job carries its own random-number stream (dropout, sampled actions) instead of using torch's
global one: ``train_step`` runs with the job's generator state swapped in, and that state is
checkpointed. So two jobs built alike in one process train alike, and a job restored from a
checkpoint takes the same next step as the job that wrote it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from worker_service.workloads.config import WorkloadConfig
from worker_service.workloads.data import Batches


def seeded_module(seed: int, make: Callable[[], nn.Module]) -> nn.Module:
    """``make()`` with torch's global generator seeded, then restored: the same seed gives the same
    initial weights without disturbing anyone else's random numbers."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


class TrainingJob(ABC):
    """A job ready to train.

    ``model``: the job's module (an ``nn.ModuleDict`` when it has several); ``optimizers``: by name;
    ``data``: a resumable iterable of batches; ``nets``: the modules ``step`` calls, by name, which
    ``distribute`` may wrap (DistributedDataParallel) while ``model`` stays the plain module, so a
    checkpoint is the same with one rank or many.
    """

    def __init__(
        self,
        *,
        family: str,
        batch_size: int,
        config: WorkloadConfig,
        model: nn.Module,
        optimizers: Mapping[str, torch.optim.Optimizer],
        data: Batches,
    ) -> None:
        self.family = family
        self.batch_size = batch_size
        self.config = config
        self.device = torch.device(config.device)
        self.model = model
        self.optimizers = dict(optimizers)
        self.data = data
        self.nets: dict[str, nn.Module] = dict(model.items()) if isinstance(model, nn.ModuleDict) else {"model": model}
        self._cpu_rng = torch.Generator().manual_seed(config.sample_seed).get_state()
        self._cuda_rng: torch.Tensor | None = None
        if self.device.type == "cuda":
            with torch.random.fork_rng(devices=[self._cuda_index]):
                torch.cuda.manual_seed(config.sample_seed)
                self._cuda_rng = torch.cuda.get_rng_state(self.device)

    @property
    def _cuda_index(self) -> int:
        return self.device.index or 0

    def distribute(self, wrap: Callable[[nn.Module], nn.Module]) -> None:
        """Wrap each module ``step`` calls (e.g. in DistributedDataParallel)."""
        self.nets = {name: wrap(net) for name, net in self.nets.items()}

    def train_step(self, batch: Any) -> float:
        """One optimisation step on ``batch``; the loss, as a float."""
        with self._own_rng():
            return self.step(batch)

    @abstractmethod
    def step(self, batch: Any) -> float:
        """The family's training step (forward, backward, optimizer step)."""

    # -- checkpoints -----------------------------------------------------------------------------

    def extra_state(self) -> dict[str, Any]:
        """State beyond model, optimizers, data position and RNG (an LSTM's carried hidden state)."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:  # noqa: B027 (optional hook)
        pass

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed job needs; plain tensors and Python values only, so that it loads
        with ``torch.load(..., weights_only=True)``."""
        return {
            "family": self.family,
            "batch_size": self.batch_size,
            "model": self.model.state_dict(),
            "optimizers": {name: opt.state_dict() for name, opt in self.optimizers.items()},
            "data": self.data.state_dict(),
            "rng": {"cpu": self._cpu_rng, "cuda": self._cuda_rng},
            "extra": self.extra_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state["family"], state["batch_size"]) != (self.family, self.batch_size):
            raise ValueError(
                f"a checkpoint of {state['family']} with batch size {state['batch_size']} cannot be loaded "
                f"into {self.family} with batch size {self.batch_size}"
            )
        self.model.load_state_dict(state["model"])
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state["optimizers"][name])
        self.data.load_state_dict(state["data"])
        self._cpu_rng = state["rng"]["cpu"].cpu()
        if self._cuda_rng is not None and state["rng"]["cuda"] is not None:
            self._cuda_rng = state["rng"]["cuda"].cpu()
        self.load_extra_state(state["extra"])

    @contextmanager
    def _own_rng(self) -> Iterator[None]:
        cuda = self._cuda_rng is not None
        with torch.random.fork_rng(devices=[self._cuda_index] if cuda else []):
            torch.set_rng_state(self._cpu_rng)
            if cuda:
                torch.cuda.set_rng_state(self._cuda_rng, self.device)
            yield
            self._cpu_rng = torch.get_rng_state()
            if cuda:
                self._cuda_rng = torch.cuda.get_rng_state(self.device)
