#!/usr/bin/env bash
# The whole check: lint, format, types (strict, whole package), tests.
source "$(dirname "$0")/_venv.sh"
set -x
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy --strict
.venv/bin/pytest "$@"
