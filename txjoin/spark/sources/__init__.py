"""Spark streaming sources: Kafka (Debezium topics) through the Python Data Source API."""

from txjoin.spark.sources.kafka import KafkaSource, read_stream, register_kafka_source

__all__ = ["KafkaSource", "read_stream", "register_kafka_source"]
