"""The package layout's invariants: the pure stages (ingest, sequence, join) import no Spark;
the job's code imports no tooling; verify imports no Spark."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

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


# -- the job's code apart from the tooling ---------------------------------------------------

ROOT = Path(__file__).resolve().parents[2] / "txjoin"
TOOLING = ("txjoin.stack", "txjoin.peers", "txjoin.scenarios", "txjoin.bench")
"""The local stack, the peers' benchmark, the scenario harness and the bench: tooling."""
BRIDGES = ("txjoin.cli", "txjoin.__main__")
"""The command line registers every command, the job's and the tooling's, and reads a running
local stack's DSNs as defaults for the job's commands: the one module allowed both sides."""


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _tooling(name: str) -> bool:
    return any(name == t or name.startswith(t + ".") for t in TOOLING)


def product_modules() -> dict[str, Path]:
    modules = {_module(p): p for p in sorted(ROOT.rglob("*.py"))}
    return {m: p for m, p in modules.items() if not _tooling(m) and m not in BRIDGES}


def imported(path: Path, module: str) -> set[str]:
    """Every module ``path`` imports, at its top or inside a function (a lazy import counts)."""
    names: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the importing package
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_the_jobs_code_imports_no_tooling() -> None:
    modules = product_modules()
    for expected in ("txjoin.verify.verify", "txjoin.export", "txjoin.sinks.build",
                     "txjoin.pipeline.run", "txjoin.ingest.spark.files", "txjoin.catalog"):
        assert expected in modules, sorted(modules)  # the walk found the product
    assert not any(_tooling(m) for m in modules)
    found = {module: sorted(n for n in imported(path, module) if _tooling(n))
             for module, path in modules.items()}
    assert {m: names for m, names in found.items() if names} == {}, (
        "the job's code imports the tooling (stack, peers, scenarios, bench); only "
        "txjoin/cli.py may")


def test_the_import_walk_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    # The check above would pass vacuously if the walk missed a form of import.
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from txjoin.stack.stack import load_stack\n"
                      "from ..scenarios import checks\nimport txjoin.bench\n")
    names = imported(source, "txjoin.verify.m")
    assert {"txjoin.stack.stack", "txjoin.scenarios.checks", "txjoin.bench"} <= names
    assert all(_tooling(n) for n in ("txjoin.stack.stack", "txjoin.scenarios.checks",
                                     "txjoin.bench", "txjoin.peers"))
    assert not _tooling("txjoin.stacks") and not _tooling("txjoin.benchmarks")


SPARK_SIDE = ("pyspark", "txjoin.pipeline", "txjoin.ingest.spark", "txjoin.join.spark")


def test_verify_imports_no_spark_anywhere_in_its_code() -> None:
    # verify reads the Delta tables with delta-rs (the deltalake package), not Spark: a user
    # checks a job's sinks without a JVM. A lazy import inside a function counts (verify
    # used to reach pyspark through a lazy import of the pipeline, for build_sinks).
    spark = {module: sorted(n for n in imported(path, module)
                            if any(n == s or n.startswith(s + ".") for s in SPARK_SIDE))
             for module, path in product_modules().items()
             if module == "txjoin.verify" or module.startswith("txjoin.verify.")}
    assert "txjoin.verify.verify" in spark and "txjoin.verify.diff" in spark, sorted(spark)
    assert {m: names for m, names in spark.items() if names} == {}


def test_verify_reads_the_sinks_without_spark(tmp_path: Path) -> None:
    # In a fresh interpreter: import every verify module, build the job's sinks as verify
    # does and check a Delta table written with delta-rs; then no pyspark module is loaded.
    job = Path(__file__).resolve().parents[2] / "jobs" / "orders.py"
    script = textwrap.dedent(f"""
        import importlib, pkgutil, sys
        import pyarrow as pa
        from deltalake import write_deltalake
        import txjoin.verify
        names = ["txjoin.verify"]
        for info in pkgutil.iter_modules(txjoin.verify.__path__, "txjoin.verify."):
            importlib.import_module(info.name)
            names.append(info.name)
        from txjoin.job import load_job
        from txjoin.sinks.build import SinkPlaces, build_sinks
        from txjoin.verify.verify import check_sink
        job = load_job({str(job)!r})
        keys = list(job.output.key)
        row = {{**{{k: 7 for k in keys}}, "_commit_seq": 1}}
        table = {str(tmp_path)!r} + "/" + job.output.table
        for view in ("current", "changelog"):
            write_deltalake(table + "/" + view, pa.Table.from_pylist([row]))
        (sink,) = build_sinks(job, SinkPlaces({str(tmp_path)!r}))
        check = check_sink(sink, table, keys, [{{k: 7 for k in keys}}], None, None, job, None)
        assert check.rows == 1 and check.changelog_rows == 1 and check.diff.ok, check
        print(sorted(names))
        print(sorted(m for m in sys.modules if m == "pyspark" or m.startswith("pyspark.")))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    names, spark = done.stdout.splitlines()
    assert "txjoin.verify.verify" in names and "txjoin.verify.diff" in names, names
    assert spark == "[]", f"verify imported {spark}"


def test_the_longest_units_the_scheduler_starts_first_exist() -> None:
    """tests/conftest.py's LONGEST_UNITS go out first: a renamed file would silently lose its
    head start (and the run could end with one worker idle)."""
    from tests.conftest import E2E_STACK_GROUP, LONGEST_UNITS

    root = Path(__file__).resolve().parents[2]
    files = [name for name in LONGEST_UNITS if name != E2E_STACK_GROUP]
    assert files and all((root / name).is_file() for name in files), [
        name for name in files if not (root / name).is_file()]
    assert len(set(LONGEST_UNITS)) == len(LONGEST_UNITS)


def test_no_property_is_pinned_below_the_ci_profile_without_a_measured_reason() -> None:
    """Issue 68: a ``max_examples`` below the ci profile's (tests/conftest.py) needs the
    comment right above its decorator that says what 200 would cost, measured."""
    import re

    from hypothesis import settings

    ci = settings.get_profile("ci").max_examples
    root = Path(__file__).resolve().parents[2]
    unexplained, seen = [], 0
    for path in sorted((root / "tests").rglob("test_*.py")):
        lines = path.read_text().splitlines()
        for n, line in enumerate(lines):
            pin = re.search(r"\bmax_examples=(\d+)", line)
            if not pin or int(pin.group(1)) >= ci:
                continue
            seen += 1
            start = n
            while start > 0 and lines[start - 1].lstrip().startswith("@"):
                start -= 1  # the comment goes above the decorators
            above = lines[max(0, start - 2):start]
            if not any(re.match(r"\s*#.*\bmeasured\b", text) for text in above):
                unexplained.append(f"{path.relative_to(root)}:{n + 1}: {line.strip()}")
    assert seen, "the scan found no pinned property: is the pattern still right?"
    assert not unexplained, "\n".join(unexplained)
