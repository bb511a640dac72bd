"""What txjoin does once in each of Spark's Python workers (a source's read, a shard's task).

PySpark's daemon runs a full ``gc.collect()`` in a reused worker after every task
(``pyspark/daemon.py``). A worker holds PySpark, pandas, pyarrow and txjoin's modules,
~80k tracked objects, and a full collection walks them all: ~55 ms of CPU per task
here, the same every task, for objects that live as long as the process. The first
task of a worker moves what is there by then (those modules; a shard's engine lives in
its host process, ``join/spark/host.py``, not in the worker) into the permanent
generation (``gc.freeze``), so each later collection walks only what the tasks left.
Objects frozen are still freed by reference counting; a frozen cycle would stay, but
the modules' are never garbage.
"""

from __future__ import annotations

import gc

_frozen = False


def settle() -> None:
    """Freeze what this worker holds, once (the first task's call; later calls do nothing)."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.freeze()
