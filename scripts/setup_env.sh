#!/usr/bin/env bash
# Create the pinned CPU environment in .venv if it is missing (idempotent).
# Usage: bash scripts/setup_env.sh        (called by `make run`, `make test` and .ci/run)
set -euo pipefail
cd "$(dirname "$0")/.."
STAMP=.venv/.installed-$(cat requirements-cpu.txt requirements-nodeps.txt pyproject.toml | sha256sum | cut -c1-12)
if [ -f "$STAMP" ]; then exit 0; fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements-cpu.txt
.venv/bin/pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt
.venv/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
rm -f .venv/.installed-*
touch "$STAMP"
