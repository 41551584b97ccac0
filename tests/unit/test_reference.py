"""The configuration reference cannot drift from the code it describes."""

from __future__ import annotations

import re
from pathlib import Path

import veronica_otel
from veronica_otel._reference import ENVIRONMENT, POLICY_KEYS, SCHEMA_KEYS

PACKAGE = Path(veronica_otel.__file__).parent
# Names that look like variables but are not settings.
NOT_SETTINGS = {"VERONICA_CORRUPT"}  # a tag the Redis scripts put on their errors


def _variables_in_code() -> set[str]:
    found: set[str] = set()
    for path in PACKAGE.rglob("*.py"):  # rglob follows the instrumentors/exporters links
        found |= set(re.findall(r"VERONICA_[A-Z][A-Z0-9_]*[A-Z0-9]", path.read_text()))
    return {name for name in found if not name.endswith("_")} - NOT_SETTINGS


def test_every_variable_the_package_reads_is_documented_and_no_other() -> None:
    documented = {name for names, _ in ENVIRONMENT for name in names}
    in_code = _variables_in_code()
    assert in_code - documented == set(), "read by the code but not in _reference.ENVIRONMENT"
    assert documented - in_code == set(), "documented but never read"


def test_every_policy_key_the_schema_accepts_is_documented_and_no_other() -> None:
    documented = {key for key, _ in POLICY_KEYS}
    accepted = {key for key in SCHEMA_KEYS[""] if key not in SCHEMA_KEYS}
    for table, keys in SCHEMA_KEYS.items():
        if not table:
            continue
        placeholder = "model" if table in ("prices", "models") else "name"
        prefix = f"{table}." if table == "limits" else f'{table}."{placeholder}".'
        accepted |= {prefix + key for key in keys}
    assert documented == accepted
