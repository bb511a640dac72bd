"""The local stack: real PostgreSQL, Debezium (Kafka Connect) and a Kafka-protocol broker.

``txjoin up`` starts them from PyPI wheels (no Docker); the pipeline calls ``load_stack``
to default to the running stack's DSNs and bootstrap servers.
"""

from txjoin.stack.stack import StackInfo, down, load_stack, status, up

__all__ = ["StackInfo", "down", "load_stack", "status", "up"]
