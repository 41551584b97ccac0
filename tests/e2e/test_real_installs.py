"""Contained wherever it is installed: real installs in fresh venvs, as users make them.

Each venv is built by pip from the package indexes (cached between runs,
:mod:`tests._venvs`) with this checkout installed as a regular copy. The
apps are unchanged scripts; the LLM is the fake server in this process,
whose request counts are the truth of what was sent.

- RECIPE: OpenTelemetry's standard recipe (``opentelemetry-distro``,
  ``opentelemetry-exporter-otlp``, ``opentelemetry-bootstrap -a install``,
  which adds the official openai-v2 instrumentation among others), so two
  distros and two configurators, with no ``OTEL_PYTHON_*`` selection.
- PEERS: the official ``opentelemetry-instrumentation-openai-v2``,
  OpenLLMetry's ``opentelemetry-instrumentation-openai`` and ``openlit``.

Importing openai, the SDK and every instrumentor the recipe installs is most
of what a run under ``opentelemetry-instrument`` costs: the runs that vary only
their environment (distro and configurator selection, limits, threads,
propagation) are started by :func:`tests._zero_code.start_runs`, each a
process of its own forked, before start-up, from one that made those imports,
then started as the launcher and Python's start-up would start it; a start with
a broken exporter, the pre-fork servers and the peers under zero code run the
real ``opentelemetry-instrument``.
"""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests import _venvs
from tests._zero_code import start_runs
from veronica_otel.testing import FakeLLMServer

APPS = Path(__file__).parent / "apps"
AGENT = APPS / "real_install_agent.py"
PROPAGATING = APPS / "propagating_agent.py"
CHAT = "/v1/chat/completions"
KEY = "k" * 32
TIMEOUT = 120


def _venv(name: str) -> Path:
    try:
        return _venvs.venv(name.lower(), getattr(_venvs, name))
    except subprocess.CalledProcessError as exc:  # say what pip said, do not hide it
        pytest.fail(f"building the {name} venv: {_venvs.build_error(exc)}")


@pytest.fixture(scope="module")
def recipe() -> Path:
    return _venv("RECIPE")


@pytest.fixture(scope="module")
def peers() -> Path:
    return _venv("PEERS")


@pytest.fixture
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=10) as server:
        yield server


def environment(llm: FakeLLMServer | None, **env: str) -> dict[str, str]:
    """This process's environment minus any VERONICA_/OTEL_/OPENAI_ setting and PYTHONPATH.

    ``llm`` None: no ``OPENAI_BASE_URL`` (each started run sets its own).
    """
    environ = _venvs.environ_without("VERONICA_", "OTEL_", "OPENAI_", "ANTHROPIC_", "PYTHON")
    if llm is not None:
        environ["OPENAI_BASE_URL"] = llm.openai_base_url
    environ.update(
        OPENAI_API_KEY="test-key",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OTEL_TRACES_EXPORTER="none",
        **_venvs.plain_http_tls(),
    )
    environ.update(env)
    return environ


