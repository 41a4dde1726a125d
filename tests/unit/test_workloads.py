"""The workload catalog (worker_service/workloads), in process: every job type of Gavel's table
resolves; every family trains at "small" with its smallest batch size, deterministically, and
resumes exactly from its state_dict; every family reads its documented --data-dir format and
refuses a directory without it in one line.

Cost: about 10-15 s on a 2-core CPU (seven families, a handful of steps each, plus two "full"
model builds for their parameter counts). The runner's subprocess tests are in
test_workload_runner.py.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from common.throughputs import parse_job_key
from worker_service.workloads import (
    FAMILIES,
    DataDirError,
    UnknownWorkloadError,
    WorkloadConfig,
    entry_for,
)
from worker_service.workloads.job import TrainingJob

ROOT = Path(__file__).resolve().parents[2]


def smallest_job_type(family: str) -> str:
    f = FAMILIES[family]
    return f.name if f.fixed_batch_size is not None else f"{f.name} (batch size {min(f.batch_sizes)})"


SMALLEST = [smallest_job_type(name) for name in FAMILIES]


def build(job_type: str, **config: Any) -> TrainingJob:
    return entry_for(job_type).build(WorkloadConfig(**config))


def cycle(job: TrainingJob) -> Iterator[Any]:
    """The job's batches, epoch after epoch (as the lease iterator reads them)."""
    while True:
        yield from job.data


def train(job: TrainingJob, steps: int) -> list[float]:
    batches = cycle(job)
    return [job.train_step(next(batches)) for _ in range(steps)]


def assert_same(a: Any, b: Any, path: str = "") -> None:
    """Equal, exactly: tensors element by element, containers member by member."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b), f"{path} differs"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path} keys differ"
        for key in a:
            assert_same(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), f"{path} lengths differ"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    elif dataclasses.is_dataclass(a):
        for field in dataclasses.fields(a):
            assert_same(getattr(a, field.name), getattr(b, field.name), f"{path}.{field.name}")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def batch_rows(family: str, batch: Any) -> int:
    """How many samples a batch holds, where each family keeps them."""
    if family == "LM":
        return batch[0].shape[1]  # (35, B): windows are sequence-first
    if family == "A3C":
        return batch.actions.shape[1]  # (T, actors)
    if family == "Recommendation":
        return batch.shape[0]
    return batch[0].shape[0]


# -- the catalog ------------------------------------------------------------------------------------


def test_every_job_type_of_gavels_table_has_a_workload():
    table = json.loads((ROOT / "common/data/simulation_throughputs.json").read_text())
    job_types = {parse_job_key(key)[0] for by_type in table.values() for key in by_type}
    assert len(job_types) == 26
    for job_type in job_types:
        workload = entry_for(job_type)
        assert workload.job_type == job_type
        family = FAMILIES[workload.family]
        assert workload.batch_size in family.batch_sizes or workload.batch_size == family.fixed_batch_size


def test_entry_for_parses_family_and_batch_size():
    assert entry_for("LM (batch size 20)") == entry_for("  lm (batch size 20) ")
    w = entry_for("Recommendation (batch size 8192)")
    assert (w.family, w.batch_size, w.job_type) == ("Recommendation", 8192, "Recommendation (batch size 8192)")
    assert (entry_for("CycleGAN").batch_size, entry_for("A3C").batch_size) == (1, 32)
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.batch_size = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    "job_type",
    ["ResNet-19 (batch size 32)", "", "ResNet-18", "ResNet-18 (batch size 0)", "LM (batch size x)", "A3C (batch size 4)"],
)
def test_unknown_or_malformed_job_types_are_refused_with_the_known_forms(job_type):
    with pytest.raises(UnknownWorkloadError) as caught:
        entry_for(job_type)
    assert isinstance(caught.value, ValueError)
    message = str(caught.value)
    assert "\n" not in message
    if job_type.startswith("ResNet-19") or not job_type:
        for family in FAMILIES.values():
            assert family.job_type_form in message


def test_full_sizes_are_the_real_models():
    """ResNet-18 (CIFAR) and ResNet-50 (ImageNet) at "full" have the papers' parameter counts."""
    assert sum(p.numel() for p in build("ResNet-18 (batch size 16)", size="full").model.parameters()) == 11_173_962
    resnet50 = build("ResNet-50 (batch size 16)", size="full")
    assert sum(p.numel() for p in resnet50.model.parameters()) == 25_557_032
    images, labels = next(iter(resnet50.data))
    assert images.shape == (16, 3, 224, 224) and labels.max() < 1000


# -- every family trains, deterministically, and resumes exactly ----------------------------------------


@pytest.mark.parametrize("job_type", SMALLEST)
def test_a_few_steps_train_with_finite_loss_at_the_job_types_batch_size(job_type):
    job = build(job_type)
    workload = entry_for(job_type)
    assert (job.family, job.batch_size) == (workload.family, workload.batch_size)
    assert batch_rows(job.family, next(iter(job.data))) == workload.batch_size
    losses = train(job, 3)
    assert all(math.isfinite(loss) for loss in losses), losses


@pytest.mark.parametrize("job_type", SMALLEST)
def test_the_same_seed_gives_the_same_batches_and_losses(job_type):
    a, b = build(job_type, seed=3), build(job_type, seed=3)
    first_batch = next(iter(a.data))
    assert_same(first_batch, next(iter(b.data)))
    assert train(build(job_type, seed=3), 2) == train(build(job_type, seed=3), 2)
    other_rank = build(job_type, seed=3, data_seed=4)  # a gang's ranks: one model, other samples
    assert_same(other_rank.model.state_dict(), a.model.state_dict())
    with pytest.raises(AssertionError):
        assert_same(first_batch, next(iter(other_rank.data)))


