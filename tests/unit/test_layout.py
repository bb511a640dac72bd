"""The package layout's invariant: the pure stages (ingest, sequence, join) import no Spark."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PURE = ("txjoin.ingest", "txjoin.sequence", "txjoin.join")
SPARK_ADAPTERS = ("txjoin.ingest.spark", "txjoin.join.spark")


def test_the_pure_stages_import_no_spark() -> None:
    script = textwrap.dedent(f"""
        import importlib, pkgutil, sys
        adapters = {SPARK_ADAPTERS!r}
        names = []
        def walk(package):
            names.append(package)
            module = importlib.import_module(package)
            for info in pkgutil.iter_modules(module.__path__, package + "."):
                if info.name in adapters:
                    continue
                if info.ispkg:
                    walk(info.name)
                else:
                    importlib.import_module(info.name)
                    names.append(info.name)
        for package in {PURE!r}:
            walk(package)
        print(len(names))
        print(sorted(m for m in sys.modules if m == "pyspark" or m.startswith("pyspark.")))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    count, spark = done.stdout.splitlines()
    assert int(count) >= 14, done.stdout  # every pure module was found and imported
    assert spark == "[]", f"the pure stages imported {spark}"
