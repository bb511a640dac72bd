"""The SPARK_HOME txjoin's sessions start from (``txjoin.jvm.spark_home``), and the JDK their
driver runs on (``txjoin.jvm.spark_java_home``)."""

from __future__ import annotations

from pathlib import Path

import pyspark
import pytest

from txjoin import jvm
from txjoin.errors import ConfigError
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


def _jdk(root: Path, name: str, version: str | None) -> Path:
    """A JDK's folder: ``bin/java``, and a ``release`` file saying ``version`` (none: no file)."""
    home = root / name
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "java").write_text("#!/bin/sh\n")
    (home / "bin" / "java").chmod(0o755)  # (shutil.which finds executables only)
    if version is not None:
        (home / "release").write_text(f'IMPLEMENTOR="x"\nJAVA_VERSION="{version}"\n')
    return home


@pytest.fixture
def jdks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A JDK root with OpenJDK 17 (the ``java`` on PATH) and nothing else yet."""
    root = tmp_path / "jvm"
    on_path = _jdk(root, "java-17-openjdk-amd64", "17.0.15")
    monkeypatch.setattr(jvm, "JDK_ROOTS", (root,))
    monkeypatch.setenv("PATH", str(on_path / "bin"))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.delenv(jvm.SPARK_JAVA_HOME_ENV, raising=False)
    return root


def test_a_jdks_version_is_read_from_its_release_file(tmp_path: Path) -> None:
    assert jvm.java_version(_jdk(tmp_path, "a", "25.0.3")) == (25, 0, 3)
    assert jvm.java_version(_jdk(tmp_path, "b", "21")) == (21,)
    assert jvm.java_version(tmp_path / "none") is None


@pytest.mark.parametrize(("version", "supported"), [
    ((17, 0, 15), True), ((21, 0, 1), True), ((25, 0, 3), True), ((25, 1), True),
    ((25, 0, 2), False), ((11, 0, 20), False), ((22,), False), ((26,), False)])
def test_the_javas_spark_runs_on(version: tuple[int, ...], supported: bool) -> None:
    assert jvm.spark_supports(version) is supported


def test_the_driver_runs_on_the_newest_jdk_spark_supports(jdks: Path) -> None:
    assert jvm.spark_java_home() is None  # only the java on PATH
    _jdk(jdks, "temurin-25-jdk-amd64-old", "25.0.2")  # deprecated by Spark: passed over
    _jdk(jdks, "jdk-26", "26.0.1")  # not supported by Spark 4.2: passed over
    assert jvm.spark_java_home() is None
    newer = _jdk(jdks, "temurin-21-jdk-amd64", "21.0.9")
    assert jvm.spark_java_home() == newer
    newest = _jdk(jdks, "temurin-25-jdk-amd64", "25.0.3")
    assert jvm.spark_java_home() == newest
    assert jvm.spark_java() == (newest / "bin" / "java").resolve()


def test_the_users_choice_of_jdk_wins(jdks: Path, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _jdk(jdks, "temurin-25-jdk-amd64", "25.0.3")
    mine = _jdk(tmp_path, "mine", "17.0.2")
    monkeypatch.setenv("JAVA_HOME", str(mine))
    assert jvm.spark_java_home() is None  # spark-submit takes $JAVA_HOME itself
    assert jvm.spark_java() == (mine / "bin" / "java").resolve()
    monkeypatch.setenv(jvm.SPARK_JAVA_HOME_ENV, str(jdks / "java-17-openjdk-amd64"))
    assert jvm.spark_java_home() == jdks / "java-17-openjdk-amd64"


def test_a_jdk_folder_without_java_is_refused_in_one_line(
        jdks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(jvm.SPARK_JAVA_HOME_ENV, str(tmp_path / "no-jdk"))
    with pytest.raises(ConfigError, match=r"TXJOIN_SPARK_JAVA_HOME is '.*no-jdk', which has "
                                          r"no bin/java: set it to a JDK's folder"):
        jvm.spark_java_home()


def test_a_java_on_path_of_unknown_version_keeps_the_driver_on_it(
        jdks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _jdk(jdks, "temurin-25-jdk-amd64", "25.0.3")
    monkeypatch.setenv("PATH", str(_jdk(tmp_path, "bare", None) / "bin"))
    assert jvm.spark_java_home() is None


def test_a_java_on_path_as_new_as_any_keeps_the_driver_on_it(jdks: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    home = _jdk(jdks, "temurin-25-jdk-amd64", "25.0.3")
    monkeypatch.setenv("PATH", str(home / "bin"))
    assert jvm.spark_java_home() is None
