"""Where a peer runs: an interpreter of its own (its own venv), or a one-line reason it cannot.

Each peer's engine pins libraries that clash with pyspark 4.2's (PyFlink) or brings a
large tree of its own (Pathway), so it runs as a child process of an interpreter that
imports it: ``$TXJOIN_<PEER>_PYTHON``, else this one if it can import the engine, else
``.venv-<peer>/bin/python`` at the repository root (made by ``scripts/<peer>-env.sh``).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class PeerUnavailable(Exception):
    """The peer cannot run here; the message is the one-line reason."""


@dataclass(frozen=True)
class PeerEnvironment:
    """How one peer's interpreter is found, and what to say when it is not."""

    label: str  # as the reason names it: "PyFlink", "Pathway"
    venv: str  # .venv-flink: also the suffix of the script and the variable
    probe: str  # the module the interpreter must import
    package: str  # the top-level package, to try this interpreter first

    @property
    def variable(self) -> str:
        """``TXJOIN_FLINK_PYTHON``: the interpreter a user points at."""
        return f"TXJOIN_{self.venv.removeprefix('.venv-').upper()}_PYTHON"

    @property
    def script(self) -> str:
        """``scripts/flink-env.sh``: what makes the venv."""
        return f"scripts/{self.venv.removeprefix('.venv-')}-env.sh"

    def python(self) -> str:
        """An interpreter that imports ``probe``, or PeerUnavailable."""
        candidates = []
        if os.environ.get(self.variable):
            candidates.append(os.environ[self.variable])
        if importlib.util.find_spec(self.package) is not None:
            candidates.append(sys.executable)
        candidates.append(str(ROOT / self.venv / "bin" / "python"))
        for python in candidates:
            if not Path(python).exists():
                continue
            probe = subprocess.run([python, "-c", f"import {self.probe}"], capture_output=True,
                                   timeout=120, check=False)
            if probe.returncode == 0:
                return python
        raise PeerUnavailable(f"{self.label} is not installed: run `bash {self.script}` (it "
                              f"creates {self.venv}), or set {self.variable}")


def last_error(log: Path) -> str:
    """The last line of a peer's log that names an exception or an error (one line)."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines()
             if "Exception" in line or "Error" in line]
    return lines[-1][:300] if lines else "no error message"
