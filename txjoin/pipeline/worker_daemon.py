"""Spark's Python worker daemon with the modules txjoin's tasks need imported once.

Spark starts one daemon per executor (``python -m pyspark.daemon``) and forks a Python
worker from it for each task slot that needs one. PySpark's own daemon imports nothing
ahead: each worker imports pandas, pyarrow, PySpark's serializers and txjoin's task
modules after its fork, about 1.5 s of CPU a worker on these machines, and a run forks
a dozen (the source reader, the routing and shard stages, the sink tasks: measured on
the kill test's runs, 12 worker processes and ~10 s of CPU per restart). This daemon
(``spark.python.daemon.module``, set by ``txjoin.pipeline.session``) imports them before
it serves, so every fork inherits them.

Fork safety is why PySpark's daemon does not do this by default: a module that starts a
thread at import leaves a child forked later with a lock nobody releases. Of what this
imports only OpenBLAS (numpy's) starts native threads, and its pool is off here
(``OPENBLAS_NUM_THREADS=1`` unless set: the tasks run no linear algebra, one task per
core); pyarrow's allocator (mimalloc in pyarrow 26; jemalloc before, whose background
thread its own fork handlers stop and restart around a fork) starts none. A module that
fails to import here is left to the worker, which imports it as before and reports its
error where it is needed.
"""

from __future__ import annotations

import importlib
import os

PRELOAD = (
    "pandas",
    "pyarrow",
    "pyarrow.compute",
    "pyarrow.parquet",
    "pyspark.worker",
    "pyspark.sql.pandas.serializers",
    "pyspark.sql.streaming.stateful_processor",
    "pyspark.sql.worker.plan_data_source_read",
    "txjoin.ingest.spark.replay",
    "txjoin.ingest.spark.files",
    "txjoin.join.spark.routing",
    "txjoin.join.spark.shards",
    "txjoin.sinks.tasks",
)
"""What every worker of a txjoin run imports (PySpark's worker and serializers, pandas and
pyarrow, the data sources, routing, shards and sink tasks)."""


def preload() -> None:
    """Import :data:`PRELOAD`, each that imports (see the module docstring)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    for module in PRELOAD:
        try:
            importlib.import_module(module)
        except Exception:  # the worker imports it again and reports it there
            continue


def main() -> None:
    preload()
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
