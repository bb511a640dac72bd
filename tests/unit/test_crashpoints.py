"""The crash-point hook (txjoin.crashpoints): inert unless named, refused when misspelt.
The kills themselves are in tests/spark/test_kill.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from txjoin import crashpoints
from txjoin.errors import ConfigError


def test_a_spec_names_a_point_and_maybe_a_batch() -> None:
    assert crashpoints._parse(None) is None and crashpoints._parse("") is None
    assert crashpoints._parse("first_sink") == ("first_sink", None)
    assert crashpoints._parse("shard_apply:12") == ("shard_apply", 12)


@pytest.mark.parametrize("spec", ["first-sink", "sinks_committed:x", "shard_apply:-1"])
def test_a_misspelt_spec_is_refused_with_the_points(spec: str) -> None:
    with pytest.raises(ConfigError, match="sinks_committed"):
        crashpoints._parse(spec)


def test_a_point_kills_only_at_its_batch_and_records_where(tmp_path: Path) -> None:
    """In a process of its own group: the hook kills the group (SIGKILL) at shard_apply:3,
    saying so on stderr and in the record file, which a process it did not kill leaves
    alone."""
    code = ("from txjoin import crashpoints as c\n"
            "c.reached('first_sink', 3); c.reached('shard_apply', 2)\n"
            "c.shard_batch(2); c.in_shard()\n"
            "print('alive', flush=True)\n"
            "c.shard_batch(3); c.in_shard()\n"
            "print('survived', flush=True)\n")
    record = tmp_path / "fired"
    env = {**os.environ, crashpoints.CRASH_ENV: "shard_apply:3",
           crashpoints.RECORD_ENV: str(record)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, start_new_session=True, timeout=60, check=False)
    assert done.returncode == -9 and done.stdout == "alive\n", (done.returncode, done.stdout,
                                                                done.stderr)
    assert crashpoints.fired(record) == [("shard_apply", 3)]
    assert "txjoin crash point shard_apply at batch 3: SIGKILL" in done.stderr
    env.pop(crashpoints.CRASH_ENV)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, start_new_session=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout == "alive\nsurvived\n", done.stderr
    assert crashpoints.fired(record) == [("shard_apply", 3)]
    assert crashpoints.fired(tmp_path / "none") == []
