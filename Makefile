# leasebox: every target installs what it needs into .venv first.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The second PostgreSQL major version the database tests run against, when reachable.
SECOND_PG_DSN ?= postgresql://postgres@127.0.0.1:5432/postgres
PYTEST_ARGS ?=
# Test processes (pytest-xdist), each with its own embedded PostgreSQL; 0 runs the tests in
# pytest's own process (for a debugger, or -x to stop at the first failure in order).
TEST_PROCESSES ?= 2

.PHONY: help install tools cluster-programs cluster demo test test-second-pg lint format crds docs bench bench-quick bench-deps mutate clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP) ## create .venv and install leasebox with its development tools

tools: ## install system tools the tests use (promtool, kubectl, chromium, postfix) when missing and running as root
	@if ! command -v promtool >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing promtool (Debian package prometheus)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; \
	  else echo "promtool is missing: install the prometheus package" >&2; fi; \
	fi
	@if ! command -v kubectl >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing kubectl (Debian package kubernetes-client)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubernetes-client >/dev/null; \
	  else echo "kubectl is missing: install the kubernetes-client package" >&2; fi; \
	fi
	@if ! command -v postfix >/dev/null 2>&1 && [ ! -x /usr/sbin/postfix ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing postfix (Debian package postfix, the real mail server of the SMTP tests; no instance of its own is configured)"; \
	    echo "postfix postfix/main_mailer_type select No configuration" | debconf-set-selections; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postfix >/dev/null; \
	  else echo "postfix is missing: install the postfix package" >&2; fi; \
	fi
	@if ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium (Debian package chromium, for the browser tests of leasebox web)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium is missing: install the chromium package" >&2; fi; \
	fi

cluster-programs: ## build etcd, kube-apiserver, kube-controller-manager and kubectl once into ~/.cache/leasebox (needs Go; CI requires it)
	@if command -v go >/dev/null 2>&1; then tools/bin/build-controlplane >/dev/null; \
	elif [ -n "$$CI" ]; then echo "go is missing: the cluster tests build the control plane from Go modules" >&2; exit 1; \
	else echo "go is missing: the cluster tests will skip (install Go 1.26 or newer, https://go.dev/doc/install)"; fi

cluster: install cluster-programs ## start the test control plane and its process node by hand (ARGS=--chart also installs the chart); Ctrl-C stops it
	cd tests && ../$(BIN)/python -m support.cluster.serve $(ARGS)

demo: install ## run the whole flow on an embedded PostgreSQL and print what held
	$(BIN)/leasebox demo

lint: install ## ruff, mypy --strict and the import layers
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

format: install ## apply ruff's fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

test: install tools lint cluster-programs ## lint, then every test on embedded PostgreSQL 18 and the real control plane, then the database tests on a second version
	$(BIN)/pytest -n $(TEST_PROCESSES) $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory test-second-pg

test-second-pg: install ## the database tests against $(SECOND_PG_DSN) when it answers (CI requires it; as root with apt, tools/bin/second-postgres runs apt-get install postgresql-15 and starts one)
	@tools/bin/second-postgres
	@if $(BIN)/python -c "import psycopg,sys; psycopg.connect(sys.argv[1], connect_timeout=3).close()" '$(SECOND_PG_DSN)' 2>/dev/null; then \
	  echo "database tests on $$($(BIN)/python -c "import psycopg,sys; print(psycopg.connect(sys.argv[1]).info.parameter_status('server_version'))" '$(SECOND_PG_DSN)')"; \
	  LEASEBOX_TEST_DSN='$(SECOND_PG_DSN)' $(BIN)/pytest -n $(TEST_PROCESSES) -m "db and not embedded_only" $(PYTEST_ARGS); \
	elif [ -n "$$CI" ]; then echo "second PostgreSQL at $(SECOND_PG_DSN) is not reachable" >&2; exit 1; \
	else echo "skipping the second PostgreSQL version: $(SECOND_PG_DSN) does not answer"; fi

crds: install ## regenerate crds/ and the chart's copies of the CRD and of the alert rules
	$(BIN)/leasebox crd > crds/outboxworkerpools.leasebox.dev.yaml
	cp crds/outboxworkerpools.leasebox.dev.yaml charts/leasebox/files/crds/
	cp operator/leasebox_operator/rules/leasebox-rules.yaml charts/leasebox/files/alerts/

docs: install ## regenerate the README's reference tables and the chart's README from the code
	$(BIN)/python -m tools.docs

BENCH_ARGS ?=

bench-deps: install
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[bench]'

bench: bench-deps ## every target of the performance issue beside its yardstick (bench/results/latest.json, and operator.json, figures in bench/README.md); BENCH_QUICK=1 for small sizes
	LEASEBOX_ALLOW_PLAINTEXT_SECRETS=1 $(BIN)/python -m bench.run $(BENCH_ARGS)
	$(BIN)/python -m bench.operator_cost
	$(BIN)/python -m bench.burst
	$(BIN)/python -m bench.smtp_postfix

bench-quick: bench-deps ## the same benchmarks at small sizes, a few minutes: checks the harness, not the figures
	LEASEBOX_ALLOW_PLAINTEXT_SECRETS=1 $(BIN)/python -m bench.run --quick $(BENCH_ARGS)
	$(BIN)/python -m bench.operator_cost --quick
	$(BIN)/python -m bench.burst --quick
	$(BIN)/python -m bench.smtp_postfix --quick

mutate: install ## the mutation gate: every curated break of a guarantee must fail a test by assertion
	$(BIN)/python -m tools.mutate

clean: ## remove build output and the virtual environment
	rm -rf build dist $(VENV) .mypy_cache .pytest_cache .ruff_cache
