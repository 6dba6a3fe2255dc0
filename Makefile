# The two commands the README promises. Both set up what they need on a fresh machine.
PYTHON ?= python3

.PHONY: demo test setup setup-test

setup:
	$(PYTHON) -m pip install -q -e .

setup-test:
	$(PYTHON) -m pip install -q -e '.[test]'
	@# Debian's Chromium drives the real-browser dashboard test (never a downloaded browser).
	@if [ ! -x /usr/bin/chromium ]; then \
		(apt-get update -q && apt-get install -y -q chromium) >/tmp/routeaudit-apt.log 2>&1 \
		|| echo "warning: could not install Debian chromium (see /tmp/routeaudit-apt.log); browser tests will be skipped"; \
	fi

demo: setup
	routeaudit demo --db demo.duckdb

test: setup-test
	$(PYTHON) -m pytest
