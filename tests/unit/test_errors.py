"""Errors reach the user as one clean message, even from inside Spark workers."""

from __future__ import annotations

from txjoin.errors import ServiceError, from_worker


def test_an_error_raised_in_a_spark_worker_is_recovered_without_spark_noise() -> None:
    jvm = Exception(
        "[STREAM_FAILED] Query terminated with exception: Traceback (most recent call last):\n"
        "  File \"x.py\", line 1, in read\n"
        "txjoin.errors.ServiceError: kafka: cannot reach the Kafka brokers at "
        "'127.0.0.1:1' within 15s; check that the broker runs\n SQLSTATE: 38000 SQLSTATE: XXKST\n"
        "=== Streaming Query ===\nIdentifier: txjoin_orders")
    err = from_worker(jvm)
    assert isinstance(err, ServiceError)
    assert str(err) == ("kafka: cannot reach the Kafka brokers at '127.0.0.1:1' within "
                        "15s; check that the broker runs")
    assert from_worker(Exception("some other failure")) is None
