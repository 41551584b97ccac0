"""Every zero-code door installs the same default chain, once.

``opentelemetry-instrument`` may reach us through our distro, the
pre-instrument hook, any of our instrumentor entry points or the start-up
file, in any order and several of them in one process. The enforcement
hooks are marked installed here (they run in the e2e tests); the default
chain from ``VERONICA_*`` is real.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from veronica_otel import _propagation
from veronica_otel.startup import distro


@pytest.fixture
def fresh_doors(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(distro, "_installed", True)
    monkeypatch.setattr(distro, "_ensured", False)
    yield
    _propagation.set_default_context(None)


@pytest.mark.usefixtures("fresh_doors")
def test_every_door_shares_one_default_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERONICA_MAX_STEPS", "3")
    entry = distro.ZeroCodeEntry()
    assert not entry.is_instrumented_by_opentelemetry
    distro.pre_instrument()
    first = _propagation.default_context()
    assert first is not None and first.config.max_steps == 3
    entry.instrument(skip_dep_check=True)
    distro.VeronicaDistro().configure()
    distro.ensure_installed()
    assert _propagation.default_context() is first  # not a second budget
    assert entry.is_instrumented_by_opentelemetry


@pytest.mark.usefixtures("fresh_doors")
def test_a_malformed_threads_switch_refuses_calls_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VERONICA_MAX_STEPS", "3")
    monkeypatch.setenv("VERONICA_THREADS", "sometimes")
    distro.ensure_installed()
    with pytest.raises(ValueError, match="VERONICA_THREADS='sometimes'"):
        _propagation.default_context()


@pytest.mark.parametrize(("value", "wanted"), [("", True), ("false", False), ("on", True)])
def test_threads_follow_the_switch(value: str, wanted: bool) -> None:
    assert distro._threads_wanted({"VERONICA_THREADS": value}) is wanted
