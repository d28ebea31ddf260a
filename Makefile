# gpufleet — two commands for a newcomer: `make demo` and `make test` (Debian 12, as root).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
SYSTEM_PACKAGES := debootstrap systemd-container nftables lxcfs iproute2 openssh-client gcc libc6-dev \
	dpkg gnupg curl python3-venv make tar chromium shellcheck prometheus prometheus-alertmanager
BUILD := build

.PHONY: demo test unit sim-test lint deps system-deps clean bench

demo: deps
	bash scripts/demo.sh

# The end-to-end modules run on 2 pytest-xdist workers, a module per worker at a time (each worker has its own
# simulated fleet: tests/sim/conftest.py): they mostly wait on SSH and systemd, so 2 workers on 2 cores halve the wall
# time (serial: 13 min for tests/sim on this project's 2-core machines). The unit tests (CPU-bound, 2-2.5 min) run
# beside them for the same reason; their output is printed when both are done, and either failing fails the target.
test: deps
	$(VENV)/bin/ruff check .
	@mkdir -p $(BUILD); \
	$(VENV)/bin/pytest -q tests/unit > $(BUILD)/unit-tests.log 2>&1 & unit=$$!; \
	$(VENV)/bin/pytest -q -n 2 --dist loadfile --durations=12 tests/sim; sim=$$?; \
	wait $$unit; unit_status=$$?; \
	echo "---------------- tests/unit (ran beside tests/sim): $(BUILD)/unit-tests.log"; \
	grep -v '^[.sxFE]*  *\[ *[0-9]*%\]$$' $(BUILD)/unit-tests.log; \
	echo "tests/sim exit $$sim, tests/unit exit $$unit_status"; \
	[ $$sim -eq 0 ] && [ $$unit_status -eq 0 ]

unit: deps
	$(VENV)/bin/pytest -q tests/unit

lint: deps
	$(VENV)/bin/ruff check .

bench: deps
	$(PY) benchmarks/sim_bringup.py

deps: system-deps $(VENV)/.installed

system-deps:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null \
		| grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing system packages: $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

$(VENV)/.installed: pyproject.toml
	python3 -m venv --clear $(VENV)
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

clean:
	-$(VENV)/bin/gpufleet sim down
	rm -rf $(BUILD) .pytest_cache
