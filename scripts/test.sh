#!/usr/bin/env bash
# Set up .venv and run every test: the core's property and example tests, the Spark
# pipeline with every scenario in both sinks and kill -9 restarts, and the real stack
# (PostgreSQL + Debezium + broker + Spark) end to end. Non-zero exit on any failure,
# including "no tests ran" (pytest exit code 5). Arguments replace the default `tests`
# (e.g. `./scripts/test.sh tests/unit`). With no arguments the files run on two pytest-xdist
# workers (TXJOIN_TEST_WORKERS, default 2; 0 runs them in this process): each lane waits on
# real services and clocks for about a third of its time, so two workers fill both cores.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
if [ "$#" -eq 0 ]; then
    # A file's tests stay on one worker, and so do all files of the shared stack
    # (tests/conftest.py), so module and stack fixtures start once; the order is
    # tests/conftest.py's (longest units first), not xdist's (most tests first).
    set -- tests -n "${TXJOIN_TEST_WORKERS:-2}" --dist loadscope --no-loadscope-reorder
fi
.venv/bin/python -m pytest "$@"
