#!/usr/bin/env bash
# Create .venv-flink with PyFlink for `txjoin bench --peer flink` (idempotent).
# PyFlink 2.3 pins numpy, pandas, pyarrow and py4j below what pyspark 4.2 needs, so it
# lives in a venv of its own; txjoin finds it at .venv-flink (or $TXJOIN_FLINK_PYTHON).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv-flink/bin/python ]; then
    "$PYTHON" -m venv .venv-flink
fi
if ! .venv-flink/bin/python -c 'import pyflink.table' 2>/dev/null; then
    .venv-flink/bin/python -m pip install -q --upgrade pip
    .venv-flink/bin/python -m pip install -q "apache-flink>=2.3,<2.4"
fi
echo "PyFlink ready in .venv-flink: txjoin bench --peer flink uses it" >&2
