"""Ships ``veronica_otel_zero_code.pth`` at the top of site-packages.

Python runs it at start-up. It does nothing unless the process runs under
``opentelemetry-instrument``; then it makes zero-code containment install
after OpenTelemetry's initialisation even when a configurator or exporter
failed and no instrumentor was loaded (see ``veronica_otel.startup._autostart``).
Regular and editable (``pip install -e``) installs both get it. Everything
else is in pyproject.toml.
"""

import shutil
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = "veronica_otel_zero_code.pth"
SOURCE = Path(__file__).resolve().parent / "src" / PTH


class BuildWithStartupFile(build_py):  # type: ignore[misc]
    def run(self) -> None:
        super().run()
        self.copy_file(str(SOURCE), str(Path(self.build_lib) / PTH))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / PTH)]


class EditableWithStartupFile(editable_wheel):  # type: ignore[misc]
    # Files left at the root of the unpacked editable wheel are installed
    # into site-packages as they are.
    def _run_build_commands(self, dist_name: str, unpacked_wheel: str, *args: Any) -> Any:
        result = super()._run_build_commands(dist_name, unpacked_wheel, *args)
        shutil.copy(SOURCE, Path(unpacked_wheel) / PTH)
        return result


setup(cmdclass={"build_py": BuildWithStartupFile, "editable_wheel": EditableWithStartupFile})
