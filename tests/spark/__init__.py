"""Tests that need a local Spark session or real services (PostgreSQL, broker)."""
