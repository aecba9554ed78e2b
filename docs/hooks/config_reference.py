"""MkDocs hook: the configuration reference, generated from the pydantic models at build time.

A page line ``<!-- config-reference: loop_governor.config.GovernorConfig -->`` becomes a table of
that model's fields (inherited ones included): name, type, default, bounds and description, as
pydantic itself knows them. mkdocstrings' static analysis cannot see fields of a
pydantic-settings model (``GovernorConfig`` is a ``BaseSettings``) nor their bounds, and a
hand-written table drifts from the code; reading ``model_fields`` of the imported class does
neither. Wired in by ``hooks:`` in mkdocs.yml.
"""

from __future__ import annotations

import importlib
import re
import typing
from typing import Any

_MARKER = re.compile(r"^<!-- config-reference: ([\w.]+) -->$", re.MULTILINE)
_BOUNDS = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"), ("min_length", "length ≥"))


def _type_name(annotation: Any) -> str:
    text = annotation.__name__ if isinstance(annotation, type) else repr(annotation)
    text = re.sub(r"\b(?:typing|[a-z_]+(?:\.[a-z_]+)*)\.(?=[A-Za-z_])", "", text)  # module prefixes
    return text.replace("NoneType", "None")


def _default(field: Any) -> str:
    if field.default_factory is not None:
        return f"`{field.default_factory()!r}`"
    if field.is_required():
        return "required"
    return f"`{field.default!r}`"


def _bounds(field: Any) -> str:
    found = []
    for meta in field.metadata:
        for attr, sign in _BOUNDS:
            value = getattr(meta, attr, None)
            if value is not None:
                found.append(f"{sign} {value}")
    return ", ".join(found)


def _cell(text: str) -> str:
    """One table cell: pipes escaped outside code spans (Python-Markdown's tables already
    ignore a pipe inside backticks, and would show an escaped one literally there), and
    the characters Markdown reads as emphasis (``random()*jitter`` lost its ``*``)."""
    parts = text.replace("\n", " ").split("`")
    return "`".join(part if i % 2 else _escaped(part) for i, part in enumerate(parts))


def _escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("*", "\\*").replace("_", "\\_")


def table(path: str) -> str:
    """The markdown table of the pydantic model at ``module.Class``."""
    module, _, name = path.rpartition(".")
    model = getattr(importlib.import_module(module), name)
    prefix = model.model_config.get("env_prefix")
    rows = ["| field | type | default | bounds | description |", "| --- | --- | --- | --- | --- |"]
    for field_name, field in model.model_fields.items():
        shown = f"`{field_name}`"
        if prefix:
            shown += f"<br>`{prefix}{field_name.upper()}`"
        annotation = typing.get_type_hints(model).get(field_name, field.annotation)
        rows.append(
            "| "
            + " | ".join(
                _cell(part)
                for part in (
                    shown,
                    f"`{_type_name(annotation)}`",
                    _default(field),
                    _bounds(field),
                    field.description or "",
                )
            )
            + " |"
        )
    return "\n".join(rows)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return _MARKER.sub(lambda match: table(match.group(1)), markdown)
