"""Ships ``veronica_otel_zero_code.pth`` at the top of site-packages.

Python runs it at start-up. It does nothing unless the process runs under
``opentelemetry-instrument``; then it makes zero-code containment install
after OpenTelemetry's initialisation even when a configurator or exporter
failed and no instrumentor was loaded (see ``veronica_otel._autostart``).
Everything else is in pyproject.toml.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "veronica_otel_zero_code.pth"


class BuildWithStartupFile(build_py):  # type: ignore[misc]
    def run(self) -> None:
        super().run()
        self.copy_file(str(Path("src") / PTH), str(Path(self.build_lib) / PTH))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / PTH)]


setup(cmdclass={"build_py": BuildWithStartupFile})
