"""--policy-param k=v (libCacheSim's -e), checked against the constructor, and --policy module:Class,
a user's policy loaded from a module beside the trace, in replay and in sweep workers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from radixkv import PrefixCache, policies
from radixkv.analysis.replay import replay
from radixkv.workload.sources import open_trace

from ..shared_traces import conversation_head
from .test_tool_cli import fails, ok

MRU = '''
from radixkv.policies import EvictionPolicy


class MRU(EvictionPolicy):
    name = "mru"

    def __init__(self, spare: int = 0) -> None:
        if spare < 0:
            raise ValueError(f"spare must be >= 0, got {spare!r}")
        self.spare = spare

    def priority(self, node):
        return -node.policy_state
'''


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    return conversation_head(tmp_path_factory.mktemp("traces"), 300)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "mypolicies.py").write_text(MRU)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_policy_param_reaches_the_constructor_and_the_numbers(conv):
    out = json.loads(ok("replay", conv, "--num-blocks", "2k", "--policy", "s3fifo", "--policy-param",
                        "small_fraction=0.5", "--json", "--quiet"))
    expected = replay(open_trace(conv), PrefixCache(2000, 16, policies.S3FIFO(small_fraction=0.5)))
    assert out["policy_params"] == {"small_fraction": 0.5} and out["hit_tokens"] == expected.hit_tokens
    rows = [json.loads(line) for line in ok("sweep", conv, "--policies", "lru,s3fifo", "--capacities", "2k",
                                            "--policy-param", "small_fraction=0.5", "--json", "--quiet").splitlines()]
    assert [r.get("policy_params") for r in rows] == [None, {"small_fraction": 0.5}]
    assert rows[1]["hit_tokens"] == expected.hit_tokens


@pytest.mark.parametrize("args, message", [
    (["--policy", "s3fifo", "--policy-param", "foo=1"], "takes 'foo' (they take s3fifo: small_fraction, "
                                                         "move_threshold)"),
    (["--policy", "s3fifo", "--policy-param", "small_fraction=2"], "small_fraction must be in (0, 1), got 2"),
    (["--policy", "s3fifo", "--policy-param", "small_fraction"], "--policy-param must be KEY=VALUE"),
    (["--policy", "lru", "--policy-param", "x=1"], "(they take lru: none)"),
    (["--policy", "nosuchmodule:X"], "cannot import 'nosuchmodule'"),
    (["--policy", "json:dumps"], "must be an EvictionPolicy subclass"),
])
def test_bad_policy_knobs_are_one_line(conv, args, message):
    fails("replay", conv, "--num-blocks", "2k", *args, message=message)


def test_a_users_policy_class_runs_in_replay(conv, user_module):
    out = json.loads(ok("replay", conv, "--num-blocks", "2k", "--policy", "mypolicies:MRU", "--policy-param",
                        "spare=1", "--json", "--quiet"))
    assert out["policy"] == "mru" and out["policy_params"] == {"spare": 1} and out["requests"] == 300
    fails("replay", conv, "--num-blocks", "2k", "--policy", "mypolicies:MRU", "--policy-param", "spare=-1",
          message="spare must be >= 0")


def test_a_users_policy_class_runs_in_sweep_workers_from_the_current_directory(conv, tmp_path):
    (tmp_path / "mypolicies.py").write_text(MRU)
    proc = subprocess.run([sys.executable, "-m", "radixkv", "sweep", conv, "--policies", "fifo,mypolicies:MRU",
                           "--capacities", "1k,3k", "--jobs", "2", "--json", "--quiet"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["policy"] for r in rows] == ["fifo", "fifo", "mru", "mru"]


def test_policy_param_reaches_every_instance_of_a_cluster(tmp_path):
    """``cluster --policy-param``: each instance builds its own policy with the argument, and the result is
    the library's ``Cluster(policy=PolicySpec(...))``, not the default's."""
    from radixkv.cluster import Cluster
    from radixkv.workload.generators import generate, write_token_jsonl

    path = tmp_path / "mix.jsonl"
    requests = list(generate("mix", 0, 600))
    write_token_jsonl(requests, str(path))
    args = ("cluster", path, "--instances", "2", "--num-blocks", "300", "--policy", "s3fifo", "--json", "--quiet")
    got = json.loads(ok(*args, "--policy-param", "small_fraction=0.9"))
    spec = policies.PolicySpec("s3fifo", (("small_fraction", 0.9),))
    want = Cluster(2, 300, 16, spec).replay(requests)
    assert got["policy_params"] == {"small_fraction": 0.9} and got["hit_tokens"] == want.hit_tokens
    assert want.hit_tokens != Cluster(2, 300, 16, "s3fifo").replay(requests).hit_tokens  # the argument matters here
    assert "policy_params" not in json.loads(ok(*args))
    fails("cluster", path, "--num-blocks", "300", "--policy", "lru", "--policy-param", "x=1", message="lru: none")
