"""`gavel job-types` as a user runs it: the table's job types with their scale factors and
steps/s, as a table and as JSON; a bad --throughputs or --scale-factor is one line and exit 2."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from common.throughputs import parse_job_key

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHIPPED = json.loads((ROOT / "common" / "data" / "simulation_throughputs.json").read_text())


def gavel(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAVEL_")}
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60
    )


def expected_json(raw: dict, scale_factor: int | None = None) -> dict[str, dict]:
    """What --json must print, by job type, read straight from Gavel's format: job type -> scale
    factor -> accelerator type -> the "null" (isolated) entry, None where a type lacks the key."""
    steps: dict[str, dict[int, dict[str, float]]] = {}
    for accelerator_type, jobs in raw.items():
        for key, entries in jobs.items():
            job_type, sf = parse_job_key(key)
            steps.setdefault(job_type, {}).setdefault(sf, {})[accelerator_type] = entries["null"]
    return {
        job_type: {
            "job_type": job_type,
            "scale_factors": sorted(steps[job_type]),
            "throughputs_steps_per_s": {
                str(sf): {w: steps[job_type][sf].get(w) for w in raw}
                for sf in sorted(steps[job_type])
                if scale_factor in (None, sf)
            },
        }
        for job_type in steps
    }


def by_name(listed: list[dict]) -> dict[str, dict]:
    return {record["job_type"]: record for record in listed}


def test_json_lists_every_job_type_of_the_shipped_table_in_name_order():
    out = gavel("job-types", "--json")
    assert out.returncode == 0, out.stderr
    listed = json.loads(out.stdout)
    assert by_name(listed) == expected_json(SHIPPED) and len(listed) == len(expected_json(SHIPPED))
    names = [record["job_type"] for record in listed]
    # Sorted by name, numbers by value.
    assert names[:4] == ["A3C", "CycleGAN", "LM (batch size 5)", "LM (batch size 10)"]
    resnet_18 = [f"ResNet-18 (batch size {n})" for n in (16, 32, 64, 128, 256)]
    assert [n for n in names if n.startswith("ResNet-18")] == resnet_18
    assert names[-1] == "Transformer (batch size 256)"


ACCELERATORS = [w for w in SHIPPED if not w.endswith("_unconsolidated")]
SPREAD = [w for w in SHIPPED if w.endswith("_unconsolidated")]


def test_the_table_has_a_row_per_job_type_with_its_scale_factors_and_steps_per_s():
    out = gavel("job-types")
    assert out.returncode == 0, out.stderr
    caption, hidden, header, rule, *rows = out.stdout.splitlines()
    assert "1 GPU" in caption
    # Gavel's pseudo-types are left out by default, and the caption says so and what they are.
    assert SPREAD and hidden.startswith(f"not shown: the {len(SPREAD)} *_unconsolidated columns of the table (steps/s")
    assert "spread over several servers" in hidden and "--unconsolidated shows them" in hidden
    assert header.split() == ["job", "type", "scale", "factors", *ACCELERATORS]
    assert set(rule) == {"-", " "}
    assert len(rows) == len(expected_json(SHIPPED))
    (resnet,) = [row for row in rows if row.startswith("ResNet-50 (batch size 64) ")]
    key = "('ResNet-50 (batch size 64)', 1)"
    assert resnet.split()[4:] == ["1,2,4,8", *(f"{SHIPPED[w][key]['null']:.4g}" for w in ACCELERATORS)]


def test_unconsolidated_shows_gavels_spread_gang_columns_and_says_what_they_are():
    out = gavel("job-types", "--unconsolidated", "--scale-factor", "4")
    assert out.returncode == 0, out.stderr
    caption, what, header, _, *rows = out.stdout.splitlines()
    assert "4 GPUs" in caption
    assert what.startswith("*_unconsolidated: steps/s with the gang's GPUs spread over several servers")
    assert header.split()[4:] == list(SHIPPED)
    (lm,) = [row for row in rows if row.startswith("LM (batch size 5) ")]
    key = "('LM (batch size 5)', 4)"
    assert lm.split()[5:] == [f"{SHIPPED[w][key]['null']:.4g}" for w in SHIPPED]


def test_a_scale_factor_shows_that_gang_and_a_dash_where_there_is_none(tmp_path):
    table = {
        "v100": {
            "('Big (batch size 8)', 1)": {"null": 2.0},
            "('Big (batch size 8)', 2)": {"null": 3.5},
            "('Small', 1)": {"null": 9.0},
        },
        "k80": {"('Big (batch size 8)', 1)": {"null": 0.0}, "('Small', 1)": {"null": 1.25}},
    }
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))

    out = gavel("job-types", "--throughputs", str(path), "--scale-factor", "2")
    assert out.returncode == 0, out.stderr
    caption, header, _, *rows = out.stdout.splitlines()
    assert "2 GPUs" in caption and header.split()[-2:] == ["v100", "k80"]
    assert [row.split() for row in rows] == [["Big", "(batch", "size", "8)", "1,2", "3.5", "-"], ["Small", "1", "-", "-"]]

    out = gavel("job-types", "--throughputs", str(path))
    assert [row.split()[-2:] for row in out.stdout.splitlines()[3:]] == [["2", "0"], ["9", "1.25"]]

    out = gavel("job-types", "--throughputs", str(path), "--json", "--scale-factor", "2")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [
        {"job_type": "Big (batch size 8)", "scale_factors": [1, 2], "throughputs_steps_per_s": {"2": {"v100": 3.5, "k80": None}}},
        {"job_type": "Small", "scale_factors": [1], "throughputs_steps_per_s": {}},
    ]
    assert by_name(json.loads(gavel("job-types", "--throughputs", str(path), "--json").stdout)) == expected_json(table)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--throughputs", "no/such/table.json"], "gavel: --throughputs: cannot read no/such/table.json: No such file or directory"),
        (["--scale-factor", "3"], "gavel: --scale-factor: no job type has a throughput on 3 GPUs (scale factors in the table: 1, 2, 4, 8)"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    out = gavel("job-types", *args)
    assert (out.returncode, out.stdout, out.stderr.splitlines()) == (2, "", [message])


def test_a_table_that_is_not_a_throughput_table_is_one_line_naming_the_flag(tmp_path):
    for text, reason in (("{", "is not JSON"), ('{"v100": 3}', "v100: expected an object of job keys")):
        path = tmp_path / "table.json"
        path.write_text(text)
        out = gavel("job-types", "--throughputs", str(path))
        assert out.returncode == 2
        (line,) = out.stderr.splitlines()
        assert line.startswith(f"gavel: --throughputs: {path}") and reason in line


def test_the_command_loads_neither_the_solver_nor_the_plotting_stack():
    code = (
        "import sys; from services.cli import main; code = main(['job-types', '--json']); "
        "sys.stderr.write(repr([m for m in ('cvxpy', 'matplotlib', 'policy_service', 'sim') if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0 and json.loads(out.stdout)
    assert out.stderr == "[]"
