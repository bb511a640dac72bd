"""Spark adapters: session, sources and the streaming pipeline glue."""
