#!/usr/bin/env bash
# Set up .venv and run every test: the core's property and example tests, the Spark
# pipeline with every scenario in both sinks and kill -9 restarts, and the real stack
# (PostgreSQL + Debezium + broker + Spark) end to end. Non-zero exit on any failure,
# including "no tests ran" (pytest exit code 5). Arguments replace the default `tests`
# (e.g. `./scripts/test.sh tests/unit`).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
if [ "$#" -eq 0 ]; then
    set -- tests
fi
.venv/bin/python -m pytest "$@"
