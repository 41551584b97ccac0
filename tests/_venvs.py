"""Fresh virtualenvs for end-to-end tests of real installs, cached between runs.

Each venv is built with ``python -m venv`` and pip from the package indexes,
as a user would, and cached outside the clone under
``~/.cache/veronica-otel-e2e/<name>-<hash>`` (``VERONICA_E2E_CACHE`` moves
it). The hash covers what is installed (the steps and the Python version), so
a changed recipe builds a new venv. This checkout is installed into it as a
regular (non-editable) copy, and re-installed without dependencies whenever
its sources change, so the cached third-party set is reused. That copy is one
wheel built per version of the sources (``<cache>/ours/<hash>``) and installed
into every venv, as a user installs a release, instead of pip building the
sources again in each venv. A file lock keeps parallel test processes from
building the same venv or wheel twice.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("VERONICA_E2E_CACHE", Path.home() / ".cache" / "veronica-otel-e2e"))
OURS = "<checkout>"  # in a step: this checkout (as a built copy)
BOOTSTRAP = ("<bootstrap>",)  # a step: `opentelemetry-bootstrap -a install`
_BUILD_TIMEOUT = 900


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _sources_hash() -> str:
    digest = hashlib.sha256()
    # os.walk, not rglob: src/veronica_otel/instrumentors and exporters are symlinks.
    files = [
        Path(top, name)
        for top, dirs, names in os.walk(ROOT / "src", followlinks=True)
        for name in names
    ]
    for path in sorted([ROOT / "pyproject.toml", ROOT / "setup.py", *files]):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(ROOT)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@contextmanager
def _checkout_copy() -> Iterator[Path]:
    """A copy of the sources to build from, so no build files land in the clone."""
    with tempfile.TemporaryDirectory(prefix="veronica-src-") as tmp:
        copy = Path(tmp) / "veronica-otel"
        shutil.copytree(ROOT / "src", copy / "src", ignore=shutil.ignore_patterns("__pycache__"))
        for name in (
            "pyproject.toml",
            "setup.py",
            "README.md",
            "LICENSE",
            "MANIFEST.in",
            "CHANGELOG.md",
        ):
            if (ROOT / name).exists():
                shutil.copy(ROOT / name, copy / name)
        yield copy


def _our_wheel(stamp: str) -> Path:
    """This checkout built once into a wheel for sources ``stamp``, cached."""
    out = CACHE / "ours" / stamp
    with _locked(CACHE / "ours.lock"):
        built = sorted(out.glob("*.whl"))
        if built:
            return built[0]
        with (
            tempfile.TemporaryDirectory(prefix="veronica-wheel-") as tmp,
            _checkout_copy() as checkout,
        ):
            subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp, str(checkout)],
                check=True,
                timeout=_BUILD_TIMEOUT,
                capture_output=True,
                text=True,
            )
            (wheel,) = Path(tmp).glob("*.whl")
            for old in (CACHE / "ours").glob("*"):  # other sources' wheels, a day unused
                if time.time() - old.stat().st_mtime > 86400:
                    shutil.rmtree(old, ignore_errors=True)
            out.mkdir(parents=True, exist_ok=True)
            return Path(shutil.move(wheel, out / wheel.name))


def _pip(venv: Path, *args: str) -> None:
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *args],
        check=True,
        timeout=_BUILD_TIMEOUT,
        capture_output=True,
        text=True,
    )


def _run_step(venv: Path, step: Sequence[str], ours: Path | None) -> None:
    if tuple(step) == BOOTSTRAP:
        subprocess.run(
            [str(venv / "bin" / "opentelemetry-bootstrap"), "-a", "install"],
            check=True,
            timeout=_BUILD_TIMEOUT,
            capture_output=True,
            text=True,
        )
        return
    _pip(venv, *(arg.replace(OURS, str(ours)) if ours else arg for arg in step))


def venv(name: str, steps: Sequence[Sequence[str]]) -> Path:
    """A venv with ``steps`` installed (each a pip install argument list), cached.

    Returns the venv's directory; its programs are under ``bin/``. A failed
    build raises ``subprocess.CalledProcessError`` with pip's output.
    """
    key = hashlib.sha256(json.dumps([sys.version, list(map(list, steps))]).encode()).hexdigest()
    root = CACHE / f"{name}-{key[:12]}"
    with _locked(CACHE / f"{root.name}.lock"):
        stamp = _sources_hash()
        ours = root / ".veronica-sources"
        if not (root / ".complete").exists():
            shutil.rmtree(root, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=300)
            wheel = _our_wheel(stamp) if _installs_ours(steps) else None
            for step in steps:
                _run_step(root, step, wheel)
            ours.write_text(stamp)
            (root / ".complete").write_text("ok")
        elif not _installs_ours(steps):
            pass  # nothing of this checkout in it: nothing to refresh
        elif not ours.exists() or ours.read_text() != stamp:
            _pip(root, "--no-deps", "--force-reinstall", str(_our_wheel(stamp)))
            ours.write_text(stamp)
    return root


def _installs_ours(steps: Sequence[Sequence[str]]) -> bool:
    return any(OURS in arg for step in steps for arg in step)


def build_error(exc: subprocess.CalledProcessError) -> str:
    """pip's own words for a failed build, for a skip or failure message."""
    tail = (exc.stderr or exc.stdout or "").strip().splitlines()[-5:]
    return f"{' '.join(map(str, exc.cmd))} failed: " + " | ".join(tail)


