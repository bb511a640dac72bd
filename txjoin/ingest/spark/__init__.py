"""Stage 1, ingest, its Spark adapters: the streaming sources that read the raw records.

Streaming sources: Spark's own kafka source (``kafka``), and txjoin's Python sources for
scenario replays (``replay``) and archived Kafka Connect sink files (``files``), whose rows
and markers are defined in ``markers``."""

DEFAULT_MAX_EVENTS_PER_TRIGGER = 100_000
"""Records a micro-batch reads at most (Spark's ``maxOffsetsPerTrigger``), unless the run
says otherwise (``--max-events-per-trigger``; 0: everything available). Without a limit a
backlog is read in one batch: the whole snapshot of a large database, or a transaction of
millions of changes with what follows it, in every shard's memory at once (a 2M-change
transaction's 3M records took a shard's host past 6 GB and the run was killed,
docs/benchmarks.md). With 100,000 the same run finished, the open transaction spilled
between batches; a steady stream never reaches it (500 tx/s is ~5,000 records a second),
and a batch's fixed cost (~0.4 s here) is spread over enough records while catching up.
Under a limit the shards tell a topic read to its end by the offsets Spark planned each
batch over (``kafka.batch_offset_spans``), so gaps in the offsets are fine."""
