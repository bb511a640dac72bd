"""txjoin: transaction-consistent streaming joins over Debezium change data capture.

The Python API (``txjoin.api``, docs/python-api.md): :func:`load_job`, :class:`RunConfig`,
:func:`check`, :func:`start` on a ``SparkSession`` of the caller's, the :class:`Stream` it
returns, :func:`spark_conf`. Its names are imported when first used, so ``import txjoin``
(and the CLI) stays free of PySpark until a name needs it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from txjoin.api import Progress, SinkProgress, Stream, check, spark_conf, start
    from txjoin.job import Job, load_job
    from txjoin.pipeline.pipeline import BatchReport, RunConfig

__version__ = "0.1.0"

_API = {
    "load_job": "txjoin.job", "Job": "txjoin.job",
    "RunConfig": "txjoin.pipeline.pipeline", "BatchReport": "txjoin.pipeline.pipeline",
    "check": "txjoin.api", "start": "txjoin.api", "spark_conf": "txjoin.api",
    "Stream": "txjoin.api", "Progress": "txjoin.api", "SinkProgress": "txjoin.api",
}
"""The public name -> the module that defines it."""

__all__ = ["BatchReport", "Job", "Progress", "RunConfig", "SinkProgress", "Stream", "check",
           "load_job", "spark_conf", "start"]


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'txjoin' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
