"""``txjoin run --metrics-port``: the Prometheus text of a job's batches, served over HTTP."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest

from txjoin.errors import ConfigError
from txjoin.pipeline.metrics import CONTENT_TYPE, Metrics, MetricsServer
from txjoin.pipeline.pipeline import BatchReport


def report(batch_id: int, records: int, released: int, changes: int, **extra: object
           ) -> BatchReport:
    return BatchReport(batch_id=batch_id, records=records, changes=changes, commit_seq=batch_id,
                       snapshot_done=True, snapshot_released=True, waiting=2,
                       transactions_released=released, **extra)  # type: ignore[arg-type]


def samples(text: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def test_counters_add_up_and_gauges_describe_the_last_batch() -> None:
    metrics = Metrics('orders "eu"')
    assert samples(metrics.render()) == {
        f'txjoin_{name}_total{{job="orders \\"eu\\""}}': 0.0
        for name in ("batches", "records", "transactions_released", "changes")}
    metrics.observe(report(0, 100, 10, 7))
    metrics.observe(report(1, 50, 5, 3, seconds=1.5, finished_at=1000.0,
                           commit_ts_ms=[998_000, 999_500],
                           breakdown={"sink_delta": 1.25, "sink_postgres": 0.25}))
    got = samples(metrics.render())
    job = 'job="orders \\"eu\\""'
    assert got[f"txjoin_batches_total{{{job}}}"] == 2
    assert got[f"txjoin_records_total{{{job}}}"] == 150
    assert got[f"txjoin_transactions_released_total{{{job}}}"] == 15
    assert got[f"txjoin_changes_total{{{job}}}"] == 10
    assert got[f"txjoin_transactions_waiting{{{job}}}"] == 2
    assert got[f"txjoin_frontier_commit_seq{{{job}}}"] == 1
    assert got[f"txjoin_frontier_lag_seconds{{{job}}}"] == 0.5
    assert got[f'txjoin_commit_to_sink_seconds{{{job},quantile="0.99"}}'] == 2.0
    assert got[f"txjoin_batch_seconds{{{job}}}"] == 1.5
    assert got[f'txjoin_stage_seconds{{{job},stage="sink_delta"}}'] == 1.25
    assert got[f"txjoin_last_batch_timestamp_seconds{{{job}}}"] == 1000
    assert "# TYPE txjoin_records_total counter" in metrics.render()


def test_served_over_http_on_metrics_only() -> None:
    metrics = Metrics("orders")
    metrics.observe(report(0, 3, 1, 1))
    server = MetricsServer(metrics, 0, host="127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics") as response:
            assert response.headers["Content-Type"] == CONTENT_TYPE
            assert 'txjoin_records_total{job="orders"} 3' in response.read().decode()
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/")
    finally:
        server.close()


def test_a_busy_port_is_one_line() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=f"--metrics-port {port}: cannot listen"):
            MetricsServer(Metrics("orders"), port, host="127.0.0.1")
