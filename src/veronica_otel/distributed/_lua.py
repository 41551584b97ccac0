"""The shared ledger's Lua, read from the package's ``lua/`` folder.

The scripts ship as package data (``lua/*.lua``, readable and lintable as
Lua); ``_scripts.py`` and ``_pool_scripts.py`` put them together once, at
import, and the clients register the results (``EVALSHA`` from then on).
"""

from __future__ import annotations

from importlib.resources import files

__all__ = ["source"]

_FOLDER = files(__package__).joinpath("lua")


def source(name: str) -> str:
    """The text of ``lua/{name}.lua`` (a missing file is a broken install: it raises)."""
    return _FOLDER.joinpath(f"{name}.lua").read_text(encoding="utf-8")
