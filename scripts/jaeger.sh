#!/usr/bin/env bash
# Jaeger v2 built from source (once per version, cached outside the clone) and
# run in memory on loopback, no Docker. Needs Go (go on PATH or /usr/local/go).
#   bash scripts/jaeger.sh build   # build it the first time; print the binary's path
#   bash scripts/jaeger.sh run     # OTLP on 4317 (gRPC) / 4318 (HTTP), query API on 16686
# VERONICA_JAEGER_CACHE moves the cache (default ~/.cache/veronica-otel-jaeger).
source "$(dirname "$0")/_venv.sh"
exec .venv/bin/python -m veronica_otel.testing.jaeger "$@"
