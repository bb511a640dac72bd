"""Streaming sources: Spark's own kafka source (``kafka``), and txjoin's Python sources for
scenario replays (``replay``) and archived Kafka Connect sink files (``files``), whose rows
and markers are defined in ``markers``."""
