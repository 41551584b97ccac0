#!/usr/bin/env bash
# The main job: show runaway agent chains and the same chains contained.
source "$(dirname "$0")/_venv.sh"
if .venv/bin/veronica-otel --help >/dev/null 2>&1; then
    exec .venv/bin/veronica-otel demo "$@"
fi
exec .venv/bin/python examples/runaway_retries.py "$@"
