# Two commands work on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow lint bench table1 clean venv

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) on PATH"; exit 2; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,lightning]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/dpaudit demo --out audit_out

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -p no:cacheprovider

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow -p no:cacheprovider

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) benchmarks/table1.py
	$(PY) benchmarks/type1.py
	$(PY) benchmarks/throughput.py

clean:
	rm -rf $(VENV) build *.egg-info audit_out
