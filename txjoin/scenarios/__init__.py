"""Scenario replay: synthesized Debezium input, the replay harness and its checks."""
