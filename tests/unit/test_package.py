"""``txjoin.package.inputs_digest``: the key of the tests' archive cache
(tests/fixtures/env_archive.py) changes with every input of the archive, and only then."""

from __future__ import annotations

from pathlib import Path

import pytest

from txjoin import package


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A source checkout of txjoin's shape, with two installed versions."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "txjoin"\n')
    (tmp_path / "txjoin" / "sinks").mkdir(parents=True)
    (tmp_path / "txjoin" / "__init__.py").write_text("")
    (tmp_path / "txjoin" / "sinks" / "delta.py").write_text("A = 1\n")
    monkeypatch.setattr(package, "source_root", lambda: tmp_path)
    monkeypatch.setattr(package, "constraints", lambda: ["numpy==2.0.0", "pandas==2.2.0"])
    return tmp_path


def test_the_archive_digest_changes_with_each_input_and_not_with_compiled_files(
        checkout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = package.inputs_digest()
    assert package.inputs_digest() == before
    (checkout / "txjoin" / "__pycache__").mkdir()
    (checkout / "txjoin" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    assert package.inputs_digest() == before  # compiled files are not the wheel's
    assert package.inputs_digest(python_prefix="/opt/python") != before
    assert package.inputs_digest(suffix=".tgz") != before
    assert package.inputs_digest(compress_level=0) != before
    (checkout / "txjoin" / "sinks" / "delta.py").write_text("A = 2\n")
    edited = package.inputs_digest()
    assert edited != before
    (checkout / "txjoin" / "sinks" / "stage.py").write_text("")
    added = package.inputs_digest()
    assert added != edited
    (checkout / "pyproject.toml").write_text('[project]\nname = "txjoin"\nversion = "2"\n')
    assert package.inputs_digest() != added
    again = package.inputs_digest()
    monkeypatch.setattr(package, "constraints", lambda: ["numpy==2.0.1", "pandas==2.2.0"])
    assert package.inputs_digest() != again
