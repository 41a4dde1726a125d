"""A long simulation saved at a point and resumed from the file to its end (Gavel's
--checkpoint_file / --checkpoint_threshold; ``gavel simulate --checkpoint-to FILE`` with
``--checkpoint-at-s T`` or ``--checkpoint-after-jobs N``, then ``--resume FILE``).

The file: a first line naming the format, a JSON line saying what run it is of (the trace's
and the throughput table's digests, the policy, the preset, the cluster, the seed, the window, the mechanism's and the
estimator's settings, the version that wrote it and its source's digest, and where the run was), then the bus-free loop's
whole state (sim/carry.py) as a pickle. Resuming reads the JSON line first and refuses, in one
line naming what differs, a checkpoint of another trace, another run or another version, before
anything is unpickled; the run then goes on from the boundary it was saved at and ends exactly as
the uninterrupted run does (tests/sim/test_checkpoint.py). A pickle runs code when it is read:
resume only checkpoints you wrote.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import pathlib
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from common.errors import CheckpointError
from sim.carry import Carry, CheckpointPlan

if TYPE_CHECKING:
    from common.throughputs import ThroughputTable
    from sim.fastpath import RunConfig
    from sim.traces import TraceJob

MAGIC = b"gavel simulation checkpoint, format 1\n"  # a new format changes this line
# the packages whose objects a checkpoint holds (their source is digested: "code")
STATE_PACKAGES = ("common", "mechanism_service", "policy_service", "estimator_service", "sim")
# What the JSON line says of the run, in the order a difference is reported
RUN_FIELDS = (
    "version", "code", "trace", "table", "policy", "preset", "cluster", "seed", "window", "solver", "settings", "estimation",
    "boundary_lag_s", "fleet_changes",
)


@dataclass(frozen=True, slots=True)
class CheckpointSpec:
    """``gavel simulate``'s checkpoint flags: where to save and when, where to resume from."""

    save_to: pathlib.Path | None = None
    at_s: float | None = None
    after_jobs: int | None = None
    resume_from: pathlib.Path | None = None


def fingerprint(trace: Sequence[TraceJob], config: RunConfig, table: ThroughputTable | None = None) -> dict[str, str]:
    """What a checkpoint must match to be resumed: the same jobs, the same run, the same code, the
    same throughput table (the saved state holds the rates of the jobs admitted so far; a job
    admitted after the resume would take another table's)."""
    def digest(value: object) -> str:
        return hashlib.sha256(repr(value).encode()).hexdigest()[:16]

    return {
        "version": _version(),
        "code": _code_digest(),
        "trace": f"{len(trace)} jobs, sha256 {digest(tuple(trace))}",
        "table": "none" if table is None else "sha256 " + digest(
            (table.accelerator_types, sorted(table.isolated_steps_per_s.items()), sorted(table.pair_steps_per_s.items()))
        ),
        "policy": config.policy,
        "preset": config.settings.preset,
        "cluster": ",".join(f"{w}={n}" for w, n in config.cluster.items()),
        "seed": str(config.seed),
        "window": "all jobs" if config.window is None else f"{config.window[0]}:{config.window[1]}",
        "solver": str(config.solver),
        "settings": digest(config.settings),
        "estimation": digest(config.estimation),
        # what gavel whatif sets to replay a live cluster (a resumed replay must follow the same)
        "boundary_lag_s": repr(config.boundary_lag_s),
        "fleet_changes": "none" if not config.fleet_changes else f"{len(config.fleet_changes)}, sha256 {digest(config.fleet_changes)}",
    }


def write_checkpoint(path: pathlib.Path, carry: Carry, run: dict[str, str]) -> None:
    """Write the file whole or not at all (a temporary file renamed over it)."""
    header = {"run": run, "at_s": carry.now_s, "rounds": len(carry.rounds)}
    try:
        payload = pickle.dumps(carry, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError) as e:  # e.g. a plug-in holding a lock or a lambda
        raise CheckpointError(f"--checkpoint-to {path}: the run's state cannot be saved ({type(e).__name__}: {e})") from None
    partial = path.with_name(path.name + ".partial")
    try:
        with open(partial, "wb") as f:
            f.write(MAGIC + json.dumps(header).encode() + b"\n" + payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
    except OSError as e:  # a read-only directory, a full disk, a directory where the file goes
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        raise CheckpointError(f"--checkpoint-to {path}: cannot write it: {e.strerror or e}") from None


def read_checkpoint(path: pathlib.Path, run: dict[str, str]) -> Carry:
    """The state saved in ``path``, once its JSON line says it is of this run (CheckpointError in
    one line otherwise, naming the file and what differs)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"--resume {path}: cannot read it: {e.strerror or e}") from None
    if not data.startswith(MAGIC):
        raise CheckpointError(f"--resume {path}: not a checkpoint of gavel simulate (or of another format)")
    header_line, _, payload = data[len(MAGIC):].partition(b"\n")
    try:
        saved = json.loads(header_line)["run"]
    except (ValueError, KeyError, TypeError):
        raise CheckpointError(f"--resume {path}: its header is damaged") from None
    for name in RUN_FIELDS:
        if saved.get(name) != run[name]:
            raise CheckpointError(
                f"--resume {path}: a checkpoint of {_what(name)} {saved.get(name)!r}, not {run[name]!r}: it resumes only "
                "the run that wrote it (same trace, flags and version)"
            )
    try:
        carry = pickle.loads(payload)  # the user's own file, checked against this run first
    except Exception as e:  # noqa: BLE001 - a truncated or foreign pickle fails in many ways
        raise CheckpointError(f"--resume {path}: its state cannot be read ({type(e).__name__}: {e})") from None
    if not isinstance(carry, Carry):
        raise CheckpointError(f"--resume {path}: its state is not a simulation's")
    return carry


def hooks(
    spec: CheckpointSpec | None, trace: Sequence[TraceJob], config: RunConfig, table: ThroughputTable | None = None
) -> dict[str, object]:
    """The keyword arguments of sim.fastpath.simulate that save and resume as ``spec`` says."""
    if spec is None:
        return {}
    run = fingerprint(trace, config, table)
    out: dict[str, object] = {}
    if spec.resume_from is not None:
        out["resume"] = read_checkpoint(spec.resume_from, run)
    if spec.save_to is not None:
        if spec.after_jobs is not None and spec.after_jobs > len(trace):
            raise CheckpointError(
                f"--checkpoint-after-jobs {spec.after_jobs}: the trace has {len(trace)} jobs, so the run would never be saved"
            )
        save_to = spec.save_to
        out["checkpoint"] = CheckpointPlan(
            save=lambda carry: write_checkpoint(save_to, carry, run),
            at_s=float("inf") if spec.at_s is None else spec.at_s,
            after_jobs=spec.after_jobs,
        )
    return out


def _what(name: str) -> str:
    return {"version": "gavel version", "code": "other code: the source's digest", "trace": "another trace:", "settings": "mechanism settings",
            "estimation": "estimator settings", "table": "another throughput table:",
            "boundary_lag_s": "boundary lag (s)", "fleet_changes": "fleet changes:"}.get(name, name)


@functools.cache
def _code_digest() -> str:
    """A digest of the source of the packages a run's state is made of: the package version alone
    stays the same across the commits of a checkout, whose objects may pickle differently."""
    root = pathlib.Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for package in STATE_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _version() -> str:
    try:
        return version("gavel-scheduler")
    except PackageNotFoundError:  # a source tree never installed
        return "unknown"
