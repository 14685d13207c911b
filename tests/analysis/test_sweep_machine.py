"""Sweeps that use the machine: capacities from the working set, one process per CPU by default, LRU
rows from the one-pass curve (a replay's numbers), and a progress bar weighted by expected cost."""

from __future__ import annotations

import json

import pytest

import radixkv.analysis.sweep as sweep
from radixkv.analysis.sweep import (CURVE_COST, RELATIVE_COST, SweepJob, lru_rows, plan_tasks, run_job, run_sweep,
                                    sweep_cost)
from radixkv.cli import available_cpus

from ..shared_traces import conversation_head
from .test_tool_cli import ok


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    return conversation_head(tmp_path_factory.mktemp("traces"), 800)


def without_wall(row):
    return {k: v for k, v in row.items() if k not in ("wall_seconds", "source")}


@pytest.mark.parametrize("page_size, capacities", [(16, [1, 40, 700, 5000, 80_000]), (512, [1, 3, 30, 300])])
def test_lru_rows_from_the_curve_are_a_replays(conv, page_size, capacities):
    """Every field but the wall time, miss reasons and prefill estimates included; the small capacities
    are below the longest request, where a request caches only its first pages."""
    jobs = [SweepJob(conv, "lru", c, page_size=page_size) for c in capacities]
    for job, row in zip(jobs, lru_rows(jobs)):
        assert row["source"] == "curve"
        assert without_wall(row) == without_wall(run_job(job)), job.num_blocks


def test_lru_rows_of_a_generated_trace_with_timestamps(tmp_path):
    path = tmp_path / "mix.jsonl"
    ok("gen", "mix", "--num-requests", "300", "-o", path)
    jobs = [SweepJob(str(path), "lru", c, page_size=4) for c in (3, 50, 4000)]
    for job, row in zip(jobs, lru_rows(jobs)):
        assert without_wall(row) == without_wall(run_job(job))


def test_a_trace_with_namespaces_replays_its_lru_rows(tmp_path):
    path = tmp_path / "ns.jsonl"
    path.write_text("".join(json.dumps({"tokens": list(range(i % 3, 40)), "namespace": f"t{i % 2}"}) + "\n"
                            for i in range(30)))
    jobs = [SweepJob(str(path), "lru", c, page_size=4) for c in (2, 5, 9)]
    rows = run_sweep(jobs)
    assert all("source" not in row for row in rows)
    assert [without_wall(r) for r in rows] == [without_wall(run_job(j)) for j in jobs]


def test_tasks_run_longest_first_and_the_bar_adds_up(conv):
    jobs = [SweepJob(conv, p, c) for p in ("lru", "s3fifo", "belady") for c in (100, 1000, 5000)]
    tasks = plan_tasks(jobs)
    assert tasks[0] in {(6,), (7,), (8,)} and tasks[3] == (0, 1, 2)  # Belady, then the LRU curve
    assert sweep_cost(jobs) == pytest.approx(3 * RELATIVE_COST["belady"] + CURVE_COST + 3)
    costs = []
    rows = run_sweep(jobs, on_done=lambda row, cost: costs.append(cost))
    assert sum(costs) == pytest.approx(sweep_cost(jobs)) and len(costs) == len(jobs)
    assert [(r["policy"], r["num_blocks"]) for r in rows] == [(j.policy, j.num_blocks) for j in jobs]
    two = [SweepJob(conv, "lru", c) for c in (100, 1000)]  # two replays cost less than the pass
    assert plan_tasks(two) == [(0,), (1,)]


def test_sweep_capacities_auto_and_jobs_default(conv, monkeypatch):
    seen = {}
    real = sweep.run_sweep

    def spy(jobs, processes=1, **kwargs):
        seen["processes"] = processes
        return real(jobs, processes, **kwargs)

    monkeypatch.setattr(sweep, "run_sweep", spy)
    rows = [json.loads(line) for line in ok("sweep", conv, "--policies", "lru,fifo", "--json", "--quiet")
            .splitlines()]
    curve = json.loads(ok("curve", conv, "--json", "--quiet", "--capacities", "1%,2%,5%,10%,25%,50%,100%"))
    assert [r["num_blocks"] for r in rows if r["policy"] == "lru"] == curve["capacities"]
    assert [r["hit_tokens"] for r in rows if r["policy"] == "lru"] == curve["hit_tokens"]
    assert seen["processes"] == available_cpus() >= 1
