"""Stage 3, join: released transactions in, output changes out.

In: the transactions the sequence stage (``txjoin.sequence``) releases in commit order.
``temporal.py`` applies them to the current rows and evaluates the job; out:
:class:`~txjoin.join.temporal.OutputChange` s, shaped for the sinks (``txjoin.sinks``)
by ``output.py``. The engine around it (``engine.py``: records in, output changes out)
and its partitioned form (``routing.py``, ``shard.py``, ``sharded.py``, their saved
state in ``state.py`` and ``state_log.py``) live here too, with ``oracle.py``, the
executable specification the property tests compare against. The pure modules import
no Spark; only the ``spark/`` subpackage does.
"""
