# The two entry points of the README. Both create .venv on first use, so a fresh machine
# needs nothing but Python 3.10+.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,plot,redis]'
	touch $(STAMP)

## make demo: sweep a generated multi-workload trace over every policy; print the table, write out/demo.png
demo: $(STAMP)
	$(BIN)/radixkv demo

## make test: the whole test suite
test: $(STAMP)
	$(BIN)/python -m pytest -q

## make bench: micro-benchmarks (pytest-benchmark)
bench: $(STAMP)
	$(BIN)/python -m pytest bench -q --benchmark-only

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .benchmarks *.egg-info
