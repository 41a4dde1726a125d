"""Recommendation: an autoencoder over users' item vectors (implicit feedback), like Gavel's ML-20M
job (Recoder's dynamic autoencoder: one 200-unit tanh layer, half of the input dropped as noise,
a logistic loss over all items, Adam at 1e-3 with weight decay 2e-5).

A sample is one user: a 0/1 vector over the items, 1 where the user watched the item; the model
reconstructs the vector from a corrupted copy. Gavel samples negative items to shrink the output;
here the output covers every item (the same model; more arithmetic per step at "full").

Synthetic users (the default) have a latent taste: items and users are points in a 16-dimensional
space (items fixed by the task seed), and a user watches the items nearest their taste, plus noise.
``--data-dir`` reads ``ratings.csv``: ``user,item,rating`` rows (more columns and a header line
are ignored, so ML-20M's own file works); a rating of 3.5 or more counts as watched (the
convention of Liang et al.'s ML-20M preprocessing, which Gavel uses); without a rating column
every row is watched.
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
    Batches,
    epoch_order,
    first_existing,
    require_dir,
    sample_generator,
    task_generator,
)
from worker_service.workloads.errors import DataDirError
from worker_service.workloads.job import TrainingJob, seeded_module

WATCHED_RATING = 3.5
TASTE_DIMS = 16
EXPECTED = "ratings.csv: rows of user,item[,rating[,...]] (a header line is skipped)"


@dataclass(frozen=True)
class AutoencoderShape:
    items: int  # synthetic catalogue size (a local dataset brings its own)
    hidden: int
    input_dropout: float
    min_watched: int  # synthetic users watch between these many items
    max_watched: int
    users_per_epoch: int = 116_677  # ML-20M's training users after the preprocessing


SHAPES = {
    "small": AutoencoderShape(items=2_000, hidden=200, input_dropout=0.5, min_watched=5, max_watched=100),
    "full": AutoencoderShape(items=20_108, hidden=200, input_dropout=0.5, min_watched=5, max_watched=500),
}


class SyntheticUsers(Batches[Tensor]):
    def __init__(self, shape: AutoencoderShape, batch_size: int, task_seed: int, sample_seed: int) -> None:
        super().__init__(shape.users_per_epoch // batch_size)
        self.shape, self.batch_size, self.seed = shape, batch_size, sample_seed
        self.item_points = torch.randn(shape.items, TASTE_DIMS, generator=task_generator(task_seed))

    def make(self, epoch: int, index: int) -> Tensor:
        g = sample_generator(self.seed, epoch, index)
        tastes = torch.randn(self.batch_size, TASTE_DIMS, generator=g)
        affinity = tastes @ self.item_points.t() + torch.randn(self.batch_size, self.shape.items, generator=g)
        watched = torch.randint(self.shape.min_watched, self.shape.max_watched + 1, (self.batch_size, 1), generator=g)
        # A user watches their ``watched`` best items: those at or above that rank's affinity.
        threshold = affinity.topk(self.shape.max_watched, dim=1).values.gather(1, watched - 1)
        return (affinity >= threshold).float()


class RatedUsers(Batches[Tensor]):
    """Users' watched items in compressed rows: ``items[starts[u]:starts[u + 1]]`` are user u's."""

    def __init__(self, starts: np.ndarray, items: np.ndarray, item_count: int, batch_size: int, seed: int) -> None:
        super().__init__((len(starts) - 1) // batch_size)
        self.starts, self.items, self.item_count, self.batch_size, self.seed = starts, items, item_count, batch_size, seed
        self._order: tuple[int, np.ndarray] | None = None

    def make(self, epoch: int, index: int) -> Tensor:
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, epoch_order(self.seed, epoch, len(self.starts) - 1))
        users = self._order[1][index * self.batch_size : (index + 1) * self.batch_size]
        rows = np.concatenate([np.full(self.starts[u + 1] - self.starts[u], i) for i, u in enumerate(users)])
        columns = np.concatenate([self.items[self.starts[u] : self.starts[u + 1]] for u in users])
        batch = torch.zeros(self.batch_size, self.item_count)
        batch[torch.from_numpy(rows), torch.from_numpy(columns)] = 1.0
        return batch


def read_ratings(directory: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """(user starts, watched item columns, item count) from ``ratings.csv``."""
    require_dir(directory, "Recommendation", EXPECTED)
    path = first_existing(directory, ["ratings.csv"])
    if path is None:
        raise DataDirError(f"Recommendation --data-dir {directory}: expected {EXPECTED}")
    with path.open() as f:
        first = f.readline()
    fields = first.split(",")
    header = not fields[0].strip().lstrip("-").isdigit()
    columns = (0, 1, 2) if len(fields) >= 3 else (0, 1)
    try:
        table = np.loadtxt(path, delimiter=",", skiprows=1 if header else 0, usecols=columns, ndmin=2, dtype=np.float64)
    except ValueError as e:
        raise DataDirError(f"Recommendation --data-dir: {path} is not numeric CSV ({e}); expected {EXPECTED}") from e
    if len(columns) == 3:
        table = table[table[:, 2] >= WATCHED_RATING]
    if len(table) == 0:
        raise DataDirError(f"Recommendation --data-dir: {path} has no watched items (rating >= {WATCHED_RATING})")
    _, users = np.unique(table[:, 0], return_inverse=True)
    item_ids, items = np.unique(table[:, 1], return_inverse=True)
    order = np.lexsort((items, users))
    users, items = users[order], items[order]
    starts = np.searchsorted(users, np.arange(users.max() + 2))
    return starts, items.astype(np.int64), len(item_ids)


class Autoencoder(nn.Module):
    def __init__(self, items: int, hidden: int, input_dropout: float) -> None:
        super().__init__()
        self.noise = nn.Dropout(input_dropout)  # the denoising corruption of the input
        self.encoder = nn.Linear(items, hidden)
        self.decoder = nn.Linear(hidden, items)

    def forward(self, watched: Tensor) -> Tensor:
        """(B, items) 0/1 vectors -> (B, items) logits of "would watch"."""
        return self.decoder(torch.tanh(self.encoder(self.noise(watched))))


class RecommendationJob(TrainingJob):
    def step(self, batch: Tensor) -> float:
        watched = batch.to(self.device, non_blocking=True)
        net = self.nets["model"]
        net.train()
        # Summed over items, averaged over users: each user's whole vector is one example.
        loss = F.binary_cross_entropy_with_logits(net(watched), watched, reduction="sum") / watched.shape[0]
        optimizer = self.optimizers["adam"]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()


def build(batch_size: int, config: WorkloadConfig) -> RecommendationJob:
    shape = SHAPES[config.size]
    if config.data_dir is None:
        data: Batches = SyntheticUsers(shape, batch_size, config.seed, config.sample_seed)
        items = shape.items
    else:
        starts, columns, items = read_ratings(config.data_dir)
        if len(starts) - 1 < batch_size:
            raise DataDirError(
                f"Recommendation --data-dir {config.data_dir}: {len(starts) - 1} users, fewer than one batch of {batch_size}"
            )
        data = RatedUsers(starts, columns, items, batch_size, config.sample_seed)
    model = seeded_module(config.seed, lambda: Autoencoder(items, shape.hidden, shape.input_dropout)).to(config.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=2e-5)
    return RecommendationJob(
        family="Recommendation", batch_size=batch_size, config=config, model=model, optimizers={"adam": optimizer}, data=data
    )
