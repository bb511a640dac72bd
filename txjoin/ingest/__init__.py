"""Stage 1, ingest: Debezium's records in, change events and transaction markers out.

In: the raw records of a source's topics (topic, partition, offset, value: Debezium's
JSON envelope). Out: :class:`~txjoin.ingest.debezium.ChangeEvent` s and
:class:`~txjoin.ingest.debezium.TxMarker` s (BEGIN/END), which the sequence stage
(``txjoin.sequence``) assembles into transactions; a row's values are read as their
declared column types by ``types.py``. The pure modules (``debezium.py``, ``types.py``)
import no Spark; only the ``spark/`` subpackage does: the streaming sources that read
the records.
"""
