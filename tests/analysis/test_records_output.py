"""A run that fails leaves its output files as they were: ``replay --records``, ``cluster --records``
and ``sweep -o`` write through one helper that replaces FILE only on success (review issue 29,
item 7: a replay stopped by a bad trace line had already put a partial records file in place)."""

from __future__ import annotations

import json

import pytest

from radixkv.workload.generators import generate, write_token_jsonl

from .test_tool_cli import fails, ok

OLD = '{"old": "records"}\n'
REQUESTS = 12


@pytest.fixture()
def traces(tmp_path):
    """(good, bad): a token trace, and the same with a malformed line after its requests."""
    good = tmp_path / "traces" / "good.jsonl"
    good.parent.mkdir()
    write_token_jsonl(generate("multi_turn", 0, REQUESTS), good)
    bad = good.with_name("bad.jsonl")
    bad.write_text(good.read_text() + "{not json\n")
    return good, bad


@pytest.fixture()
def old_file(tmp_path):
    path = tmp_path / "out" / "records.jsonl"
    path.parent.mkdir()
    path.write_text(OLD)
    return path


def untouched(path):
    assert path.read_text() == OLD
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary file left


@pytest.mark.parametrize("command", [["replay"], ["cluster", "--instances", 2]])
def test_a_run_stopped_by_a_bad_line_leaves_the_records_file_as_it_was(traces, old_file, command):
    name, *rest = command
    fails(name, traces[1], *rest, "--num-blocks", 50, "--records", old_file, "--quiet", message=":13:")
    untouched(old_file)


@pytest.mark.parametrize("command", [["replay"], ["cluster", "--instances", 2]])
def test_a_run_that_succeeds_replaces_the_records_file(traces, old_file, command):
    name, *rest = command
    ok(name, traces[0], *rest, "--num-blocks", 50, "--records", old_file, "--quiet")
    records = [json.loads(line) for line in old_file.read_text().splitlines()]
    assert [r["index"] for r in records] == list(range(REQUESTS))
    assert sorted(p.name for p in old_file.parent.iterdir()) == [old_file.name]


def test_sweep_output_is_left_alone_the_same_way(traces, old_file):
    fails("sweep", traces[1], "--capacities", "50,100", "-o", old_file, "--quiet", message=":13:")
    untouched(old_file)
    ok("sweep", traces[0], "--capacities", "50,100", "-o", old_file, "--quiet")
    assert len(old_file.read_text().splitlines()) == 2


def test_records_to_a_device_are_written_in_place(traces):
    ok("replay", traces[0], "--num-blocks", 50, "--records", "/dev/null", "--quiet")
