"""new_state: workers numbered as Gavel registers them (docs/gavel-semantics.md section 1.4); the
state's job table and its index by job id."""

from __future__ import annotations

import copy
import pickle
import random

import pytest

from mechanism_service.core.model import JobState, JobTable, MechanismState, new_state


def test_one_gpu_per_server_numbers_types_in_sorted_name_order_with_consecutive_ids():
    s = new_state({"v100": 2, "k80": 4, "p100": 3})

    assert s == MechanismState(
        gpus={"k80": 4, "p100": 3, "v100": 2},
        servers={"k80": [[0], [1], [2], [3]], "p100": [[4], [5], [6]], "v100": [[7], [8]]},
        type_time_s={"k80": 0.0, "p100": 0.0, "v100": 0.0},
        next_worker_id=9,
    )
    assert s.accelerator_types == ("k80", "p100", "v100")  # registration order, not the caller's


def test_four_gpus_per_server_fill_each_server_before_the_next():
    s = new_state({"v100": 4, "k80": 8}, gpus_per_server=4)

    assert s == MechanismState(
        gpus={"k80": 8, "v100": 4},
        servers={"k80": [[0, 1, 2, 3], [4, 5, 6, 7]], "v100": [[8, 9, 10, 11]]},
        type_time_s={"k80": 0.0, "v100": 0.0},
        next_worker_id=12,
    )
    assert s.accelerator_types == ("k80", "v100")


def test_a_count_that_does_not_fill_whole_servers_is_refused():
    with pytest.raises(ValueError, match=r"^p100: 6 GPUs do not fill servers of 4$"):
        new_state({"k80": 4, "p100": 6}, gpus_per_server=4)


def _job(index: int, job_id: str) -> JobState:
    return JobState(
        index=index, job_id=job_id, job_type="ResNet-18 (batch size 64)", scale_factor=1, priority_weight=1.0,
        total_steps=100, arrival_s=0.0, slo_s=None, entity=None, gpu_seconds_by_type={},
    )


def test_the_job_table_keeps_its_index_by_job_id_through_adds_removals_and_copies():
    rng = random.Random(7)
    table = MechanismState(gpus={}, servers={}).jobs
    assert isinstance(table, JobTable)
    mirror: dict[int, JobState] = {}
    for index in range(300):
        if mirror and rng.random() < 0.4:
            gone = rng.choice(list(mirror))
            assert table.pop(gone) is mirror.pop(gone)
        elif mirror and rng.random() < 0.1:
            gone = rng.choice(list(mirror))
            del table[gone], mirror[gone]
        else:
            table[index] = mirror[index] = _job(index, f"job-{index}")
        assert table.index_of == {job.job_id: i for i, job in mirror.items()}
        assert list(table) == list(mirror)
    for copied in (copy.deepcopy(table), pickle.loads(pickle.dumps(table)), table.copy()):
        assert type(copied) is JobTable
        assert copied.index_of == table.index_of and list(copied) == list(table)
    assert table.pop(10**6, None) is None
    with pytest.raises(KeyError):
        table.pop(10**6)


def test_the_job_table_refuses_the_bulk_changes_that_would_leave_its_index_behind():
    table = JobTable({0: _job(0, "a")})
    for change in (lambda: table.update({1: _job(1, "b")}), lambda: table.setdefault(1, _job(1, "b")),
                   table.popitem, table.clear):
        with pytest.raises(TypeError, match="one at a time"):
            change()
    assert table.index_of == {"a": 0} and list(table) == [0]


def test_a_state_given_or_loaded_with_a_plain_dict_of_jobs_gets_a_job_table():
    jobs = {3: _job(3, "x"), 5: _job(5, "y")}
    given = MechanismState(gpus={"k80": 1}, servers={"k80": [[0]]}, jobs=jobs)
    assert type(given.jobs) is JobTable and given.jobs.index_of == {"x": 3, "y": 5}
    loaded = pickle.loads(pickle.dumps(given))
    assert type(loaded.jobs) is JobTable and loaded.jobs.index_of == {"x": 3, "y": 5}
    # a snapshot of before the table held the jobs as a plain dict
    old_form = MechanismState.__new__(MechanismState)
    old_form.__setstate__((None, {**given.__getstate__()[1], "jobs": dict(jobs)}))
    assert type(old_form.jobs) is JobTable and old_form.jobs.index_of == {"x": 3, "y": 5}
