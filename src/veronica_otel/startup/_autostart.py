"""The start-up door: zero code installs even when OpenTelemetry's start-up fails.

``opentelemetry-instrument`` runs ``initialize()`` from its ``sitecustomize``:
distro, configurator, then instrumentors. When the configurator raises (an
exporter that is not installed, ``OTEL_TRACES_EXPORTER=nonexistent``) it logs
the error and loads no instrumentor, so neither our entry points nor the
pre-instrument hook run. Python runs ``veronica_otel_zero_code.pth`` earlier,
at start-up; under ``opentelemetry-instrument`` only (its directory is on
``PYTHONPATH``) it calls :func:`register`, which makes ``initialize()`` end
with :func:`veronica_otel.startup.distro.ensure_installed`, whatever it raised. The
other doors usually got there first; then this does nothing.
"""

from __future__ import annotations

from typing import Any

import wrapt

__all__ = ["register"]

_MODULE = "opentelemetry.instrumentation.auto_instrumentation"


def _then_install(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    try:
        return wrapped(*args, **kwargs)
    finally:
        from veronica_otel.startup.distro import ensure_installed

        ensure_installed()


def _patch(module: Any) -> None:
    wrapt.wrap_function_wrapper(module, "initialize", _then_install)


def register() -> None:
    """Run zero-code install after OpenTelemetry's ``initialize()``; never raises."""
    try:
        wrapt.register_post_import_hook(_patch, _MODULE)
    except Exception as exc:  # a start-up file must not stop the interpreter
        import sys

        print(f"veronica-otel: ERROR: start-up hook not installed ({exc!r})", file=sys.stderr)
