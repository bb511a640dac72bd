"""Stage 2, sequence: change events in, complete transactions out, in commit order.

In: the :class:`~txjoin.ingest.debezium.ChangeEvent` s and
:class:`~txjoin.ingest.debezium.TxMarker` s of the ingest stage. ``assembly.py`` buffers
a transaction's events until it is complete; ``frontier.py`` releases complete
transactions strictly in commit order. Out: released transactions, which the join stage
(``txjoin.join``) applies. Pure Python: it imports no Spark (it has no ``spark/``
subpackage; in Spark it runs inside the join's shards, ``txjoin.join.spark``).
"""
