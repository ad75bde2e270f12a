# Two commands for a newcomer: `make demo` and `make test`. Both create .venv on first use and reuse it after.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
INSTALL := $(PIP) install --disable-pip-version-check -c constraints.txt

.PHONY: demo test bench lint install install-dev clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(PY) pyproject.toml constraints.txt
	$(INSTALL) torch torchvision
	$(INSTALL) -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(INSTALL) -e '.[dev]'
	# Azurite, Microsoft's Azure Blob Storage emulator, for the az:// tests (from npm, pinned)
	npm install --prefix $(VENV)/azurite --no-audit --no-fund --silent azurite@3.37.0
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: install
	$(PY) -m demo

# Every benchmark; the table goes to benchmarks/results/full.md (QUICK=1: smaller runs, to quick.md).
bench: install
	$(PY) -m benchmarks $(if $(QUICK),--quick)

lint: install-dev
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports

test: install-dev
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports
	$(PY) -m pytest

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache lightning_logs
