"""mkdocs hook: docs/reference/job.md's job reference, generated from ``txjoin.job``'s classes.

Each class a job file builds (``Job``, ``Table``, ``Lookup``, ...) gets its signature, as
Python prints it, and its docstring: the one-page ``Job(...)`` reference stays what the
code says (issue 73 item 6). mkdocs.yml lists this file under ``hooks``.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

MARKER = "<!-- txjoin: job reference -->"
CLASSES = ("Job", "Source", "Table", "Lookup", "Children", "Pick", "Output", "Collect",
           "Aggregate")


def _markdown(doc: str) -> str:
    """A reST docstring as Markdown: ``code`` and :role:`~path.Name` as `code` / `Name`."""
    doc = re.sub(r":\w+:`~?(?:[\w.]+\.)?([^`]+)`", r"`\1`", doc)
    return doc.replace("``", "`")


def job_reference() -> str:
    """The reference's Markdown: one section per class, signature then docstring."""
    import txjoin.job as job_module

    parts = []
    for name in CLASSES:
        cls = getattr(job_module, name)
        # Annotations as written (not quoted strings), without private fields (_by_name).
        params = [p for p in inspect.signature(cls).parameters.values()
                  if not p.name.startswith("_")]
        signature = "(\n" + "".join("    " +
            p.name + (f": {p.annotation}" if p.annotation is not p.empty else "")
            + (f" = {p.default!r}" if p.default is not p.empty else "") + ",\n"
            for p in params) + ")"
        parts.append(f"## {name}\n\n```text\n{name}{signature}\n```\n\n"
                     f"{_markdown(inspect.getdoc(cls) or '')}\n")
    return "\n".join(parts)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Put the generated reference where the page has the marker."""
    return markdown.replace(MARKER, job_reference()) if MARKER in markdown else markdown
