"""The stages wired into one Spark streaming query, and what runs it.

In: a job and its source; out: a running query whose micro-batches go
source (``txjoin.ingest.spark``) -> shards (``txjoin.join.spark``: decode, sequence,
join) -> sinks (``txjoin.sinks``). ``pipeline.py`` builds the query, ``run.py`` is the
``txjoin run`` entry, ``session.py`` builds the Spark session, ``metrics.py`` serves
Prometheus metrics. Not a stage of its own: all of it is Spark glue, and the pure code
it wires is in the stage packages (``txjoin.ingest``, ``txjoin.sequence``,
``txjoin.join``), which import no Spark outside their ``spark/`` subpackages.
"""
