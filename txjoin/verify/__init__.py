"""``txjoin verify``: a job's sinks against PostgreSQL's own answer (the job's code, not tooling).

:mod:`txjoin.verify.verify` holds the job-to-SQL translation, the source histories and
the sink checks.
"""
