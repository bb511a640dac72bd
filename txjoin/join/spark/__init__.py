"""Stage 3, join, its Spark adapters: the partitioned engine as stateful Spark shards.

In: the source's raw records. ``routing.py`` decides in the JVM, with Spark expressions,
which shard gets which record; ``shards.py`` runs one shard engine
(``txjoin.join.shard``) per shard in ``transformWithStateInPandas``, its state kept in
Spark's state store (``txjoin.join.state_log``), its engine in the shard's host process
(``host.py``). Out: each micro-batch's output changes,
for the sinks. The pure code these adapters run is in ``txjoin.join``, which imports no
Spark.
"""
