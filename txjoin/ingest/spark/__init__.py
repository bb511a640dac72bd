"""Stage 1, ingest, its Spark adapters: the streaming sources that read the raw records.

Streaming sources: Spark's own kafka source (``kafka``), and txjoin's Python sources for
scenario replays (``replay``) and archived Kafka Connect sink files (``files``), whose rows
and markers are defined in ``markers``."""
