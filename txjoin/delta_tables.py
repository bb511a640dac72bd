"""Reading Delta tables so that the process can still exit cleanly.

``deltalake.DeltaTable.to_pyarrow_table()`` scans a pyarrow dataset whose
filesystem is deltalake's ``DeltaStorageHandler``, a Python object wrapped in
``pyarrow.fs.PyFileSystem``, with ``pre_buffer=True``. Pre-buffering issues
asynchronous reads on Arrow's thread pools, and the scan returns before all of
their futures are destroyed. When the interpreter exits meanwhile, the Arrow
thread that drops the last reference to the Python filesystem calls
``PyGILState_Ensure``; Python 3.11 ends a thread that asks for the GIL during
finalization with ``pthread_exit``, whose forced unwinding runs into a
``noexcept`` C++ destructor: ``terminate called without an active exception``,
exit 134 (seen in gdb: ``~OwnedRefNoGIL`` <- ``PyFileSystem`` <- ``FileSource``
<- ``ParquetFileFragment`` <- ``~ConcreteFutureImpl`` on an Arrow worker). It is
a race, so it hit about half of the runs of a script that only reads a table
(delta-rs issue 2184, apache/arrow issue 34314).

:func:`read_table` gives the scan Arrow's own (C++) filesystem for the table's
location instead: no Python object is left for Arrow's threads to release, and
the table read is the same (schema and rows) as ``to_pyarrow_table()``'s.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.fs as pa_fs
from deltalake import DeltaTable


def read_table(table: DeltaTable | str | os.PathLike[str],
               columns: list[str] | None = None) -> pa.Table:
    """The table's current snapshot as Arrow, read without a Python filesystem."""
    dt = table if isinstance(table, DeltaTable) else DeltaTable(os.fspath(table))
    try:
        filesystem, root = pa_fs.FileSystem.from_uri(dt.table_uri)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        # A store Arrow has no native filesystem for: delta-rs' own (Rust) reader.
        return pa.table(dt.scan(columns=columns))
    return dt.to_pyarrow_table(columns=columns,
                               filesystem=pa_fs.SubTreeFileSystem(root, filesystem))

