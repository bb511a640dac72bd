"""``txjoin generate --level`` refused before any server is reached (the workload itself on
PostgreSQL: tests/e2e/test_generate_level.py)."""

from __future__ import annotations

import pytest

from txjoin.errors import ConfigError
from txjoin.stack.generate import generate


def test_level_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="--level must be at least 1"):
        generate("postgresql://nowhere", 10, 1, level=0)
