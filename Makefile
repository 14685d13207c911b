# The two entry points of the README. Both create .venv on first use, so a fresh machine
# needs nothing but Python 3.10+.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-sglang test-vllm bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,plot,redis,mooncake]'
	touch $(STAMP)

## make demo: sweep a generated multi-workload trace over every policy; print the table, write out/demo.png
demo: $(STAMP)
	$(BIN)/radixkv demo

## make test: the whole test suite
test: $(STAMP)
	$(BIN)/python -m pytest -q

## make test-sglang: the SGLang adapter driven by a real SGLang (builds bench/peers/.venv: CPU torch, ~1 GB)
test-sglang: $(STAMP)
	bash bench/peers/setup.sh
	bench/peers/.venv/bin/python -m pip install --quiet $$($(BIN)/python -m pip freeze | grep -iE '^(pytest|hypothesis)==')
	bench/peers/.venv/bin/python -m pytest -q tests/adapters/test_adapters_sglang.py tests/adapters/test_sglang_live.py tests/kit/test_kit_sglang_live.py

## make test-vllm: radixkv's hashes and ZMQ events checked against a real vLLM's, and RadixKVTier inside vLLM's
## real schedulers (tests/vllm; the same bench/peers/.venv; its Redis runs need redis-server)
test-vllm: $(STAMP)
	bash bench/peers/setup.sh
	bench/peers/.venv/bin/python -m pip install --quiet $$($(BIN)/python -m pip freeze | grep -iE '^(pytest|hypothesis|redis)==')
	bench/peers/.venv/bin/python -m pytest -q tests/events/test_vllm_hashing.py tests/events/test_vllm_live.py tests/kit/test_kit_vllm_live.py \
		tests/router/test_router_state_vllm.py \
		tests/vllm

## make bench: micro-benchmarks (pytest-benchmark)
bench: $(STAMP)
	$(BIN)/python -m pytest bench -q --benchmark-only

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .benchmarks *.egg-info
