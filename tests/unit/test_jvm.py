"""The SPARK_HOME txjoin's sessions start from (``txjoin.jvm.spark_home``)."""

from __future__ import annotations

from pathlib import Path

import pyspark
import pytest

from txjoin.jvm import JARS_ENV, SPARK_HOME_PARTS, spark_home

pytestmark = pytest.mark.unit


def test_the_spark_home_links_pysparks_launchers_and_jars_and_has_no_python_zips(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(JARS_ENV, str(tmp_path))
    real = Path(pyspark.__file__).resolve().parent
    assert (real / "python" / "lib" / "pyspark.zip").is_file()  # what the home leaves out
    home = spark_home()
    assert home.parent == tmp_path and home.name.startswith("spark-home-")
    assert sorted(p.name for p in home.iterdir()) == sorted(SPARK_HOME_PARTS)
    for part in SPARK_HOME_PARTS:
        assert (home / part).resolve() == real / part
    assert (home / "bin" / "spark-submit").is_file()
    assert not (home / "python").exists()
    assert spark_home() == home  # made once
    assert [p.name for p in tmp_path.iterdir()] == [home.name]  # no partial folder left


def test_without_a_writable_folder_the_spark_home_is_pysparks_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv(JARS_ENV, str(blocked / "jars"))  # a folder under a file: cannot be
    assert spark_home() == Path(pyspark.__file__).resolve().parent
