"""The audit's `Report` (`core.py`, schema-1 JSON) and its writers: terminal (`table.py`,
`render.py`), Markdown, self-contained HTML with a roofline plot."""

from .core import Report as Report
