"""A new local stack's ports: a port txjoin picked for the broker or a Connect worker that
another server has begun to listen on before the broker starts is replaced, one the user gave
is kept (``txjoin/stack/stack.py``)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from txjoin.stack import stack
from txjoin.stack.processes import free_port


def _state(pg: int, broker: int, controller: int, rest: int) -> dict[str, object]:
    return {"bootstrap_servers": f"127.0.0.1:{broker}", "postgres": {"port": pg},
            "broker": {"port": broker, "controller_port": controller},
            "debezium": {"rest_port": rest}}


def test_a_picked_port_taken_since_is_replaced_and_recorded(tmp_path: Path) -> None:
    with socket.socket() as pg, socket.socket() as taken:
        pg.bind(("127.0.0.1", 0))
        pg.listen()
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        broker, rest = free_port(), free_port()
        held = taken.getsockname()[1]
        state = _state(pg.getsockname()[1], broker, held, rest)
        stack._repick_taken_ports(tmp_path, state, keep_broker_port=False)
        controller = state["broker"]["controller_port"]  # type: ignore[index]
        assert controller not in (held, broker, rest, pg.getsockname()[1])
        assert (state["broker"]["port"], state["debezium"]["rest_port"]) == (  # type: ignore[index]
            broker, rest)  # free ones are kept
        assert json.loads((tmp_path / stack.STATE_FILE).read_text()) == state


def test_a_broker_port_the_user_gave_is_kept_even_if_taken(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        given = taken.getsockname()[1]
        state = _state(free_port(), given, free_port(), free_port())
        stack._repick_taken_ports(tmp_path, state, keep_broker_port=True)
        assert state["bootstrap_servers"] == f"127.0.0.1:{given}"
        state = _state(free_port(), given, free_port(), free_port())
        stack._repick_taken_ports(tmp_path, state, keep_broker_port=False)
        assert state["broker"]["port"] != given  # type: ignore[index]
        assert state["bootstrap_servers"] == f"127.0.0.1:{state['broker']['port']}"  # type: ignore[index]
