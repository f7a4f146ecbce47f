# The two commands of the README's quick start, and a few more.
#   make demo   set up .venv and run the demo (local tansu broker + proxy + clients)
#   make test   set up .venv and run the whole test suite (lint, types, contracts, tests)
#   make unit   set up .venv and run the fast layer: unit tests only (about a minute)
#   make bench  set up .venv and run the benchmark (proxy vs direct vs tansu proxy)

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test unit bench lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed-%: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[$*]'
	touch $@

demo: $(VENV)/.installed-demo
	$(BIN)/kafka-quota-proxy demo

lint: $(VENV)/.installed-test
	$(BIN)/ruff check kafka_quota_proxy tests testkit bench tools
	$(BIN)/mypy
	$(BIN)/lint-imports

PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider

# The layers in order, fastest first: the unit tests on two workers (pytest-xdist; CPU-bound,
# the machine's two cores), the Spark jobs, then the end-to-end tests on three workers (they
# mostly wait: on quotas, brokers, windows; four took 604-611 s against 678-692 s, but one run
# of three on four failed test_acl_admin's 3.5 s catch-up bound), a module per worker at a time (tests/conftest.py
# starts the longest first). The Spark standalone cluster's test (a master and two workers,
# mostly starting JVMs) runs beside the end-to-end tests. Every layer runs even when one
# before fails.
SPARK_CLUSTER := tests/spark/test_cluster.py
test: lint
	@status=0; \
	$(PYTEST) -n 2 tests/unit || status=1; \
	$(PYTEST) --ignore=$(SPARK_CLUSTER) tests/spark || status=1; \
	$(PYTEST) -n 3 --dist loadfile --durations=15 tests/e2e $(SPARK_CLUSTER) || status=1; \
	exit $$status

unit: $(VENV)/.installed-test
	$(PYTEST) -n 2 tests/unit

bench: $(VENV)/.installed-bench
	$(BIN)/python bench/proxy_bench.py

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .hypothesis
