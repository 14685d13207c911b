"""The attack simulator (radixkv.analysis.attack, `radixkv attack`) and the issue's done-when
relations between sharing rules, at a small size."""

from __future__ import annotations

import json

import pytest

from radixkv.analysis.attack import attack
from radixkv.errors import ArgumentValueError, TraceFormatError
from radixkv.workload.generators import ATTACKER, generate, write_token_jsonl
from radixkv.workload.sources import open_trace

from .test_cluster_cli import ok

REQUESTS = 400
KEYS = {"sharing", "probes", "private_pages", "recovered_private_pages", "honest_hit_tokens",
        "honest_prompt_tokens", "precision"}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_k_anonymity_stops_the_attack_and_keeps_the_public_hits(seed):
    trace = list(generate("multitenant", seed, REQUESTS))
    runs = {mode: attack(trace, sharing=mode) for mode in ("shared", "isolated", "k-anonymous", "adaptive")}
    shared, isolated, kanon, adaptive = (runs[m] for m in ("shared", "isolated", "k-anonymous", "adaptive"))
    assert shared.private_pages > 0 and shared.recovered_private_pages > 0  # the attack works on a shared cache
    assert isolated.recovered_private_pages == 0 and kanon.recovered_private_pages == 0
    assert kanon.honest_hit_tokens >= 0.9 * shared.honest_hit_tokens
    assert isolated.honest_hit_tokens < kanon.honest_hit_tokens
    assert adaptive.recovered_private_pages < shared.recovered_private_pages
    assert kanon.honest_hit_tokens <= adaptive.honest_hit_tokens <= shared.honest_hit_tokens
    assert shared.precision == kanon.precision == 1.0 and isolated.precision is None  # hits never lie
    assert len({r.honest_prompt_tokens for r in runs.values()}) == 1


def test_a_large_k_refuses_what_a_small_k_serves():
    trace = list(generate("multitenant", 1, REQUESTS))
    small, large = attack(trace, sharing="k-anonymous", k=1), attack(trace, sharing="k-anonymous", k=8)
    assert small.k == 1 and large.k == 8
    assert small.honest_hit_tokens > large.honest_hit_tokens
    # k=1: one other tenant suffices, so a single victim's private pages leak
    assert small.recovered_private_pages > 0 and large.recovered_private_pages == 0


def test_the_generator_is_seeded_and_names_its_tenants():
    a, b = list(generate("multitenant", 7, 200)), list(generate("multitenant", 7, 200))
    assert [r.tokens.tolist() for r in a] == [r.tokens.tolist() for r in b]
    assert [r.tenant for r in a] == [r.tenant for r in b]
    tenants = {r.tenant for r in a}
    assert ATTACKER in tenants and all(t == ATTACKER or t.startswith("t") for t in tenants)
    probes = [r for r in a if r.tenant == ATTACKER]
    assert probes and all(len(r.tokens) % 16 == 0 for r in probes)
    with pytest.raises(ArgumentValueError, match="private_share"):
        generate("multitenant", 1, 10, private_share=0.8, doc_share=0.5)


def test_cli_attack_ends_with_json_and_fits_the_width(tmp_path):
    out = ok("attack", "--seed", 2, "--num-requests", REQUESTS, "--sharing", "k-anonymous", "--k", 2)
    lines = out.splitlines()
    result = json.loads(lines[-1])
    assert KEYS <= set(result) and result["sharing"] == "k-anonymous" and result["k"] == 2
    assert all(len(line) <= 100 for line in lines[:-1])
    assert result == attack(generate("multitenant", 2, REQUESTS), sharing="k-anonymous", k=2).as_dict()
    quiet = ok("attack", "--seed", 2, "--num-requests", REQUESTS, "--sharing", "k-anonymous", "--k", 2, "--quiet")
    assert quiet.splitlines() == [lines[-1]]


def test_cli_attack_reads_a_trace_with_tenants(tmp_path):
    path = tmp_path / "mt.jsonl"
    write_token_jsonl(generate("multitenant", 3, REQUESTS), str(path))
    back = list(open_trace(str(path)))
    assert [r.tenant for r in back] == [r.tenant for r in generate("multitenant", 3, REQUESTS)]
    from_file = json.loads(ok("attack", "--workload", path, "--sharing", "shared", "--json").splitlines()[-1])
    assert from_file == attack(generate("multitenant", 3, REQUESTS)).as_dict()
    assert from_file["recovered_private_pages"] > 0


def test_a_trace_tenant_must_be_text(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"tokens": [1, 2, 3], "tenant": 5}\n')
    with pytest.raises(TraceFormatError, match="tenant"):
        list(open_trace(str(path)))


def test_replay_passes_the_tenant_to_the_cache():
    from radixkv import PrefixCache
    from radixkv.analysis.replay import replay

    trace = list(generate("multitenant", 1, 200))
    shared = replay(trace, PrefixCache(1 << 14, 16), miss_reasons=False)
    isolated = replay(trace, PrefixCache(1 << 14, 16, sharing="isolated"), miss_reasons=False)
    run = attack(trace, sharing="isolated")
    assert isolated.hit_tokens < shared.hit_tokens
    assert isolated.prompt_tokens == run.honest_prompt_tokens + sum(
        len(r.tokens) for r in trace if r.tenant == ATTACKER)
