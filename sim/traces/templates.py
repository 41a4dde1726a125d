"""The job catalog a generated trace draws from: what a worker would run for each job type.

Data, not logic. The strings are Gavel's job table as its reference traces carry it
(../shared/data/gavel-reference/*.trace; figures and strings only, MIT licence, see
data/gavel/README.md). ``%s`` in a command is the run directory (and the data directory when
``needs_data_dir``), filled in by whoever launches the job.

The order is Gavel's job table order. It matters: a job type is drawn as an index into this
tuple, so the order is part of what makes ``TraceStreams.gavel(seed)`` reproduce Gavel's traces.
Which job types may run on several GPUs is not recorded here: the throughput table decides (a
type is offered with scale factor s when the table has a throughput for it with s).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class JobTemplate:
    job_type: str  # "Model (batch size N)", the key of the throughput table
    command: str
    working_directory: str
    num_steps_arg: str  # the flag that sets how many steps the job runs
    needs_data_dir: bool


def _resnet18(batch_size: int) -> JobTemplate:
    return JobTemplate(
        f"ResNet-18 (batch size {batch_size})",
        f"python3 main.py --data_dir=%s/cifar10 --batch_size {batch_size}",
        "image_classification/cifar10",
        "--num_steps",
        True,
    )


def _resnet50(batch_size: int) -> JobTemplate:
    return JobTemplate(
        f"ResNet-50 (batch size {batch_size})",
        f"python3 main.py -j 8 -a resnet50 -b {batch_size} %s/imagenet/",
        "image_classification/imagenet",
        "--num_minibatches",
        True,
    )


def _transformer(batch_size: int) -> JobTemplate:
    return JobTemplate(
        f"Transformer (batch size {batch_size})",
        f"python3 train.py -data %s/translation/multi30k.atok.low.pt -batch_size {batch_size} -proj_share_weight",
        "translation",
        "-step",
        True,
    )


def _lm(batch_size: int) -> JobTemplate:
    return JobTemplate(
        f"LM (batch size {batch_size})",
        f"python main.py --cuda --data %s/wikitext2 --batch_size {batch_size}",
        "language_modeling",
        "--steps",
        True,
    )


def _recommendation(batch_size: int) -> JobTemplate:
    return JobTemplate(
        f"Recommendation (batch size {batch_size})",
        f"python3 train.py --data_dir %s/ml-20m/pro_sg/ --batch_size {batch_size}",
        "recommendation",
        "-n",
        True,
    )


JOB_TEMPLATES: tuple[JobTemplate, ...] = (
    *(_resnet18(b) for b in (16, 32, 64, 128, 256)),
    *(_resnet50(b) for b in (16, 32, 64, 128)),
    *(_transformer(b) for b in (16, 32, 64, 128, 256)),
    *(_lm(b) for b in (5, 10, 20, 40, 80)),
    *(_recommendation(b) for b in (512, 1024, 2048, 4096, 8192)),
    JobTemplate("A3C", "python3 main.py --env PongDeterministic-v4 --workers 4 --amsgrad True", "rl", "--max-steps", False),
    JobTemplate("CycleGAN", "python3 cyclegan.py --dataset_path %s/monet2photo --decay_epoch 0", "cyclegan", "--n_steps", True),
)

TEMPLATES_BY_TYPE: Mapping[str, JobTemplate] = MappingProxyType({t.job_type: t for t in JOB_TEMPLATES})
