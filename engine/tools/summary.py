"""Text and HTML summaries of a data module for notebooks: sizes, collator and why, batch shapes."""

from __future__ import annotations

import html
import itertools
from typing import Any

import torch

from engine.sources.long_rows import describe


def summary_rows(dm: Any) -> list[tuple[str, str]]:
    """(label, value) pairs describing ``dm``; batch shapes appear once ``setup()`` has run."""
    spec = dm.task_spec
    task = f"{spec.name} ({spec.modality}, {spec.task_type})" if spec is not None else "none (default collator)"
    rows = [("task", task)]
    if dm.datasets:
        sizes = ", ".join(f"{role}={'stream' if size is None else size}"
                          for role, size in dm.split_sizes.items() if size != 0)
        rows.append(("splits", f"{sizes} (seed={dm.seed})"))
    else:
        sizes = ", ".join(f"{role}={len(source)}" for role, source in dm._given.items())
        rows.append(("data", f"{sizes} (splits after setup(); val_split={dm.val_split!r})"))
    resolution = dm.collator_resolution
    why = f"{resolution.chosen.name!r}: {resolution.reason}" if resolution is not None else "collate_fn was given"
    rows.append(("collator", f"{dm.collator!r} [{why}]"))
    config = dm.train_config
    rows.append(("loader", f"batch_size={config.batch_size}, shuffle={config.shuffle}, "
                           f"num_workers={config.num_workers}, drop_last={config.drop_last}"))
    for role, report in getattr(dm, "long_rows_report", {}).items():
        if report["long_rows"]:
            rows.append(("truncation" if report["policy"] == "truncate" else "long rows", describe(report, role)))
    shapes = batch_shapes(dm)
    if shapes:
        rows.append(("batch", ", ".join(f"{key}: {shape}" for key, shape in shapes.items())))
    return rows


def batch_shapes(dm: Any) -> dict[str, str]:
    """Shape (or type) of each key of the first training batch, or {} before setup."""
    source = dm.datasets.get("train")
    if source is None:
        return {}
    if not hasattr(source, "__getitems__"):  # a stream: its first rows
        rows = list(itertools.islice(iter(source.stream), dm.train_config.batch_size))
    else:
        rows = source.__getitems__(list(range(min(dm.train_config.batch_size, len(source)))))
    batch = dm.collator(rows)
    items = batch.items() if isinstance(batch, dict) else enumerate(batch if isinstance(batch, (list, tuple))
                                                                     else [batch])
    return {str(key): _describe(value) for key, value in items}


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{list(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    return type(value).__name__


def render_text(dm: Any) -> str:
    body = "\n".join(f"  {label}: {value}" for label, value in summary_rows(dm))
    return f"UniversalDataModule(\n{body}\n)"


def render_html(dm: Any) -> str:
    cells = "".join(
        f"<tr><th style='text-align:left'>{html.escape(label)}</th><td style='text-align:left'>"
        f"{html.escape(value)}</td></tr>"
        for label, value in summary_rows(dm)
    )
    return f"<table><caption>UniversalDataModule</caption>{cells}</table>"