# The standard OpenTelemetry recipe, as its docs give it, plus the servers and
# HTTP clients the tests run.
RECIPE: tuple[tuple[str, ...], ...] = (
    (
        f"{OURS}[openai]",
        "opentelemetry-distro",
        "opentelemetry-exporter-otlp",
        "gunicorn",
        "uvicorn",
        "httpx",
        "requests",
    ),
    BOOTSTRAP,
)

# Peer GenAI instrumentors. openai-v2 2.4b0 needs util-genai 1.1b0; openlit
# declares openai<3 (and anthropic<1), so it goes in with --no-deps after the
# requirements it imports (pinned to this OpenTelemetry release: unpinned,
# pip's resolver spent over ten minutes backtracking: urllib's has no 0.66b2).
PEERS: tuple[tuple[str, ...], ...] = (
    (
        f"{OURS}[openai]",
        "opentelemetry-instrumentation-openai-v2==2.4b0",
        "opentelemetry-util-genai==1.1b0",
        "opentelemetry-instrumentation-openai",
        "httpx",  # openai-v2 imports it (openai 3 itself uses httpx2)
    ),
    (  # what openlit imports (its other requirements are for other libraries)
        "opentelemetry-exporter-otlp==1.45.2",
        "opentelemetry-instrumentation-httpx==0.66b2",
        "opentelemetry-instrumentation-requests==0.66b2",
        "pydantic>=2,<3",
        "requests>=2.26,<3",
        "schedule>=1.2.2,<2",
        "xmltodict>=0.13,<2",
    ),
    ("--no-deps", "openlit==1.45.0"),
)

# The official GenAI instrumentors' successors (opentelemetry-python-genai),
# beside ours: they need a newer opentelemetry-util-genai than openai-v2 2.4b0
# allows, so they get a venv of their own (bench_instructions' genai peers).
GENAI_PEERS: tuple[tuple[str, ...], ...] = (
    (
        f"{OURS}[openai,anthropic]",
        "opentelemetry-instrumentation-genai-openai==1.3b0",
        "opentelemetry-instrumentation-genai-anthropic==1.3b0",
    ),
)

# The official contrib instrumentor alone (no veronica-otel), at the SDK and
# OpenTelemetry versions of the project's own environment: what its spans
# carry for a call is the reference our call spans are checked against.
CONTRIB: tuple[tuple[str, ...], ...] = (
    (
        "openai==3.57.0",
        "opentelemetry-sdk==1.45.2",
        "opentelemetry-instrumentation-openai-v2==2.4b0",
        "opentelemetry-util-genai==1.1b0",
        "httpx",  # openai-v2 imports it (openai 3 itself uses httpx2)
    ),
)

# The oldest OpenTelemetry this checkout declares (pyproject's floors, pinned
# exactly): opentelemetry-instrumentation 0.62b0 is the first to allow wrapt 2,
# and its semantic conventions pin the API to 1.41.0, so the three move together.
FLOOR_VERSIONS = {
    "opentelemetry-api": "1.41.0",
    "opentelemetry-sdk": "1.41.0",
    "opentelemetry-instrumentation": "0.62b0",
    "opentelemetry-instrumentation-httpx": "0.62b0",
}
FLOOR: tuple[tuple[str, ...], ...] = (
    (
        f"{OURS}[openai,propagation]",
        *(f"{name}=={version}" for name, version in FLOOR_VERSIONS.items()),
        "httpx",  # opentelemetry-instrumentation-httpx imports it
    ),
)

