"""HTML that shows itself in a notebook and saves as a page: the carrier of the report's and monitor's figures."""

from __future__ import annotations

import html
from pathlib import Path


def html_page(title: str, body: str) -> str:
    """A complete, self-contained HTML page around ``body``."""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>body{{font-family:system-ui,sans-serif}}</style></head>"
            f"<body>{body}</body></html>")


def save_page(path: str | Path, title: str, body: str) -> Path:
    """Write :func:`html_page` to ``path`` (parents created) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html_page(title, body), encoding="utf-8")
    return path


class InlineFigure:
    """One figure as HTML (an inline SVG): shown by notebooks through ``_repr_html_``, written by :meth:`save`."""

    def __init__(self, html_text: str, *, title: str) -> None:
        self.html, self.title = html_text, title

    def _repr_html_(self) -> str:
        return self.html

    def save(self, path: str | Path) -> Path:
        """Write the figure as a self-contained HTML page and return its path."""
        return save_page(path, self.title, self.html)

    def __repr__(self) -> str:
        return f"InlineFigure({self.title!r}, {len(self.html)} characters of HTML)"
