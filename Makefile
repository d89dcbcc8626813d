# Two commands work on a fresh machine: `make demo` and `make test`.
# Python: PYTHON=/path/to/python3.x if given, else the first of python3.11 (the version CI and the
# benchmarks use), python3.12, python3.13, python3.10, python3 that runs and is at least 3.10
# (the project's requires-python).
PYTHON ?=
VENV   := .venv
PY     := $(VENV)/bin/python
# `make demo` installs the package and its runtime dependencies only; `make test` adds the
# development extras. Separate stamps, so that `make demo` then `make test` installs the rest.
RUNTIME_STAMP := $(VENV)/.installed-runtime
# torch first, chosen for this machine (tools/choose_torch.py: the CPU-only build on Linux without
# a CUDA device where PyTorch's CPU index answers; else the default wheel; a torch already in
# .venv is kept; DPAUDIT_TORCH=cpu|default forces it). It prints which one it installed.
TORCH_STAMP   := $(VENV)/.torch
STAMP         := $(VENV)/.installed
EXTRAS        := dev,lightning,transformers,examples
# setuptools announces every editable install of a flat layout ("Editable installation ... be
# careful with folders in your working directory"), as a warning that pip shows even with -q;
# it is a notice about editable installs in general, so it is silenced here, and only it.
PIP_E := PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install -q -e

.PHONY: demo test test-slow lint bench table1 clean venv

$(PY):
	@py="$(PYTHON)"; \
	if [ -z "$$py" ]; then \
	  for c in python3.11 python3.12 python3.13 python3.10 python3; do \
	    if $$c -c 'import sys; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1; then \
	      py=$$c; break; \
	    fi; \
	  done; \
	fi; \
	if [ -z "$$py" ]; then \
	  echo "need Python >= 3.10: none of python3.11, 3.12, 3.13, 3.10, python3 works here;" \
	       "install one, or run make PYTHON=/path/to/python3.x"; exit 2; \
	fi; \
	if ! $$py -c 'import sys; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1; then \
	  echo "PYTHON=$$py does not run, or is older than 3.10"; exit 2; \
	fi; \
	echo "creating $(VENV) with $$py ($$($$py -c 'import sys; print(sys.version.split()[0])'))"; \
	$$py -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(TORCH_STAMP): | $(PY)
	$(PY) tools/choose_torch.py
	touch $(TORCH_STAMP)

$(RUNTIME_STAMP): pyproject.toml | $(TORCH_STAMP)
	$(PIP_E) .
	touch $(RUNTIME_STAMP)

$(STAMP): pyproject.toml | $(TORCH_STAMP)
	$(PIP_E) '.[$(EXTRAS)]'
	touch $(RUNTIME_STAMP) $(STAMP)

venv: $(STAMP)

demo: $(RUNTIME_STAMP)
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
	rm -rf $(VENV) build dist *.egg-info audit_out
