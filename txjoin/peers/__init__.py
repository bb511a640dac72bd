"""Peers: other systems run on the same archived workload, compared with txjoin.

``workload`` writes the generated pizzeria workload once as Kafka Connect sink
files; ``flink_job`` is the Flink SQL query (run in PyFlink's interpreter) and
``pathway_job`` the same query in Pathway (run in Pathway's); ``flink`` and
``pathway`` start them (``environment``: the interpreter of each) and replay
their output; ``consistency`` replays an output changelog against the oracle's
committed prefixes; ``bench`` is ``txjoin bench --peer flink --peer pathway``.
"""

PEERS = ("flink", "pathway")  # what --peer accepts
