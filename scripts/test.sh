#!/usr/bin/env bash
# Set up .venv and run every test: the core's property and example tests, the Spark
# pipeline with every scenario in both sinks and kill -9 restarts, and the real stack
# (PostgreSQL + Debezium + broker + Spark) end to end. Non-zero exit on any failure,
# including "no tests ran" (pytest exit code 5). Paths among the arguments replace the
# default `tests` and run in this process (e.g. `./scripts/test.sh tests/unit -x`). Without
# a path (no arguments, or only options such as `-m unit`) the whole suite is selected and
# its files run on two pytest-xdist workers (TXJOIN_TEST_WORKERS, default 2; 0 runs them in
# this process; an `-n` of your own wins): each lane waits on real services and clocks for
# about a third of its time, so two workers fill both cores.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
paths=0 own_workers=0
for arg in "$@"; do
    if [ -e "${arg%%::*}" ]; then paths=1; fi
    case "$arg" in -n|-n*|--numprocesses*) own_workers=1 ;; esac
done
if [ "$paths" -eq 0 ] && [ "$own_workers" -eq 0 ]; then
    # A file's tests stay on one worker, and so do all files of the shared stack
    # (tests/conftest.py), so module and stack fixtures start once; the order is
    # tests/conftest.py's (longest units first), not xdist's (most tests first).
    set -- tests -n "${TXJOIN_TEST_WORKERS:-2}" --dist loadscope --no-loadscope-reorder "$@"
elif [ "$paths" -eq 0 ]; then
    set -- tests "$@"
fi
.venv/bin/python -m pytest "$@"
