"""The release artefacts: what ``python -m build`` makes installs and runs.

``python -m build`` builds the sdist, then the wheel *from the sdist*, as a
release does: a file the wheel needs but the sdist lacks (the zero-code
start-up file once was) fails here. It builds without isolation in a cached
venv holding exactly the build requirements pyproject.toml declares
(:data:`tests._venvs.BUILD`), which build checks before it starts. The wheel
is then installed into a venv holding its dependencies only, pip checks they
satisfy what the wheel declares, and the quick-start example runs from it,
outside the checkout.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests import _venvs

QUICKSTART = _venvs.ROOT / "examples" / "quickstart.py"
TIMEOUT = 600
# What the venvs run with: not this checkout's sources on the path.
ENV = _venvs.environ_without("PYTHON")
# What the wheel declares it needs, and the quick start's SDK: read from
# pyproject.toml, so the venv cannot lean on what another package pulled in.
_PROJECT = tomllib.loads((_venvs.ROOT / "pyproject.toml").read_text())["project"]
RUNTIME = (*_PROJECT["dependencies"], *_PROJECT["optional-dependencies"]["openai"])


def _venv(name: str, steps: tuple[tuple[str, ...], ...]) -> Path:
    try:
        return _venvs.venv(name, steps)
    except subprocess.CalledProcessError as exc:  # say what pip said, do not hide it
        pytest.fail(f"building the {name} venv: {_venvs.build_error(exc)}")


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    python = str(_venv("build", _venvs.BUILD) / "bin" / "python")
    with _venvs._checkout_copy() as checkout:
        built = subprocess.run(  # noqa: PLW1510 (the returncode is asserted with pip's output)
            [python, "-m", "build", "--no-isolation", "--outdir", str(out), str(checkout)],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            env=ENV,
        )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    return out


def test_twine_accepts_the_sdist_and_the_wheel(dist: Path) -> None:
    files = sorted(map(str, dist.iterdir()))
    assert sorted(Path(f).suffix for f in files) == [".gz", ".whl"]
    checked = subprocess.run(  # noqa: PLW1510
        [sys.executable, "-m", "twine", "check", "--strict", *files],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_wheel_carries_the_startup_file_the_types_and_the_license(dist: Path) -> None:
    (wheel,) = dist.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "veronica_otel_zero_code.pth" in names  # zero code's start-up hook
    assert "veronica_otel/py.typed" in names
    assert "veronica_otel/instrumentors/openai.py" in names  # symlinked folders followed
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)


def test_the_sdist_and_the_wheel_carry_every_lua_script(dist: Path) -> None:
    # The shared ledger reads its scripts from package data at import.
    lua = sorted(p.name for p in (_venvs.ROOT / "src/veronica_otel/distributed/lua").glob("*.lua"))
    assert "reserve.lua" in lua
    (wheel,) = dist.glob("*.whl")
    in_wheel = [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".lua")]
    assert sorted(n.removeprefix("veronica_otel/distributed/lua/") for n in in_wheel) == lua
    (sdist,) = dist.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        in_sdist = [n for n in tar.getnames() if n.endswith(".lua")]
    assert sorted(n.rsplit("/", 1)[1] for n in in_sdist) == lua
    assert all("/src/veronica_otel/distributed/lua/" in n for n in in_sdist)


def test_the_installed_wheel_runs_the_quickstart(dist: Path, tmp_path: Path) -> None:
    # The dependencies come from a cached venv; the wheel itself goes in fresh
    # (the cached third-party set is not reinstalled), and pip checks that the
    # venv satisfies every requirement the wheel declares.
    venv = _venv("release", (RUNTIME,))
    python = str(venv / "bin" / "python")
    (wheel,) = dist.glob("*.whl")
    for pip in (["install", "-q", "--force-reinstall", "--no-deps", str(wheel)], ["check"]):
        done = subprocess.run(  # noqa: PLW1510
            [python, "-m", "pip", *pip], capture_output=True, text=True, timeout=TIMEOUT, env=ENV
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = subprocess.run(  # noqa: PLW1510
        [python, str(QUICKSTART)],
        cwd=tmp_path,  # not the checkout: the wheel is what is imported
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "requests the server received: 3\n" in out.stdout
    installed = subprocess.run(  # where it came from, and the scripts read as the ledger reads them
        [
            python,
            "-c",
            "import veronica_otel; from importlib.resources import files; "
            "print(veronica_otel.__file__); "
            "print(len(files('veronica_otel').joinpath('distributed', 'lua', 'reserve.lua')"
            ".read_text()))",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        env=ENV,
    )
    where, lua = installed.stdout.splitlines()
    assert str(venv) in where
    assert int(lua) > 1000


def test_every_entry_point_and_the_startup_file_name_a_module_the_wheel_ships(
    dist: Path,
) -> None:
    (wheel,) = dist.glob("*.whl")
    archive = zipfile.ZipFile(wheel)
    names = set(archive.namelist())
    (entry_points,) = (n for n in names if n.endswith(".dist-info/entry_points.txt"))
    targets = {
        line.split("=", 1)[1].strip().split(":")[0]
        for line in archive.read(entry_points).decode().splitlines()
        if "=" in line
    }
    startup = archive.read("veronica_otel_zero_code.pth").decode()
    targets.add(startup.split("__import__('", 1)[1].split("'", 1)[0])
    assert "veronica_otel.startup.distro" in targets
    assert "veronica_otel.startup._autostart" in targets
    for module in targets:
        path = module.replace(".", "/")
        assert f"{path}.py" in names or f"{path}/__init__.py" in names, module
