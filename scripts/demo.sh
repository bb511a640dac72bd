#!/usr/bin/env bash
# Set up .venv, then start the local stack (PostgreSQL, Debezium, broker; no Docker),
# generate a racing pizzeria workload, run the orders job into Delta and PostgreSQL,
# and verify the result against PostgreSQL's own answer.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
exec .venv/bin/txjoin demo "$@"
