"""txjoin's Hadoop local file system (jvm/localfs): Hadoop's outcome without a process per file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from txjoin.jvm import local_fs_jar

pytestmark = pytest.mark.spark


def test_a_local_session_creates_files_and_tells_links_as_hadoop_does_without_a_process(
        spark: SparkSession, tmp_path: Path) -> None:
    assert local_fs_jar() is not None, "scripts/jars.sh builds it where javac is at hand"
    jvm = spark._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    root = jvm.org.apache.hadoop.fs.Path(tmp_path.as_uri())
    fs = root.getFileSystem(conf)
    assert fs.getClass().getName() == "txjoin.hadoop.NioLocalFileSystem"
    raw = fs.getRawFileSystem()
    assert raw.getClass().getName() == "txjoin.hadoop.NioRawLocalFileSystem"

    # a new directory and file get Hadoop's default permissions under its umask (022)
    folder = jvm.org.apache.hadoop.fs.Path(root, "a/b")
    assert fs.mkdirs(folder)
    out = fs.create(jvm.org.apache.hadoop.fs.Path(folder, "f"), False)
    out.write(b"x")
    out.close()
    assert stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "a" / "b" / "f").stat().st_mode) == 0o644
    raw.setPermission(jvm.org.apache.hadoop.fs.Path(folder, "f"),
                      jvm.org.apache.hadoop.fs.permission.FsPermission(0o640))
    assert stat.S_IMODE((tmp_path / "a" / "b" / "f").stat().st_mode) == 0o640

    # a path's link status as Hadoop's own gives it (for a qualified path Hadoop's readlink
    # process is given the "file:" URI and finds no link: the link's target is described)
    os.symlink(tmp_path / "a" / "b" / "f", tmp_path / "link")
    hadoops = jvm.org.apache.hadoop.fs.RawLocalFileSystem()
    hadoops.initialize(root.toUri(), conf)
    for name in ("link", "a/b/f", "a/b", "a"):
        path = jvm.org.apache.hadoop.fs.Path(root, name)
        ours, theirs = raw.getFileLinkStatus(path), hadoops.getFileLinkStatus(path)
        assert (ours.isSymlink(), ours.isFile(), ours.getLen(), ours.getPath().toString()) == (
            theirs.isSymlink(), theirs.isFile(), theirs.getLen(), theirs.getPath().toString())
    for file_system in (raw, hadoops):
        with pytest.raises(Exception, match="FileNotFoundException"):
            file_system.getFileLinkStatus(jvm.org.apache.hadoop.fs.Path(root, "missing"))

    # FileContext (Delta's log store) goes through the same file system
    context = jvm.org.apache.hadoop.fs.FileContext.getFileContext(root.toUri(), conf)
    assert context.getDefaultFileSystem().getClass().getName() == "txjoin.hadoop.NioLocalFs"
