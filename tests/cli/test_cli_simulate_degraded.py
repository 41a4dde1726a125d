"""`gavel simulate` with a policy plug-in whose solves fail to the end: the run goes on, as the
mechanism does, on the allocation kept in force (jobs it leaves out run on the GPUs it leaves
idle), so the figures it prints are that fallback's; one line on stderr says so, naming the policy
and what it raised, on either engine. A policy that answers says nothing more. About 5 s."""

from __future__ import annotations

import pytest

from services.cli import main

ALWAYS_RAISES = '''
class AlwaysRaises:
    name = "always_raises"

    def allocate(self, problem):
        raise RuntimeError("the solver's licence expired")
'''

RUN = ["simulate", "--jobs", "6", "--jobs-per-hour", "4", "--cluster", "1:1:1", "--no-plots"]


@pytest.mark.parametrize("engine", ["fast", "services"])
def test_a_run_that_ended_degraded_says_so(engine, tmp_path, capsys, monkeypatch):
    (tmp_path / "simdeg_broken.py").write_text(ALWAYS_RAISES)
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main([*RUN, "--engine", engine, "--policies", "fifo,simdeg_broken:AlwaysRaises", "--out", str(tmp_path / "out")])
    assert code == 0  # the runs ended: the figures are written
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if line.startswith("gavel: note:")]
    assert notes == [(
        "gavel: note: simdeg_broken:AlwaysRaises: its last solve failed (policy plug-in 'simdeg_broken:AlwaysRaises': "
        "allocate raised RuntimeError: the solver's licence expired); the run ended on the allocation kept in force, "
        "so its figures are not the policy's alone (simulation.log: allocation_degraded)"
    )]
