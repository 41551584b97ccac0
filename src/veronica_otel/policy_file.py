"""Declarative policy in one file: the public face of :mod:`veronica_otel.startup.policy_file`.

Usage::

    from veronica_otel import ExecutionContext, PolicyPipeline
    from veronica_otel.policy_file import FilePolicy, PolicyFile

The implementation lives with the rest of the start-up code (the zero-code
default chain follows ``VERONICA_POLICY_FILE``); this module keeps the import
path the documentation gives.
"""

from __future__ import annotations

from .startup.policy_file import (
    POLICY_FILE_ENV,
    FilePolicy,
    ModelRule,
    PolicyFile,
    PolicyFileError,
    PolicyFileListener,
    PolicySpec,
    PoolRule,
    ToolRule,
    install_default_chain,
)

__all__ = [
    "POLICY_FILE_ENV",
    "FilePolicy",
    "ModelRule",
    "PolicyFile",
    "PolicyFileError",
    "PolicyFileListener",
    "PolicySpec",
    "PoolRule",
    "ToolRule",
    "install_default_chain",
]