@pytest.mark.parametrize("job_type", SMALLEST)
def test_state_dict_round_trip_resumes_exactly(job_type):
    first = build(job_type)
    batches = iter(first.data)
    for _ in range(2):
        first.train_step(next(batches))
    saved = io.BytesIO()
    torch.save(first.state_dict(), saved)  # as the runner does: plain tensors, loadable weights-only
    saved.seek(0)

    second = build(job_type)
    second.load_state_dict(torch.load(saved, weights_only=True))
    assert_same(second.model.state_dict(), first.model.state_dict())
    for name, optimizer in first.optimizers.items():
        assert_same(second.optimizers[name].state_dict(), optimizer.state_dict())
    assert second.data.index == first.data.index == 2
    assert second.train_step(next(iter(second.data))) == first.train_step(next(batches))


def test_a_checkpoint_of_another_job_type_is_refused():
    lm = build("LM (batch size 5)")
    with pytest.raises(ValueError, match="batch size 5"):
        build("LM (batch size 10)").load_state_dict(lm.state_dict())


# -- local datasets -----------------------------------------------------------------------------------


def write_cifar(directory: Path, images: int) -> None:
    rng = np.random.default_rng(0)
    batch = {b"data": rng.integers(0, 256, (images, 3072), dtype=np.uint8), b"labels": list(rng.integers(0, 10, images))}
    (directory / "cifar-10-batches-py").mkdir()
    (directory / "cifar-10-batches-py" / "data_batch_1").write_bytes(pickle.dumps(batch))


def write_dataset(family: str, directory: Path) -> None:
    rng = np.random.default_rng(1)
    if family == "ResNet-18":
        write_cifar(directory, 40)
    elif family == "ResNet-50":  # channels-last uint8 at 40 x 40: resized to the model's 64 x 64
        np.save(directory / "images.npy", rng.integers(0, 256, (20, 40, 40, 3), dtype=np.uint8))
        np.save(directory / "labels.npy", rng.integers(0, 1000, 20))
    elif family == "Transformer":
        lines = [" ".join(f"w{i}" for i in rng.integers(0, 50, rng.integers(3, 9))) for _ in range(40)]
        (directory / "train.src").write_text("\n".join(lines) + "\n")
        (directory / "train.tgt").write_text("\n".join(" ".join(reversed(line.split())) for line in lines) + "\n")
    elif family == "LM":
        (directory / "train.txt").write_text("\n".join(" ".join(f"w{i}" for i in rng.integers(0, 30, 12)) for _ in range(60)))
    elif family == "Recommendation":
        rows = [f"{u},{i},{r}" for u in range(600) for i, r in zip(rng.integers(0, 300, 8), rng.choice([2.0, 4.5], 8), strict=True)]
        (directory / "ratings.csv").write_text("userId,movieId,rating,timestamp\n" + "\n".join(f"{r},0" for r in rows) + "\n")
    elif family == "CycleGAN":
        np.save(directory / "A.npy", rng.uniform(-1, 1, (3, 3, 32, 32)).astype(np.float32))
        np.save(directory / "B.npy", rng.integers(0, 256, (5, 3, 64, 64), dtype=np.uint8))


@pytest.mark.parametrize("job_type", [t for t in SMALLEST if t != "A3C"])
def test_each_family_trains_on_its_documented_data_dir_format(job_type, tmp_path):
    family = entry_for(job_type).family
    write_dataset(family, tmp_path)
    job = build(job_type, data_dir=tmp_path)
    assert all(math.isfinite(loss) for loss in train(job, 2))


@pytest.mark.parametrize("job_type", SMALLEST)
def test_a_data_dir_without_the_files_is_one_line_naming_them(job_type, tmp_path):
    (tmp_path / "unrelated.bin").write_bytes(b"x")
    with pytest.raises(DataDirError) as caught:
        build(job_type, data_dir=tmp_path)
    message = str(caught.value)
    assert "\n" not in message and entry_for(job_type).family in message
    expected = {"ResNet-18": "data_batch", "ResNet-50": "images.npy", "Transformer": "train.src", "LM": "train.txt",
                "Recommendation": "ratings.csv", "A3C": "no --data-dir", "CycleGAN": "A.npy"}
    assert expected[entry_for(job_type).family] in message


def test_a_dataset_smaller_than_one_batch_is_refused(tmp_path):
    write_cifar(tmp_path, 10)
    with pytest.raises(DataDirError, match="10 images, fewer than one batch of 16"):
        build("ResNet-18 (batch size 16)", data_dir=tmp_path)


def test_real_data_is_read_in_a_seeded_order_and_resumes(tmp_path):
    write_cifar(tmp_path, 64)
    a, b = build("ResNet-18 (batch size 16)", data_dir=tmp_path), build("ResNet-18 (batch size 16)", data_dir=tmp_path)
    assert a.data.batches_per_epoch == 4
    first = [batch for batch in a.data]  # one epoch
    b.data.load_state_dict({"epoch": 0, "index": 2})
    assert_same(list(b.data), first[2:])
    assert not torch.equal(next(iter(a.data))[1], first[0][1])  # the next epoch is reshuffled
