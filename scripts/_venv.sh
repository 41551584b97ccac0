# Sourced by the other scripts: make .venv with the project and its dev extras.
# Works on a fresh machine that has only Python, pip and apt.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    echo "python venv support missing; installing python3-venv with apt" >&2
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
fi
stamp=.venv/.veronica-installed
if [ ! -x .venv/bin/python ] || [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "setting up .venv (pip install -e '.[dev]')" >&2
    "$PYTHON" -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e '.[dev]'
    touch "$stamp"
fi
