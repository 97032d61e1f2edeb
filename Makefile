# Quickstart: `make run` (the default job on the offline Gemma 3 270M) and `make test` (the CPU test suite).
PY := .venv/bin/python
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export WANDB_MODE ?= offline

.PHONY: setup run test
setup:
	bash scripts/setup_env.sh

run: setup
	$(PY) run.py $(ARGS)

test: setup
	$(PY) -m pytest -q tests $(ARGS)
