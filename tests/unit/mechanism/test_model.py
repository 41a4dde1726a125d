"""new_state: workers numbered as Gavel registers them (docs/gavel-semantics.md section 1.4)."""

from __future__ import annotations

import pytest

from mechanism_service.core.model import MechanismState, new_state


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
