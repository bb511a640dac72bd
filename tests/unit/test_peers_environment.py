"""A peer's interpreter: found where its venv or variable says, else one line saying how."""

from __future__ import annotations

import sys

import pytest

from txjoin.peers.environment import PeerEnvironment, PeerUnavailable
from txjoin.peers.flink import FLINK
from txjoin.peers.pathway import PATHWAY

pytestmark = pytest.mark.unit


def test_each_peer_names_its_script_and_variable() -> None:
    assert (FLINK.script, FLINK.variable) == ("scripts/flink-env.sh", "TXJOIN_FLINK_PYTHON")
    assert (PATHWAY.script, PATHWAY.variable) == ("scripts/pathway-env.sh",
                                                  "TXJOIN_PATHWAY_PYTHON")


def test_a_missing_peer_is_one_line_with_the_way_to_install_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    absent = PeerEnvironment("Nope", ".venv-nope", "txjoin_no_such_module", "txjoin_no_such")
    monkeypatch.setenv(absent.variable, sys.executable)  # an interpreter without the module
    with pytest.raises(PeerUnavailable) as raised:
        absent.python()
    message = str(raised.value)
    assert "\n" not in message
    assert message == ("Nope is not installed: run `bash scripts/nope-env.sh` (it creates "
                       ".venv-nope), or set TXJOIN_NOPE_PYTHON")


def test_the_variable_wins_when_its_interpreter_imports_the_module(
        monkeypatch: pytest.MonkeyPatch) -> None:
    present = PeerEnvironment("Json", ".venv-json", "json", "txjoin_no_such")
    monkeypatch.setenv(present.variable, sys.executable)
    assert present.python() == sys.executable
