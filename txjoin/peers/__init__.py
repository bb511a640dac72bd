"""Peers: other systems run on the same archived workload, compared with txjoin.

``workload`` writes the generated pizzeria workload once as Kafka Connect sink
files; ``flink_job`` is the Flink SQL query (run in PyFlink's interpreter);
``flink`` starts it; ``consistency`` replays an output changelog against the
oracle's committed prefixes; ``bench`` is ``txjoin bench --peer flink``.
"""
