# The two commands the README promises. Both set up what they need on a fresh machine.
PYTHON ?= python3

.PHONY: demo test setup setup-test lint ruff mypy sqlfluff fuzz

setup:
	$(PYTHON) -m pip install -q -e .

setup-test:
	$(PYTHON) -m pip install -q -e '.[test,lint]'
	@# Debian's Chromium drives the real-browser dashboard test (never a downloaded browser).
	@if [ ! -x /usr/bin/chromium ]; then \
		(apt-get update -q && apt-get install -y -q chromium) >/tmp/routeaudit-apt.log 2>&1 \
		|| echo "warning: could not install Debian chromium (see /tmp/routeaudit-apt.log); browser tests will be skipped"; \
	fi
	@# Debian's Prometheus (promtool + server) checks deploy/prometheus and scrapes a live collector.
	@if [ ! -x /usr/bin/promtool ] || [ ! -x /usr/bin/prometheus ]; then \
		(apt-get update -q && apt-get install -y -q --no-install-recommends prometheus) >>/tmp/routeaudit-apt.log 2>&1 \
		|| echo "warning: could not install Debian prometheus (see /tmp/routeaudit-apt.log); Prometheus tests will be skipped"; \
	fi
	@# Debian's Java 17 runs Spark (pyspark) for the Spark-path equivalence test.
	@if ! command -v java >/dev/null 2>&1; then \
		(apt-get update -q && apt-get install -y -q --no-install-recommends openjdk-17-jre-headless) >>/tmp/routeaudit-apt.log 2>&1 \
		|| echo "warning: could not install Debian openjdk-17-jre-headless (see /tmp/routeaudit-apt.log); Spark tests will be skipped"; \
	fi

demo: setup
	routeaudit demo --db demo.duckdb

# The static checks CI enforces (tools from the `lint` extra). Each fails on any finding.
lint: ruff mypy sqlfluff

ruff:
	$(PYTHON) -m ruff check .

mypy:
	$(PYTHON) -m mypy

sqlfluff:
	$(PYTHON) -m sqlfluff lint --processes 0 audit/sql

# The C extensions built with ASan + UBSan (in build/fuzz, never the in-place .so files) under
# atheris (coverage-guided, libFuzzer) for FUZZ_SECONDS each, against the Python paths; installs
# clang with apt when missing. Fails on any crash, sanitizer report or mismatch (fuzz/README.md).
FUZZ_SECONDS ?= 45
fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) PYTHON=$(PYTHON) sh fuzz/run.sh

# Setup, then every check and a short fuzz run side by side (-k: each reports before make stops;
# the fuzzers run one at a time, each starting from its committed corpus; `make fuzz` runs
# longer), then the tests in TEST_WORKERS xdist workers (tests/spark is one xdist_group: one
# worker, one JVM), the slowest listed. Three workers on two cores: a test process alone keeps
# a core 70-90 % busy (it waits on servers it started, subprocesses, sockets), and a third
# worker runs in that time.
TEST_FUZZ_SECONDS ?= 12
TEST_WORKERS ?= 3
test: setup-test
	$(MAKE) --no-print-directory -k -j2 --output-sync=target lint fuzz FUZZ_SECONDS=$(TEST_FUZZ_SECONDS)
	$(PYTHON) -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=30
