"""A running job's progress in the Prometheus text format (``txjoin run --metrics-port``).

The numbers come from each micro-batch's :class:`~txjoin.pipeline.pipeline.BatchReport`,
the same ones ``txjoin run`` prints per batch. ``GET /metrics`` on the driver answers
with counters since the process started and gauges of the last batch:

- ``txjoin_batches_total``, ``txjoin_records_total``,
  ``txjoin_transactions_released_total``, ``txjoin_changes_total`` (output changes);
- ``txjoin_transactions_waiting``: transactions buffered, not complete yet;
- ``txjoin_frontier_commit_seq``: commit sequence of the last transaction released;
- ``txjoin_frontier_lag_seconds``: the last batch's end minus the source commit time of
  the newest transaction it wrote (how far the sinks trail the source, in time);
- ``txjoin_commit_to_sink_seconds{quantile=...}``: over the last batch's changes;
- ``txjoin_sink_commit_to_sink_seconds{sink=...,quantile=...}``: per sink (``postgres``
  per batch, ``delta`` per group commit), its commit time minus the source commit time
  over the last ``LATENCY_WINDOW`` changes it committed (quantile 1 is the max);
- ``txjoin_delta_lag_batches`` and ``txjoin_delta_lag_seconds``: batches handed off to
  the Delta sink and not yet committed there, and how long the oldest has waited (Delta's
  lag behind PostgreSQL);
- ``txjoin_batch_seconds`` and ``txjoin_stage_seconds{stage=...}``: the last batch, in
  all and per stage (``sink_delta`` and ``sink_postgres`` are the sinks' commit times);
- ``txjoin_state_bytes_written``: what the shards handed to the state store;
- ``txjoin_last_batch_timestamp_seconds``: when the last batch finished (unix time).

Plain ``http.server`` on a daemon thread: one reader at a time is all a scraper needs.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from txjoin.errors import ConfigError

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_COUNTERS = {
    "batches": "Micro-batches completed.",
    "records": "Source records read.",
    "transactions_released": "Source transactions released to the sinks, in commit order.",
    "changes": "Output changes written.",
}


LATENCY_WINDOW = 10_000
"""Changes per sink whose commit-to-sink latency the metrics summarise."""


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def quantile(values: list[float], q: float) -> float:
    """The ``q`` (0..1) quantile of ``values`` by nearest rank (0.0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Metrics:
    """Counters and last-batch gauges of one job, updated by ``observe`` (thread-safe)."""

    def __init__(self, job: str) -> None:
        self.job = job
        self._lock = threading.Lock()
        self._totals = dict.fromkeys(_COUNTERS, 0)
        self._last: Any = None  # the last BatchReport
        self._latencies: dict[str, deque[float]] = {}  # sink -> seconds, newest last
        self.delta_lag: Callable[[], tuple[int, float]] | None = None  # the committer's lag

    def observe(self, report: Any) -> None:
        """Account one :class:`~txjoin.pipeline.pipeline.BatchReport`."""
        with self._lock:
            self._totals["batches"] += 1
            self._totals["records"] += report.records
            self._totals["transactions_released"] += report.transactions_released
            self._totals["changes"] += report.changes
            self._last = report

    def observe_sink(self, commit: Any) -> None:
        """Account one sink commit (:class:`~txjoin.sinks.handoff.GroupCommit`)."""
        with self._lock:
            window = self._latencies.setdefault(commit.sink, deque(maxlen=LATENCY_WINDOW))
            window.extend(commit.finished_at - ts / 1000 for ts in commit.commit_ts_ms)

    def render(self) -> str:
        """The Prometheus text exposition of the current numbers."""
        with self._lock:
            totals, last = dict(self._totals), self._last
            latencies = {sink: list(values) for sink, values in self._latencies.items()}
        lag = None if self.delta_lag is None else self.delta_lag()
        job = f'job="{_label(self.job)}"'
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str,
                   samples: Iterator[tuple[str, float]] | list[tuple[str, float]]) -> None:
            lines.append(f"# HELP txjoin_{name} {help_text}")
            lines.append(f"# TYPE txjoin_{name} {kind}")
            for labels, value in samples:
                lines.append(f"txjoin_{name}{{{job}{labels}}} {value:g}")

        for name, help_text in _COUNTERS.items():
            metric(f"{name}_total", "counter", help_text, [("", totals[name])])
        if latencies:
            metric("sink_commit_to_sink_seconds", "summary",
                   "Sink commit time minus source commit time, per sink, over its last "
                   f"{LATENCY_WINDOW} changes.",
                   [(f',sink="{_label(sink)}",quantile="{q}"', quantile(values, q))
                    for sink, values in sorted(latencies.items()) for q in (0.5, 0.99, 1)])
        if lag is not None:
            metric("delta_lag_batches", "gauge",
                   "Batches handed off to the Delta sink, not committed there yet.",
                   [("", lag[0])])
            metric("delta_lag_seconds", "gauge",
                   "How long the oldest batch not yet in Delta has waited since its hand-off.",
                   [("", lag[1])])
        if last is not None:
            metric("transactions_waiting", "gauge",
                   "Transactions buffered until complete, after the last batch.",
                   [("", last.waiting)])
            metric("frontier_commit_seq", "gauge",
                   "Commit sequence of the last transaction released.", [("", last.commit_seq)])
            if last.commit_ts_ms:
                lags = [last.finished_at - ts / 1000 for ts in last.commit_ts_ms]
                metric("frontier_lag_seconds", "gauge",
                       "Last batch's end minus the source commit time of the newest "
                       "transaction it wrote.", [("", min(lags))])
                metric("commit_to_sink_seconds", "summary",
                       "Sink commit time minus source commit time, over the last batch's "
                       "changes.", [(f',quantile="{q}"', quantile(lags, q))
                                    for q in (0.5, 0.99)])
            metric("batch_seconds", "gauge", "The last micro-batch, in all.",
                   [("", last.seconds)])
            metric("stage_seconds", "gauge",
                   "The last micro-batch per stage (sink_* are the sinks' commit times).",
                   [(f',stage="{_label(stage)}"', seconds)
                    for stage, seconds in sorted(last.breakdown.items())])
            metric("state_bytes_written", "gauge",
                   "Bytes the shards handed to the state store in the last batch.",
                   [("", last.state_bytes_written)])
            metric("last_batch_timestamp_seconds", "gauge",
                   "When the last micro-batch finished (unix time).", [("", last.finished_at)])
        return "\n".join(lines) + "\n"


class MetricsServer:
    """``GET /metrics`` on ``port`` (all interfaces) until ``close``."""

    def __init__(self, metrics: Metrics, port: int, host: str = "0.0.0.0") -> None:
        render = metrics.render

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404, "only /metrics is served here")
                    return
                body = render().encode()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # a scrape every few seconds is not worth a log line

        try:
            self._server = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise ConfigError(f"--metrics-port {port}: cannot listen ({exc.strerror}); choose "
                              f"a free port") from None
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="txjoin-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