def instrumented(
    venv: Path, llm: FakeLLMServer, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """``opentelemetry-instrument python <args>`` in ``venv``."""
    return subprocess.run(
        [str(venv / "bin" / "opentelemetry-instrument"), str(venv / "bin" / "python"), *args],
        env=environment(llm, **env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def steps(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("step ")]


def oks(result: subprocess.CompletedProcess[str]) -> int:
    return sum(line.endswith(" ok") for line in steps(result))


# -- runs that vary only their environment, started after the imports --------------

SELECTIONS = {
    "no-selection": {},  # whatever order the entry points come in here
    "theirs-first": {"OTEL_PYTHON_DISTRO": "distro", "OTEL_PYTHON_CONFIGURATOR": "configurator"},
    "ours-first": {"OTEL_PYTHON_DISTRO": "veronica", "OTEL_PYTHON_CONFIGURATOR": "veronica"},
}
# name: (script and arguments, environment); "{service}" is the run's own service
STARTED: dict[str, tuple[tuple[Path | str, ...], dict[str, str]]] = {
    **{
        f"recipe-{name}": ((AGENT,), {"VERONICA_MAX_STEPS": "3", **selection})
        for name, selection in SELECTIONS.items()
    },
    "malformed": ((AGENT,), {"VERONICA_MAX_STEPS": "3x"}),
    **{
        f"threads-{threads or 'default'}": ((AGENT, "threads"), {"VERONICA_THREADS": threads})
        for threads in ("", "false")
    },
    **{
        f"propagation-{name}": (
            (PROPAGATING,),
            {
                "SERVICE_URL": "http://{service}/orders",
                "VERONICA_PROPAGATE_HOSTS": "{service}",
                "VERONICA_GRANT_KEY": KEY,
                "VERONICA_MAX_STEPS": "10",
                # This service sends no spend-back, so its grant's whole carve is
                # charged (fail closed): carve 2 steps, not all 10.
                "VERONICA_GRANT_MAX_STEPS": "2",
                **selection,
            },
        )
        for name, selection in (("any", {}), ("ours", {"OTEL_PYTHON_DISTRO": "veronica"}))
    },
}
# A run's output, and its LLM and service (each run has its own: the counts are its own).
Run = tuple[subprocess.CompletedProcess[str], FakeLLMServer, FakeLLMServer]


@pytest.fixture(scope="module")
def started(recipe: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Run]]:
    """Every run of :data:`STARTED`, each a process of its own forked before start-up
    from one that imported what start-up and the apps import (:func:`start_runs`)."""
    with ExitStack() as stack:
        servers = {
            name: (
                stack.enter_context(FakeLLMServer(output_tokens=10)),
                stack.enter_context(FakeLLMServer()),
            )
            for name in STARTED
        }
        runs = {
            name: (
                argv,
                {
                    "OPENAI_BASE_URL": servers[name][0].openai_base_url,
                    **{
                        key: value.replace("{service}", f"127.0.0.1:{servers[name][1].port}")
                        for key, value in env.items()
                    },
                },
            )
            for name, (argv, env) in STARTED.items()
        }
        done = start_runs(
            recipe / "bin" / "python",
            runs,
            tmp_path_factory.mktemp("started"),
            environment(None),
        )
        yield {name: (done[name], *servers[name]) for name in STARTED}


# -- the standard recipe: two distros, two configurators, bootstrap's instrumentations


@pytest.mark.parametrize("selection", SELECTIONS)
def test_standard_recipe_sends_exactly_max_steps(started: dict[str, Run], selection: str) -> None:
    result, llm, _ = started[f"recipe-{selection}"]
    assert llm.count(CHAT) == 3, result.stderr
    assert oks(result) == 3
    assert all("steps limit reached" in line for line in steps(result)[3:]), result.stdout


def test_standard_recipe_with_a_broken_exporter_is_still_contained(
    recipe: Path, llm: FakeLLMServer
) -> None:
    # The configurator raises, so opentelemetry-instrument loads no instrumentor
    # at all: the start-up file is the door that still runs. A process started
    # by opentelemetry-instrument itself: the door is Python's own start-up.
    result = instrumented(
        recipe, llm, str(AGENT), VERONICA_MAX_STEPS="3", OTEL_TRACES_EXPORTER="nonexistent"
    )
    assert "Failed to auto initialize OpenTelemetry" in result.stderr
    assert llm.count(CHAT) == 3
    assert oks(result) == 3


def test_standard_recipe_reports_a_malformed_value_and_refuses_calls(
    started: dict[str, Run],
) -> None:
    result, llm, _ = started["malformed"]
    assert "VERONICA_MAX_STEPS='3x'" in result.stderr
    assert llm.count(CHAT) == 0
    assert all("VERONICA_MAX_STEPS" in line for line in steps(result)), result.stdout
    assert len(steps(result)) == 6


@pytest.mark.parametrize("threads", ["", "false"])
def test_threads_follow_the_chain_unless_turned_off(started: dict[str, Run], threads: str) -> None:
    result, llm, _ = started[f"threads-{threads or 'default'}"]
    # Carried into the pool: the chain's 2 steps; off: the pool's calls run
    # outside it (in the unlimited process default chain), all 4 sent.
    assert llm.count(CHAT) == (2 if threads == "" else 4), result.stderr
    assert oks(result) == llm.count(CHAT)


# -- zero-code propagation to your own service


@pytest.mark.parametrize("selection", ["any", "ours"])
def test_zero_code_propagates_to_your_service_and_sends_vendors_no_baggage(
    started: dict[str, Run], selection: str
) -> None:
    result, llm, service = started[f"propagation-{selection}"]
    assert result.stdout.strip() == "done", result.stderr
    (to_service,) = service.requests
    (to_vendor,) = llm.requests
    entries = dict(member.split("=", 1) for member in to_service.headers["baggage"].split(","))
    assert {"veronica.chain", "veronica.depth", "veronica.grant"} <= entries.keys()
    assert "traceparent" in to_service.headers  # opentelemetry-instrument turned theirs on
    assert "baggage" not in to_vendor.headers  # neither ours nor the app's tenant=acme


# -- pre-fork servers


def serve(recipe: Path, llm: FakeLLMServer, server: str, *args: str) -> tuple[list[str], str]:
    """Run ``server`` under opentelemetry-instrument on a socket we own; ten requests."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    bind = (
        [f"--bind=fd://{listener.fileno()}"]
        if server == "gunicorn"
        else [f"--fd={listener.fileno()}"]
    )
    proc = subprocess.Popen(
        [
            str(recipe / "bin" / "opentelemetry-instrument"),
            str(recipe / "bin" / server),
            *bind,
            *args,
        ],
        env=environment(llm, VERONICA_MAX_STEPS="2"),
        pass_fds=[listener.fileno()],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    listener.close()  # the server holds its copy; requests wait in its backlog
    try:
        answers = []
        for _ in range(10):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=TIMEOUT) as reply:
                answers.append(reply.read().decode())
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
    return answers, stderr


@pytest.mark.parametrize(
    ("server", "args"),
    [
        ("gunicorn", ("--preload", "--workers=2", f"--chdir={APPS}", "wsgi_agent:application")),
        ("uvicorn", ("--workers=2", f"--app-dir={APPS}", "asgi_agent:app")),
    ],
    ids=["gunicorn-preload", "uvicorn-workers"],
)
def test_pre_fork_server_two_workers_each_contained(
    recipe: Path, llm: FakeLLMServer, server: str, args: tuple[str, ...]
) -> None:
    answers, stderr = serve(recipe, llm, server, *args)
    sent = Counter(request.headers["x-worker"] for request in llm.requests)
    served = Counter(answer.split()[0] for answer in answers)
    assert sum(sent.values()) == sum(answer.endswith(" ok") for answer in answers)
    # A default chain per worker, VERONICA_MAX_STEPS each.
    assert all(count <= 2 for count in sent.values()), (sent, stderr[-2000:])
    assert all(answer.endswith((" ok", "BudgetExceededError")) for answer in answers), answers
    assert len(served) <= 2
    assert "Traceback" not in stderr, stderr[-2000:]  # no worker crashed


# -- peer GenAI instrumentors


def test_peers_under_zero_code_send_exactly_max_steps(peers: Path, llm: FakeLLMServer) -> None:
    # openai-v2 and OpenLLMetry load through their entry points, alongside ours.
    result = instrumented(peers, llm, str(AGENT), VERONICA_MAX_STEPS="3")
    assert llm.count(CHAT) == 3, result.stderr
    assert oks(result) == 3


# Each run's (stdout, stderr) by (peer, order), and every chat request's x-limit header.
PeerRuns = tuple[dict[tuple[str, str], tuple[str, str]], list[str]]
PEER_RUNS = [
    ("none", "ours-first"),  # with no peer, either order is the same run
    *(
        (name, order)
        for name in ("openai-v2", "openllmetry", "openlit")
        for order in ("peer-first", "ours-first")
    ),
]


@pytest.fixture(scope="module")
def peer_runs(peers: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PeerRuns]:
    """Each peer in each order: one process each, serving both limits one after the other.

    The processes are forked from one that imported openai, the SDK, ours and
    the peers' modules (``real_install_agent.py peers``): each instruments in
    its own order after the fork, as a process of its own would.
    """
    folder = tmp_path_factory.mktemp("peer-runs")
    runs = [f"{name}:{order}" for name, order in PEER_RUNS]
    with FakeLLMServer(output_tokens=10) as llm:
        done = subprocess.run(
            [str(peers / "bin" / "python"), str(AGENT), "peers", str(folder), *runs],
            env=environment(llm, OTEL_SDK_DISABLED="false"),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        outputs = {
            key: ((folder / f"{run}.out").read_text(), (folder / f"{run}.err").read_text())
            for key, run in zip(PEER_RUNS, runs, strict=True)
        }
        assert done.returncode == 0, (done.stderr[-3000:], outputs)
        yield outputs, [r.headers.get("x-limit", "") for r in llm.requests if r.path == CHAT]


@pytest.mark.parametrize("limit", ["steps", "cost"])
def test_each_peer_in_either_order_leaves_every_limit_exact(
    peer_runs: PeerRuns, limit: str
) -> None:
    outputs, sent_with = peer_runs
    outcomes = {}
    for key, (stdout, stderr) in outputs.items():
        lines = [line.removeprefix(f"{limit}: ") for line in stdout.splitlines()]
        outcomes[key] = [line for line in lines if line.startswith("step ")]
        assert len(outcomes[key]) == 6, (key, stdout, stderr[-3000:])
        spans = next(json.loads(line[7:]) for line in lines if line.startswith("spans: "))
        # One CLIENT span per call, sent or refused: a peer's, with our
        # attributes on it, or ours when no peer describes the call.
        assert spans == {"ours": 6, "theirs": 0}, (key, spans)
    sent = [sum(line.endswith(" ok") for line in lines) for lines in outcomes.values()]
    # Every run refused the same calls as the run without a peer, and the
    # server saw exactly the calls the apps saw succeed.
    expected = 3 if limit == "steps" else sent[0]
    assert 0 < expected < 6
    assert sent == [expected] * len(outputs), dict(zip(outputs, sent, strict=True))
    assert sent_with.count(limit) == expected * len(outputs)
