# Two set-up commands (see README): `make demo` and `make test`.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test install clean

# torch==2.13.0 goes in first so that pip takes the local CPU wheel on CPU-only machines
# (and the matching CUDA build elsewhere); the project's torch range then installs nothing.
$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH (set PYTHON=...)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/vlp demo

test: $(STAMP)
	$(PY) -m pytest tests -q --durations=15

clean:
	rm -rf $(VENV) .pytest_cache
