"""``txjoin package``: txjoin and its dependencies as one environment archive for a cluster.

Spark ships a Python environment to a cluster's nodes the way it ships jars: an archive
given to ``spark-submit --archives ARCHIVE#env`` is unpacked into each executor's working
directory (and, on YARN and Kubernetes, the driver's), and ``spark.pyspark.python=
./env/bin/python`` runs the Python workers there (Spark's "Python Package Management").
This builds that archive from the txjoin at hand:

- txjoin's own wheel, built from its source checkout (``uv build``), installed without
  its editable link;
- its runtime dependencies at exactly the versions this environment runs (every installed
  distribution's version is a constraint), so the cluster runs what was tested here;
- pyspark's Python modules, at the version txjoin pins, without its jars (~460 MB; the JVM
  is the cluster's): a Spark distribution puts its own ``pyspark.zip`` first on its Python
  workers' path, which then wins, while a Spark from pip's pyspark (as txjoin's own
  ``SPARK_HOME``, ``txjoin.jvm.spark_home``) puts none there. The build tools (uv,
  venv-pack2) are not installed;
- packed with venv-pack2, which makes the environment relocatable. Its ``bin/python``
  stays a link to the interpreter it was made from (``--python-prefix`` names where that
  interpreter is on the cluster's nodes instead): the nodes need a CPython of the same
  minor version there.

The build tools are the ``package`` extra (``pip install 'txjoin[package]'``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from txjoin.errors import ConfigError

ENV_ALIAS = "env"
"""The folder the archive is unpacked into on a node (``--archives ARCHIVE#env``)."""
ENV_PYTHON = f"./{ENV_ALIAS}/bin/python"
"""The interpreter of the unpacked archive, relative to the working directory of a node's
executor (and of the driver on YARN and Kubernetes): ``spark.pyspark.python``."""
DEFAULT_ARCHIVE = Path("dist") / "txjoin-env.tar.gz"
ARCHIVE_FORMATS = (".tar.gz", ".tgz")
"""The names of archives that Spark unpacks as tar (``Utils.unpack``) and venv-pack writes
compressed, keeping ``bin/python``'s link (a zip would not)."""

JVM_PARTS = ("pyspark/jars",)
"""What of the installed pyspark the archive leaves out: Spark's jars, the cluster's."""

COMPRESS_LEVEL = 1
"""gzip level of the archive (``--compress-level``): venv-pack's default, 4, made it 8 %
smaller (159 against 173 MB) in 1.5x the time (17.8 against 11.5 s, 2 cores); a cluster
unpacks it once per executor. 0 stores it uncompressed in gzip's frame (~480 MB): no
deflate to pack, and each unpack's gunzip only checks it (~3.5 -> ~0.5 s of CPU here),
for a cluster whose network is no bound. A plain ``.tar`` Spark unpacks in Java
(Hadoop's ``unTarUsingJava``), which refuses the archive: its ``bin/python`` links out
of it ("would create entry outside of" the folder)."""


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_requirements() -> list[str]:
    """txjoin's own runtime requirements: not its extras (the build tools, uv and
    venv-pack2, are the ``package`` extra)."""
    requires = importlib.metadata.requires("txjoin") or []
    return [_name(r) for r in requires if "extra ==" not in r]


def constraints() -> list[str]:
    """``name==version`` of every distribution installed here but txjoin: the versions the
    archive installs."""
    found = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name and _canonical(name) != "txjoin":
            found[_canonical(name)] = f"{name}=={dist.version}"
    return sorted(found.values())


def source_root() -> Path:
    """The source checkout of the txjoin that runs (its wheel is built from it)."""
    import txjoin

    root = Path(txjoin.__file__).resolve().parent.parent
    project = root / "pyproject.toml"
    if not project.is_file() or 'name = "txjoin"' not in project.read_text():
        raise ConfigError(f"txjoin package builds txjoin's wheel from its source checkout, "
                          f"and this txjoin ({root}) is installed from a wheel: run it from "
                          f"a clone of the repository (bash scripts/setup.sh)")
    return root


def inputs_digest(python_prefix: str | None = None, suffix: str = ".tar.gz",
                  compress_level: int = COMPRESS_LEVEL) -> str:
    """A digest of everything :func:`build_archive` builds from: txjoin's source checkout
    (every file of its package, this module's build steps with them, and pyproject.toml),
    the versions installed here (:func:`constraints`), this interpreter, ``python_prefix``,
    the format and its gzip level. Equal digests, equal archives' contents: a cache of archives keys
    them by it (the tests build one per digest)."""
    root = source_root()
    digest = hashlib.sha256()
    for part in (sys.version, str(python_prefix), suffix, str(compress_level), *JVM_PARTS,
                 *constraints()):
        digest.update(part.encode() + b"\0")
    files = [root / "pyproject.toml",
             *(p for p in (root / "txjoin").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts)]
    for path in sorted(files):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def _tools() -> tuple[str, Any]:
    try:
        import uv
        import venv_pack
    except ImportError as missing:
        raise ConfigError(f"txjoin package needs the package extra ({missing.name} is "
                          f"missing): pip install -e '.[package]' in txjoin's checkout, or "
                          f"bash scripts/setup.sh") from None
    return uv.find_uv_bin(), venv_pack


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ConfigError(f"txjoin package: {what} failed (exit {done.returncode}): "
                          f"{last[0]}; run `{' '.join(command)}` to see why")


def build_archive(out: Path, python_prefix: str | None = None, progress: bool = True,
                  compress_level: int = COMPRESS_LEVEL) -> Path:
    """Build the environment archive at ``out`` (replacing one there); its absolute path."""
    if not out.name.endswith(ARCHIVE_FORMATS):
        raise ConfigError(f"--out {out}: an archive's name ends with one of "
                          f"{', '.join(ARCHIVE_FORMATS)} (its format), e.g. {DEFAULT_ARCHIVE}")
    uv, venv_pack = _tools()
    root = source_root()
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)

    def say(line: str) -> None:
        if progress:
            print(f"txjoin package: {line}", file=sys.stderr, flush=True)

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="txjoin-package-") as work:
        wheels, env, pins = Path(work) / "wheels", Path(work) / ENV_ALIAS, Path(work) / "c.txt"
        say(f"building txjoin's wheel from {root}")
        _run([uv, "build", "--quiet", "--wheel", "--out-dir", str(wheels), str(root)],
             "building txjoin's wheel")
        wheel = next(wheels.glob("txjoin-*.whl"))
        say(f"installing {wheel.name} and its dependencies (pyspark without its jars)")
        _run([uv, "venv", "--quiet", "--python", sys.executable, str(env)],
             "creating the environment")
        python = str(env / "bin" / "python")
        _run([uv, "pip", "install", "--quiet", "--python", python, "--no-deps", str(wheel)],
             "installing txjoin's wheel")
        pins.write_text("\n".join(constraints()) + "\n")
        _run([uv, "pip", "install", "--quiet", "--python", python, "--constraint", str(pins),
              *runtime_requirements()], "installing txjoin's dependencies")
        site = next((env / "lib").glob("python*/site-packages"))
        for part in JVM_PARTS:
            shutil.rmtree(site / part, ignore_errors=True)
        say(f"packing the environment into {out}")
        partial = out.with_name(f".partial-{out.name}")  # the format is the name's
        partial.unlink(missing_ok=True)
        venv_pack.pack(prefix=str(env), output=str(partial), python_prefix=python_prefix,
                       compress_level=compress_level, force=True)
        partial.chmod(0o644)  # venv-pack writes it for its owner only
        partial.replace(out)
    say(f"{out} ({out.stat().st_size / 2**20:.0f} MiB) in {time.monotonic() - started:.0f} s")
    return out

