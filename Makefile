# hostless: `make demo` and `make test` bootstrap .venv from a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
SOURCES := $(wildcard src/hostless/*.py src/hostless/*/*.py src/hostless/*.c src/hostless/*.h src/hostless/*/*.c) pyproject.toml setup.py

.PHONY: demo test lint bench clean venv

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	touch $@

$(VENV)/.deps: $(VENV)/.created pyproject.toml
	$(PIP) install -q --upgrade "setuptools>=64" wheel
	$(PIP) install -q "numpy>=1.23" "pytest>=7" "hypothesis>=6.80" "ruff>=0.5" "mypy>=1.8" "rich>=13" "matplotlib>=3.6"
	touch $@

$(VENV)/.installed: $(VENV)/.deps $(SOURCES)
	$(PIP) install -q --no-build-isolation --no-deps .
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(PY) examples/demo.py
	$(PY) examples/pipeline_demo.py

test: venv
	$(PY) -m pytest -q -ra tests
	$(PY) -m ruff check src tests benchmarks examples
	$(PY) -m mypy

lint: venv
	$(PY) -m ruff check src tests benchmarks examples
	$(PY) -m mypy

bench: venv
	$(VENV)/bin/hostless bench fences

clean:
	rm -rf build $(VENV) src/*.egg-info
