#!/usr/bin/env bash
# The benchmark scripts' checks (quick mode; one runs under cachegrind for
# minutes), apart from the test command. The benchmarks themselves print
# JSON: see benchmarks/README.md.
source "$(dirname "$0")/_venv.sh"
set -x
.venv/bin/pytest -m bench tests/e2e/test_benchmarks_run.py "$@"
