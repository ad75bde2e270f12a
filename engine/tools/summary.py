"""Text and HTML summaries of a data module for notebooks: sizes, collator and why, batch shapes."""

from __future__ import annotations

import html
from typing import Any

import torch

from engine.loading.settings import LOADER_SETTINGS
from engine.sampling.modes import BUDGET_MODES
from engine.sources.long_rows import describe


def collator_line(dm: Any) -> dict[str, str]:
    """The collator's class, the registry entry that made it (if any) and why that entry was chosen."""
    resolution = dm.collator_resolution
    return {"class": getattr(dm.collator, "__qualname__", None) or type(dm.collator).__name__,
            "name": resolution.chosen.name if resolution is not None else "collate_fn",
            "reason": resolution.reason if resolution is not None else "collate_fn was given"}


def summary_rows(dm: Any, *, shapes: bool = True) -> list[tuple[str, str]]:
    """(label, value) pairs describing ``dm``; batch shapes appear once ``setup()`` has run (and ``shapes``).

    The collator is one short line, its class, registry name and reason; its options are ``repr(dm.collator)``."""
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
    mixture = getattr(dm, "mixture", None)
    if mixture is not None:
        rows.append(("mixture", mixture_line(mixture)))
    collator = collator_line(dm)
    rows.append(("collator", f"{collator['class']} from {collator['name']!r}: {collator['reason']}"))
    if getattr(dm.collator, "pad_source", None) == "eos":
        rows.append(("padding", f"with the tokenizer's eos token (id {dm.collator.pad_token_id}), as it has no pad "
                                f"token; padded positions get label -100 by position, so a real eos keeps its label"))
    rows.append(("loader", loader_line(dm)))
    transforms = {transform.argument: transform.transform for transform in getattr(dm, "transforms", {}).values()}
    if transforms:
        given = ", ".join(f"{name}={' '.join(repr(value).split())}" for name, value in transforms.items())
        rows.append(("transforms", f"{given} (per row; seeded by seed, epoch and dataset index, eval without the "
                                   f"epoch)"))
    for role, report in getattr(dm, "long_rows_report", {}).items():
        if report["long_rows"]:
            rows.append(("truncation" if report["policy"] == "truncate" else "long rows", describe(report, role)))
    if shapes and dm.datasets:
        try:
            shown = batch_shapes(dm)
        except ValueError as error:  # no batch (e.g. a sampler with none): said here, since repr must not raise
            rows.append(("batch", f"none: {error}"))
        else:
            if shown:
                rows.append(("batch", ", ".join(f"{key}: {shape}" for key, shape in shown.items())))
    return rows


def loader_line(dm: Any) -> str:
    """The train loader's settings that are ``shown`` (:data:`engine.loading.settings.SETTINGS`): those marked
    'always', and those marked 'changed' where they differ from their default. Under a token budget, ``max_tokens``
    stands for ``batch_size``, which does not size these batches (balanced by compute: its weight too)."""
    config, shown = dm.train_config, []
    for setting in LOADER_SETTINGS:
        value = getattr(config, setting.name)
        if setting.name == "batch_size" and dm.batching in BUDGET_MODES:
            balanced = getattr(dm, "balance", "tokens") == "compute"
            balance = f", balance='compute', attention_weight={dm.attention_weight:.3g}" if balanced else ""
            shown.append(f"max_tokens={dm.max_tokens} ({dm.batching}{balance})")
        elif setting.shown == "always" or (setting.shown == "changed" and value != setting.loader.default):
            shown.append(f"{setting.name}={value}")
    return ", ".join(shown)


def mixture_line(mixture: Any) -> str:
    """A module's mixture in one line: the names and weights of its sources (at step 0), what the weights are
    shares of, and its schedule and exhaust policies where they are not the defaults."""
    line = ", ".join(f"{name}={weight:.3g}" for name, weight in mixture.weights.items()) + f" (by {mixture.by}"
    if mixture.points:
        line += f"; schedule: {len(mixture.points)} change{'s' * (len(mixture.points) > 1)} up to step " \
                f"{mixture.points[-1][0]}"
    if any(policy != "cycle" for policy in mixture.exhaust.values()):
        line += "; exhaust: " + ", ".join(f"{name}={policy}" for name, policy in mixture.exhaust.items())
    if mixture.samples_per_epoch is not None:
        line += f"; samples_per_epoch={mixture.samples_per_epoch}"
    return line + ")"


def batch_shapes(dm: Any) -> dict[str, str]:
    """Shape (or type) of each key of the first training batch as the train loader builds it (see
    ``UniversalDataModule.first_batch``), or {} before setup or without training data."""
    if "train" not in dm.datasets:
        return {}
    batch = dm.first_batch()
    if batch is None:
        return {}
    items = batch.items() if isinstance(batch, dict) else enumerate(batch if isinstance(batch, (list, tuple))
                                                                     else [batch])
    return {str(key): describe_value(value) for key, value in items}


def describe_value(value: Any) -> str:
    """``[shape] dtype`` of a tensor, else the value's type name."""
    if isinstance(value, torch.Tensor):
        return f"{list(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    return type(value).__name__


def render_text(dm: Any) -> str:
    """``repr(dm)``: one short line per item; the collator's options are ``repr(dm.collator)``."""
    body = "\n".join(f"  {label}: {value}" for label, value in summary_rows(dm))
    return f"{type(dm).__name__}(\n{body}\n)"


def render_html(dm: Any) -> str:
    """The notebook table of a module not yet set up: the summary, the collator's options behind a <details>."""
    cells = "".join(
        f"<tr><th style='text-align:left'>{html.escape(label)}</th><td style='text-align:left'>"
        f"{html.escape(value)}</td></tr>"
        for label, value in summary_rows(dm)
    )
    return (f"<table><caption>UniversalDataModule</caption>{cells}</table><details><summary>collator options"
            f"</summary><code>{html.escape(repr(dm.collator))}</code></details>"
            f"<p>dm.report() sets up the splits and shows their lengths, padding and labels, with figures.</p>")
