"""A new local stack's ports: a port txjoin picked for the broker or a Connect worker that
another server has begun to listen on before the broker starts is replaced, one the user gave
is kept (``txjoin/stack/stack.py``)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from txjoin.stack import stack
from txjoin.stack.processes import PortReservations, free_port


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
        ports = PortReservations()  # the stack's own picks, held as _start_new holds them
        broker, rest = ports.pick(), ports.pick()
        held = taken.getsockname()[1]
        state = _state(pg.getsockname()[1], broker, held, rest)
        try:
            stack._repick_taken_ports(tmp_path, state, False, ports)
        finally:
            ports.release()
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
        stack._repick_taken_ports(tmp_path, state, True, PortReservations())
        assert state["bootstrap_servers"] == f"127.0.0.1:{given}"
        state = _state(free_port(), given, free_port(), free_port())
        stack._repick_taken_ports(tmp_path, state, False, PortReservations())
        assert state["broker"]["port"] != given  # type: ignore[index]
        assert state["bootstrap_servers"] == f"127.0.0.1:{state['broker']['port']}"  # type: ignore[index]


def test_a_held_port_is_taken_for_other_picks_and_free_for_its_server() -> None:
    ports = PortReservations()
    port = ports.pick()
    try:
        with socket.socket() as other:  # another free_port's check: without SO_REUSEADDR
            try:
                other.bind(("127.0.0.1", port))
                raise AssertionError(f"port {port} was not held")
            except OSError:
                pass
        with socket.socket() as server:  # as PostgreSQL and the JVMs bind: SO_REUSEADDR
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", port))
            server.listen()
        assert port not in {ports.pick() for _ in range(5)}
    finally:
        ports.release()
    with socket.socket() as after:
        after.bind(("127.0.0.1", port))
