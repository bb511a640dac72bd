"""Stage 3, join: released transactions in, output changes out.

In: the transactions the sequence stage (``txjoin.sequence``) releases in commit order.
``temporal.py`` applies them to the current rows and evaluates the job; out:
:class:`~txjoin.join.temporal.OutputChange` s, shaped for the sinks (``txjoin.sinks``)
by ``output.py``. The engine around it (``engine.py``: records in, output changes out)
and its partitioned forms (``routing.py``, ``shard.py``, ``sharded.py``; the staged one,
a sequencer before shards that hold only their rows, ``staged.py``; their saved state in
``state.py`` and ``state_log.py``) live here too, with ``oracle.py``, the executable
specification the property tests compare against. The pure modules import no Spark; only
the ``spark/`` subpackage does.
"""

SHARDED, STAGED = "sharded", "staged"
ENGINES = (SHARDED, STAGED)
"""``txjoin run --engine``: the sharded engine (the default: every shard assembles and
orders every transaction) or the staged one (``staged.py``)."""
