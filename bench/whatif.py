"""What-if replay (`gavel whatif`, sim/whatif): how faithful and how fast, on a journal of a run.

The "real run" is the real services (mechanism, policy service, simulated fleet) on the
in-memory bus in virtual time, the mechanism journaling as a live one does, on a generated
continuous trace (Gavel's job mix). Then the journal is read back and replayed:

- fidelity: the replay under the policy that ran, its average JCT over the real run's (the
  baseline), and how many jobs' JCTs differ from the real run's by more than a microsecond;
- cost: reading the journal, building the replay's input, and each replay, in wall seconds,
  against the real run's own wall time (the baseline: the services simulation that wrote it);
- the candidates' average JCT over the real run's, as `gavel whatif` prints them.

Usage: python bench/whatif.py [--jobs 200] [--jobs-per-hour 6] [--cluster 4:4:4]
                              [--policy max_min_fairness_perf] [--candidates fifo,max_min_fairness]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.journal import Journal
from policy_service.service import shipped_context
from sim.driver import simulate_services
from sim.scenario import Scenario, generated_trace, parse_cluster
from sim.whatif.compare import REAL, run_figures
from sim.whatif.history import read_history
from sim.whatif.real import shifted
from sim.whatif.replay import setup
from sim.whatif.runs import replay


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--jobs-per-hour", type=float, default=6.0)
    p.add_argument("--cluster", default="4:4:4")
    p.add_argument("--preset", default="default")
    p.add_argument("--policy", default="max_min_fairness_perf")
    p.add_argument("--candidates", default="fifo,max_min_fairness")
    args = p.parse_args()
    context = shipped_context()
    assert context.table is not None
    cluster = parse_cluster(args.cluster, context.table)
    trace = generated_trace(args.jobs, args.jobs_per_hour, False, 0, context.table)
    scenario = Scenario(trace=trace, cluster=cluster, preset=args.preset)
    with tempfile.TemporaryDirectory(prefix="bench-whatif") as tmp:
        path = Path(tmp) / "mechanism.sqlite"
        journal = Journal(path)
        started = time.perf_counter()
        real = asyncio.run(simulate_services(trace, scenario.config(args.policy), context, journal=journal))
        real_wall_s = time.perf_counter() - started
        journal.close()
        events = sqlite3.connect(path).execute("SELECT COUNT(*) FROM events").fetchone()[0]

        started = time.perf_counter()
        history = read_history(str(path))
        read_s = time.perf_counter() - started
        started = time.perf_counter()
        s = setup(history, context.table)
        setup_s = time.perf_counter() - started
        prices = context.prices_per_hour or {}
        real_figures = run_figures(REAL, shifted(s.real, s.origin_s), s.table, prices)
        print(f"real run: {args.jobs} jobs, {args.jobs_per_hour:g} jobs/h, {args.cluster}, {args.policy}, preset {args.preset}")
        print(f"  the services simulation that wrote the journal: {real_wall_s:.2f} s wall, {events:,} journal events")
        print(f"  read the journal: {read_s:.2f} s ({read_s / real_wall_s:.2f}x the run)")
        print(f"  the replay's input: {setup_s:.2f} s; cells {s.cells.measured} measured, {s.cells.assumed} assumed")
        print(f"  real average JCT: {real_figures.avg_jct_s / 3600:.3f} h")
        for policy in [args.policy, *args.candidates.split(",")]:
            started = time.perf_counter()
            result = replay(s, policy, prices)
            replay_s = time.perf_counter() - started
            figures = run_figures(policy, result, s.table, prices, real_figures.avg_jct_s)
            line = f"  replay {policy}: {replay_s:.2f} s ({replay_s / real_wall_s:.2f}x the run); avg JCT {figures.avg_jct_s / 3600:.3f} h, {figures.avg_jct_vs_real:.4f}x real"
            if policy == args.policy:
                jct = {j.job_id: j.jct_s for j in real.jobs}
                off = sum(abs((j.jct_s or 0.0) - (jct.get(j.job_id) or 0.0)) > 1e-6 for j in result.jobs)
                line += f"; {off} job(s) with another JCT than the real run's"
            print(line)


if __name__ == "__main__":
    main()
