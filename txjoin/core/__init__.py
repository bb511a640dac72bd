"""The transactional core: plain Python/pandas, no Spark import."""