# The Stainless SDKs at the majors agent frameworks pin (crewai, llama-index and
# strands pin openai<3; anthropic below 2), one venv per shape of their base
# client: openai 2.54 with anthropic 0.79 (retries through ``_sleep_for_retry``,
# httpx); openai 2.30 (the lowest supported) with anthropic 0.125 (per-attempt
# ``_attempt_request`` and middleware, httpx); anthropic 1.x (its own spans,
# ``_request``, httpx2). The first step is what a user types:
# ``pip install veronica-otel[openai] 'openai<3'``.
OPENAI_2: tuple[tuple[str, ...], ...] = (
    (f"{OURS}[openai,anthropic]", "openai==2.54.0", "anthropic==0.79.0"),
)
OPENAI_2_LOW: tuple[tuple[str, ...], ...] = (
    (f"{OURS}[openai,anthropic]", "openai==2.30.0", "anthropic==0.125.0"),
)
ANTHROPIC_1: tuple[tuple[str, ...], ...] = ((f"{OURS}[anthropic]", "anthropic==1.17.0"),)

# `python -m build`'s front end and the backend pyproject.toml names, installed
# once: the release test builds with --no-isolation here, where build would
# otherwise pip install the backend into two fresh environments (the sdist's,
# then the wheel's) on every run. build still checks the requirements are met.
BUILD: tuple[tuple[str, ...], ...] = (
    (
        "build",
        *tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"],
    ),
)

# examples/jaeger's install line, exactly as its README gives it: the OTLP/HTTP
# exporter and OpenTelemetry's httpx instrumentation (the POST under each call).
JAEGER_EXAMPLE: tuple[tuple[str, ...], ...] = ((f"{OURS}[openai,otlp,propagation]",),)

# Agent frameworks, each installed as its users install it
# (``pip install veronica-otel[openai] <framework>``), grouped where their
# requirements agree so one venv serves several tests: these three take
# openai 3.x; crewai and llama-index pin openai<3.
FRAMEWORKS_OPENAI_3: tuple[tuple[str, ...], ...] = (
    (
        f"{OURS}[openai]",
        "openai-agents",
        "pydantic-ai-slim[openai]",
        "langgraph",
        "langchain-openai",
    ),
)
FRAMEWORKS_OPENAI_2: tuple[tuple[str, ...], ...] = (
    (f"{OURS}[openai]", "crewai", "llama-index-core", "llama-index-llms-openai"),
)
# google-adk pins opentelemetry-api/sdk <= 1.44; our floor is 1.41.
# Unpinned beside us, so pip must find the newest google-adk that fits with us.
FRAMEWORK_ADK: tuple[tuple[str, ...], ...] = ((f"{OURS}[google-genai]", "google-adk"),)
# strands-agents sends through boto3 Bedrock by default.
FRAMEWORK_STRANDS: tuple[tuple[str, ...], ...] = ((f"{OURS}[bedrock]", "strands-agents"),)
# smolagents with its OpenAI-compatible model, AG2 on openai, and dspy: each alone
# (benchmarks/bench_frameworks.py), and the three in one venv for the tests (pip
# resolves them together to the versions it picks for each alone).
FRAMEWORK_SMOLAGENTS: tuple[tuple[str, ...], ...] = ((f"{OURS}[openai]", "smolagents[openai]"),)
FRAMEWORK_AG2: tuple[tuple[str, ...], ...] = ((f"{OURS}[openai]", "ag2[openai]"),)
FRAMEWORK_DSPY: tuple[tuple[str, ...], ...] = ((f"{OURS}[openai]", "dspy"),)
FRAMEWORKS_TEXT: tuple[tuple[str, ...], ...] = (
    (f"{OURS}[openai]", "smolagents[openai]", "ag2[openai]", "dspy"),
)


def environ_without(*prefixes: str) -> dict[str, str]:
    """This process's environment minus every variable starting with one of
    ``prefixes``, for a child in a fresh venv; the bytecode cache's location
    (``PYTHONPYCACHEPREFIX``, set by scripts/check.sh) stays, so an app the
    child imports from the checkout writes no ``__pycache__`` into it."""
    kept = {"PYTHONPYCACHEPREFIX"}
    return {k: v for k, v in os.environ.items() if k in kept or not k.startswith(prefixes)}


@functools.cache
def plain_http_tls() -> dict[str, str]:
    """``SSL_CERT_FILE`` naming a one-certificate bundle, for an app that talks plain HTTP.

    Every client httpx or httpx2 makes (one per SDK client) loads the whole
    certifi bundle, about 30 ms of CPU each, although the fake servers the
    apps call are plain HTTP; both honour ``SSL_CERT_FILE`` and then load one
    certificate. Not for pip: it must verify the package index.
    """
    import certifi

    bundle = Path(certifi.where()).read_text()
    end = "-----END CERTIFICATE-----"
    first = bundle[bundle.index("-----BEGIN CERTIFICATE-----") : bundle.index(end) + len(end)]
    path = CACHE / "one-certificate.pem"
    if not path.is_file() or path.read_text() != first + "\n":
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=CACHE, delete=False) as out:
            out.write(first + "\n")
        os.replace(out.name, path)
    return {"SSL_CERT_FILE": str(path)}
