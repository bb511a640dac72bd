"""``txjoin verify``: a job's sinks against PostgreSQL's own answer (the job's code, not tooling).

- :mod:`txjoin.verify.verify`: the job as SQL, the sources' histories (commit order, every
  state), the sink checks, :func:`~txjoin.verify.verify.verify_job`.
- :mod:`txjoin.verify.diff`: the row diff, values compared by value (the scenario harness
  uses it too).
- :mod:`txjoin.verify.source_tables`: the source databases' commit and change logs it reads.

It takes DSNs and paths, knows no local stack (the command in ``txjoin/cli.py`` defaults
them to a running stack's), and reads the Delta tables with delta-rs: no pyspark
(``tests/unit/test_layout.py``).
"""
