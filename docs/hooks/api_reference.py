"""mkdocs hook: the Python API's reference on docs/python-api.md, rendered from txjoin's own
docstrings and signatures (``txjoin.__all__``) where the page has the marker, as the CLI
reference is rendered from the click commands: the page cannot drift from the code."""

from __future__ import annotations

import inspect
import re
from typing import Any

MARKER = "<!-- txjoin-api-reference -->"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render())


def _markdown(doc: str | None) -> str:
    """A docstring as markdown: Sphinx roles and double backticks as code spans."""
    text = inspect.cleandoc(doc or "")
    text = re.sub(r":(?:func|class|meth|attr|mod|data):`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _signature(obj: Any) -> str:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    params = []
    for p in signature.parameters.values():
        if p.name == "self" or p.name.startswith("_"):  # a dataclass's private fields too
            continue
        # annotations are strings here (from __future__ import annotations): shown as written
        text = p.name if p.annotation is p.empty else f"{p.name}: {p.annotation}"
        if p.default is not p.empty:
            default = "<factory>" if repr(p.default) == "<factory>" else repr(p.default)
            text += f" = {default}"
        if p.kind is p.KEYWORD_ONLY and not any(q.startswith("*") for q in params):
            params.append("*")
        params.append(text)
    one_line = f"({', '.join(params)})"
    if len(one_line) <= 80:
        return one_line
    return "(\n" + "".join(f"    {p},\n" for p in params) + ")"


def render() -> str:
    import txjoin

    parts: list[str] = []
    for name in txjoin.__all__:
        obj = getattr(txjoin, name)
        module = obj.__module__
        if inspect.isclass(obj):
            parts.append(f"### `txjoin.{name}`\n\n```python\nclass {name}{_signature(obj)}\n"
                         f"```\n\nDefined in `{module}`. {_markdown(obj.__doc__)}\n")
            if module != "txjoin.api":
                continue  # the job and its config: their own pages say what they hold
            for attr, member in vars(obj).items():
                if attr.startswith("_"):
                    continue
                if isinstance(member, property) and member.__doc__:
                    parts.append(f"#### `{name}.{attr}`\n\n{_markdown(member.__doc__)}\n")
                elif inspect.isfunction(member) and member.__doc__:
                    parts.append(f"#### `{name}.{attr}{_signature(member)}`\n\n"
                                 f"{_markdown(member.__doc__)}\n")
        else:
            parts.append(f"### `txjoin.{name}`\n\n```python\n{name}{_signature(obj)}\n```\n\n"
                         f"Defined in `{module}`. {_markdown(obj.__doc__)}\n")
    return "\n".join(parts)
