"""The application ``spark-submit`` runs: ``txjoin run``'s options on spark-submit's session.

``spark-submit [...] txjoin/submit.py JOB.py [txjoin run options]`` (client mode, or
cluster mode on YARN and Kubernetes), or on a standalone master, whose cluster mode
refuses Python applications (SparkSubmit: "Cluster deploy mode is currently not supported
for python applications on standalone clusters"), as a JVM application:
``--deploy-mode cluster --supervise --class txjoin.submit.PythonDriver txjoin-submit.jar
txjoin/submit.py JOB.py [...]``. That class (``jvm/submit``) starts this file through
Spark's own ``PythonRunner``, as spark-submit does for a ``.py`` application in client mode.
``txjoin submit-line`` prints the whole line for a job, and ``txjoin package`` builds the
environment archive that ships txjoin to the executors (``--archives``).

The master, the jars and every Spark setting are spark-submit's (``--master`` is not an
option here); in cluster mode the checkpoint and output must be absolute paths every
node reaches (``txjoin.api.resolve_paths``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _die_with_parent() -> None:
    """Have Linux kill this process when the JVM that started it dies.

    Spark's ``PythonRunner`` (the driver JVM) starts the Python driver as its child. A
    driver JVM killed with ``kill -9`` (or by the OOM killer) otherwise leaves this
    process behind, its Delta committer still writing while a supervised restart's new
    driver commits the same hand-off: two writers of one table."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1  # <linux/prctl.h>
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() == 1:  # the JVM died before prctl took effect
        os._exit(1)


STANDALONE_SCHEME = "spark://"
LAUNCHER_CLASS = "txjoin.submit.PythonDriver"
"""jvm/submit's main class (scripts/jars.sh compiles it: ``txjoin.jvm.submit_jar``)."""


def submit_line(master: str, job_file: str, run_args: list[str], python: str,
                spark_submit: str = "spark-submit", archive: str | None = None) -> list[str]:
    """The ``spark-submit`` command that runs ``job_file`` with ``run_args`` (``txjoin run``'s
    options) in cluster mode on ``master``.

    On a standalone master (``spark://``) the driver is supervised and submitted as txjoin's
    JVM launcher; everything local is named by an absolute path, which must be the same on
    every worker: the interpreter ``python`` (of an environment with txjoin), this launcher
    file, the job file and the jars. With ``archive`` (``txjoin package``'s environment) the
    executors run the archive's interpreter, unpacked in their working directory; the driver
    still runs ``python`` (a standalone worker unpacks archives for executors only).

    On YARN or Kubernetes (``archive`` required) the application is this file, the job file
    goes with ``--files`` and both driver and executors run the archive's interpreter."""
    from txjoin.errors import ConfigError
    from txjoin.jvm import spark_jars, submit_jar
    from txjoin.package import ENV_ALIAS, ENV_PYTHON
    from txjoin.pipeline.session import default_conf

    standalone = master.startswith(STANDALONE_SCHEME)
    if not standalone and archive is None:
        raise ConfigError(f"--master {master}: on YARN or Kubernetes spark-submit runs "
                          f"txjoin/submit.py itself with txjoin's environment shipped as an "
                          f"archive: build one with `txjoin package` and pass --archive "
                          f"(docs/production.md)")
    conf = default_conf()
    java = conf.pop("spark.executor.extraJavaOptions")
    conf["spark.driver.extraJavaOptions"] = java  # not the class archive of this machine
    conf["spark.executor.extraJavaOptions"] = java
    conf.pop("spark.jars")  # as --jars
    name = f"txjoin-{os.path.splitext(os.path.basename(job_file))[0]}"
    line = [spark_submit, "--master", master, "--deploy-mode", "cluster"]
    line += ["--supervise", "--name", name] if standalone else ["--name", name]
    if archive is not None:
        line += ["--archives", f"{os.path.abspath(archive)}#{ENV_ALIAS}"]
        conf["spark.pyspark.python"] = ENV_PYTHON
        if standalone:
            conf["spark.pyspark.driver.python"] = python
    else:
        conf["spark.pyspark.python"] = python  # the driver's and the executors' interpreter
    line += ["--jars", spark_jars()]
    if not standalone:
        line += ["--files", os.path.abspath(job_file)]
    for key, value in conf.items():
        line += ["--conf", f"{key}={value}"]
    if not standalone:  # the job file is in the driver's working directory
        return [*line, os.path.abspath(__file__), os.path.basename(job_file), *run_args]
    return [*line, "--class", LAUNCHER_CLASS, str(submit_jar()), os.path.abspath(__file__),
            os.path.abspath(job_file), *run_args]


@dataclass(frozen=True)
class Submitted:
    """What spark-submit decided for the run: its master, its deploy mode, and its session,
    made by :meth:`session` once the run's checks passed (``txjoin.pipeline.run``)."""

    master: str
    deploy_mode: str

    def session(self) -> SparkSession:
        """The session with spark-submit's settings (master, jars, extensions) as they are."""
        from pyspark.sql import SparkSession

        return SparkSession.builder.getOrCreate()


def _env_beside_the_driver(executors_python: str | None) -> None:
    """With ``txjoin package``'s archive, make ``./env`` the driver's own environment (a link
    to it) in the driver's working directory when nothing unpacked the archive there.

    The Python processes Spark starts on the driver (a query's pre-init process, data
    source planners) run the executors' interpreter, ``./env/bin/python``, relative to the
    driver's folder, where a standalone worker unpacks no archive (it does for executors;
    YARN and Kubernetes unpack it for the driver too, and then ``./env`` is there)."""
    from txjoin.package import ENV_ALIAS, ENV_PYTHON

    if executors_python == ENV_PYTHON and not os.path.lexists(ENV_ALIAS):
        os.symlink(sys.prefix, ENV_ALIAS)


def main(argv: list[str] | None = None) -> None:
    """``txjoin run`` with ``argv`` (JOB.py and its options) on spark-submit's session."""
    from pyspark import SparkConf, SparkContext

    from txjoin.cli import main as cli

    _die_with_parent()
    # spark-submit's settings are its JVM's: connect to it (PythonRunner's gateway) first,
    # or SparkConf is an empty one of its own (master None, deploy mode client). No
    # SparkContext yet: the run makes its session once its checks passed.
    SparkContext._ensure_initialized()
    conf = SparkConf()
    submitted = Submitted(str(conf.get("spark.master")),
                          str(conf.get("spark.submit.deployMode", "client")))
    _env_beside_the_driver(os.environ.get("PYSPARK_PYTHON"))  # spark.pyspark.python's
    cli.main(args=["run", *(sys.argv[1:] if argv is None else argv)],
             prog_name="txjoin.submit", obj=submitted)


if __name__ == "__main__":
    # Run as a file (PythonRunner runs a file, not a module): Python put this file's folder,
    # the txjoin package, first on sys.path, where its modules would shadow others.
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        del sys.path[0]
    from txjoin.submit import main as submitted

    submitted()
