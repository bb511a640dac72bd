#!/usr/bin/env bash
# Create .venv (Python >= 3.11), install txjoin with everything the demo and tests need, and
# fetch its pinned JVM jars with mvn into .jars/ (scripts/jars.sh), compile its modules,
# then record the classes a Spark driver loads into .jars/spark-driver-*.jsa
# (scripts/class_archive.py).
# Idempotent: a second run only checks. Sourced by demo.sh and test.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "error: txjoin needs Python >= 3.11 (found: $("$PYTHON" --version 2>&1)); set PYTHON=..." >&2
    exit 2
fi
if ! command -v java >/dev/null 2>&1; then
    echo "error: Java 17 is needed (Spark, Debezium); install a JDK 17 and put java on PATH" >&2
    exit 2
fi
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.txjoin-installed
# Installed packages compiled to bytecode once, as pip did and uv does only when asked: with
# PYTHONDONTWRITEBYTECODE set (as on our machines) a process can write no .pyc back, so
# every Python process (each Spark Python worker daemon, shard host, query's pre-init
# process, txjoin command, pytest worker) compiled pandas, pyarrow and pyspark from source:
# their imports 1.96 -> 0.61 s of CPU each; it costs a fresh install ~17 s (40 -> 57 s).
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    # The jars come from Maven Central while uv installs the packages (on a fresh machine
    # ~65 s and ~40 s, one after the other before): one mvn at a time, as Maven 3.8's local
    # repository is not safe for several; what needs .venv (compiling jvm/) comes after.
    bash scripts/jars.sh fetch &
    fetching=$!
    # setuptools' build backend prints a block of stars about editable installs on every
    # fresh install (BuildBackendWarning, issue 73): shown with TXJOIN_VERBOSE=1 only.
    build_warnings=ignore
    if [ "${TXJOIN_VERBOSE:-0}" != "0" ]; then build_warnings="${PYTHONWARNINGS:-}"; fi
    # uv (the `package` extra's, pinned there) installs everything: 27 s where pip took 57 s
    # on a fresh machine, and `txjoin package` then builds its environment from uv's cache.
    uv_pin=$(sed -n 's/^package = \["\(uv[^"]*\)".*/\1/p' pyproject.toml)
    PYTHONWARNINGS="$build_warnings" .venv/bin/python -m pip install -q --disable-pip-version-check "$uv_pin"
    PYTHONWARNINGS="$build_warnings" .venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python -e ".[dev,stack,package]"
    # pyspark comes as a source archive and uv builds it again on every fresh install, keeping
    # each build (0.5-1.4 GB) in its cache: on a CI machine that outlives its runs, 44 GB of
    # them and /tmp's leftovers filled the disk and failed a run. On CI (CI set) the builds
    # no environment refers to any more are removed; a developer's shared cache is theirs.
    if [ -n "${CI:-}" ]; then .venv/bin/uv cache prune -q || true; fi
    wait "$fetching"
    touch "$stamp"
fi
# Checked where the bytecode lives, not by a stamp: a .venv whose packages' __pycache__
# folders were gone (uv compiles only what it installs; a package reinstalled without
# --compile-bytecode, or folders removed) ran tests/spark/test_pipeline.py and
# test_staged.py in 411 s instead of 230. Errors are files no process imports.
purelib=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
if ! ls "$purelib"/pandas/__pycache__/__init__.*.pyc "$purelib"/pyspark/__pycache__/__init__.*.pyc \
        >/dev/null 2>&1; then
    .venv/bin/python -m compileall -q -j 0 "$purelib" >/dev/null 2>&1 || true
fi
bash scripts/jars.sh
# Compile txjoin's modules (and the tests') once: a Python process reads a module's compiled
# form when it is up to date with the source, and compiles the source itself otherwise,
# writing nothing back when PYTHONDONTWRITEBYTECODE is set (as on our machines). Every Spark
# Python worker, shard host, query's pre-init process and txjoin command imports txjoin:
# compiling it again in each cost ~0.35 s of CPU per process (issue 34). Only changed files
# are compiled on a second run; an edited file is compiled in memory until the next run.
.venv/bin/python -m compileall -q -j 0 txjoin tests >/dev/null
# Spark drivers start ~3 s sooner from a class-data-sharing archive (scripts/class_archive.py,
# ~1 min once per java + jars); without one they start as before.
# Its line goes to stderr: demo.sh --json keeps stdout for the JSON.
if archived=$(.venv/bin/python scripts/class_archive.py 2> .jars/class-archive.log); then
    if [ -n "$archived" ]; then echo "$archived" >&2; fi
else
    echo "warning: no class archive for Spark drivers (log: .jars/class-archive.log); they start without one" >&2
fi
