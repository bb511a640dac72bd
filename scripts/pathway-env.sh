#!/usr/bin/env bash
# Create .venv-pathway with Pathway for `txjoin bench --peer pathway` (idempotent).
# Pathway pins its own numpy, pandas and pyarrow ranges and brings a large dependency tree
# (its Rust engine's wheel); it lives in a venv of its own, never in txjoin's .venv.
# txjoin finds it at .venv-pathway (or $TXJOIN_PATHWAY_PYTHON).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv-pathway/bin/python ]; then
    "$PYTHON" -m venv .venv-pathway
fi
if ! .venv-pathway/bin/python -c 'import pathway' 2>/dev/null; then
    .venv-pathway/bin/python -m pip install -q --upgrade pip
    .venv-pathway/bin/python -m pip install -q "pathway>=0.33,<0.34"
fi
echo "Pathway ready in .venv-pathway: txjoin bench --peer pathway uses it" >&2
