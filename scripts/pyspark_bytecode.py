"""Add compiled modules to the zips Spark's Python processes import pyspark and py4j from.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and ``py4j-*-src.zip`` first on the
PYTHONPATH of every Python process it starts: the Python workers' daemons, a Python data
source's planners, the streaming source runner, each query's pre-init process. pip's pyspark
ships those zips with sources only, and Python compiles a module from a zip's source each
time a process imports it (it never writes a compiled module back into a zip): importing
pyspark's streaming worker modules took 1.4 s of CPU from the zip against 0.3 s from
site-packages' compiled copy, in every such process (issue 34; a cold `txjoin replay`
starts ~13 of them, every query start two).

This writes, next to each source in the zip, the module compiled by this interpreter, as an
unchecked hash-based ``.pyc`` (PEP 552), which zipimport prefers to the source and reads
without comparing timestamps: the same code, only not compiled again. The sources stay, for
tracebacks. A zip that already holds this interpreter's compiled modules is left alone, so
a second run only checks; the zip is replaced whole (written beside it, then renamed).

Usage: python scripts/pyspark_bytecode.py   (prints one line when it compiled something)
"""

from __future__ import annotations

import importlib.util
import os
import sys
import zipfile
from importlib._bootstrap_external import _code_to_hash_pyc  # type: ignore[attr-defined]
from pathlib import Path


def spark_python_zips() -> list[Path]:
    """The zips of pyspark's ``python/lib`` (``SPARK_HOME`` if set, else pip's pyspark)."""
    import pyspark

    home = Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent)
    return sorted((home / "python" / "lib").glob("*.zip"))


def compiled(path: Path) -> bool:
    """Whether every source in the zip has this interpreter's compiled module beside it."""
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
        sources = [n for n in names if n.endswith(".py")]
        if not sources or any(f"{n}c" not in names for n in sources):
            return False
        return archive.read(f"{sources[0]}c")[:4] == importlib.util.MAGIC_NUMBER


def add_bytecode(path: Path) -> int:
    """Rewrite ``path`` with a compiled module beside each source; the number compiled."""
    partial = path.with_name(f"{path.name}.partial")
    count = 0
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(partial, "w") as target:
        for info in source.infolist():
            if info.filename.endswith(".pyc"):
                continue  # another interpreter's: written again below
            data = source.read(info)
            target.writestr(info, data, compress_type=info.compress_type)
            if not info.filename.endswith(".py"):
                continue
            try:
                code = compile(data, info.filename, "exec", dont_inherit=True)
            except SyntaxError:
                continue  # a module this Python cannot compile stays source only
            pyc = _code_to_hash_pyc(code, importlib.util.source_hash(data), checked=False)
            # stored, not deflated: read as it is at every import
            target.writestr(zipfile.ZipInfo(f"{info.filename}c", date_time=info.date_time),
                            bytes(pyc), compress_type=zipfile.ZIP_STORED)
            count += 1
    os.replace(partial, path)
    return count


def main() -> None:
    for path in spark_python_zips():
        if not compiled(path):
            print(f"compiled {add_bytecode(path)} modules into {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
