"""Figures for the data report and the monitor, drawn with matplotlib into inline SVG (no display, no pyplot).

Each function returns an HTML ``<figure class="udm-plot" data-plot="NAME">`` holding one ``<svg>``, ready to put
in a notebook cell or a saved page. Figures are ``matplotlib.figure.Figure`` objects rendered by the SVG
backend, so the notebook's own pyplot backend and state are never touched, and matplotlib is imported only
when a figure is drawn.
"""

from __future__ import annotations

import html
import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

SIZE = (4.6, 2.5)
"""Inches of a figure (at 100 dpi); small enough for two side by side in a notebook."""
COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")


def _figure(size: tuple[float, float] = SIZE) -> Any:
    from matplotlib.figure import Figure

    figure = Figure(figsize=size, dpi=100, layout="constrained")
    return figure, figure.add_subplot()


def figure_html(figure: Any, name: str, caption: str) -> str:
    """``figure`` as an inline SVG inside ``<figure data-plot=name>`` with ``caption`` under it."""
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text: smaller and searchable
        figure.savefig(buffer, format="svg")
    svg = buffer.getvalue()
    svg = svg[svg.index("<svg"):]  # drop the XML prolog and doctype: the SVG sits inside HTML
    return (f'<figure class="udm-plot" data-plot="{html.escape(name)}">{svg}'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def _style(axes: Any, title: str, xlabel: str, ylabel: str, *, integer_y: bool = False) -> None:
    if integer_y:
        from matplotlib.ticker import MaxNLocator

        axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_title(title, fontsize=10)
    axes.set_xlabel(xlabel, fontsize=9)
    axes.set_ylabel(ylabel, fontsize=9)
    axes.tick_params(labelsize=8)
    axes.spines[["top", "right"]].set_visible(False)


def length_histogram(lengths: np.ndarray, *, split: str, unit: str, max_length: int | None = None) -> str:
    """Histogram of one split's row lengths (from precomputed bin counts), with ``max_length`` marked."""
    figure, axes = _figure()
    counts, edges = np.histogram(lengths, bins=integer_bins(lengths))
    axes.stairs(counts, edges, fill=True, color=COLORS[0], alpha=0.85)
    if max_length is not None and len(lengths) and lengths.max() > max_length:
        axes.axvline(max_length, color=COLORS[3], linestyle="--", linewidth=1)
        axes.annotate(f"max_length={max_length}", (max_length, counts.max()), fontsize=8, color=COLORS[3],
                      ha="right", va="top", xytext=(-3, 0), textcoords="offset points")
    _style(axes, f"{split}: {len(lengths)} rows", f"length ({unit})", "rows", integer_y=True)
    return figure_html(figure, f"lengths-{split}", f"Row lengths of the {split} split, in {unit}.")


def integer_bins(lengths: np.ndarray, most: int = 40) -> np.ndarray:
    """Bin edges on whole lengths: every bin holds the same number of lengths (``[a, a + width)``), so no bin
    straddles a length or holds one more length than its neighbour. About Rice's rule many bins (fewer for a small
    split), at most ``most``."""
    if not len(lengths):
        return np.array([0, 1])
    low, high = int(lengths.min()), int(lengths.max())
    rice = max(5, int(np.ceil(2 * len(lengths) ** (1 / 3))))
    width = -(-(high - low + 1) // min(most, rice, high - low + 1))
    return np.arange(low, high + width + 1, width)


def padding_bars(shares: Mapping[str, float]) -> str:
    """Horizontal bars of the padding share of each batching (label -> share in [0, 1])."""
    figure, axes = _figure((4.6, 0.5 + 0.45 * len(shares)))
    labels = list(shares)
    values = [100 * shares[label] for label in labels]
    bars = axes.barh(labels, values, color=[COLORS[1], COLORS[2], *COLORS[3:]][: len(labels)])
    axes.bar_label(bars, labels=[f"{value:.1f}%" for value in values], fontsize=8, padding=3)
    axes.set_xlim(0, max([*values, 1.0]) * 1.3)  # room for the labels right of the bars
    axes.invert_yaxis()
    _style(axes, "padding share of one epoch's train batches", "% of padded positions holding no data", "")
    return figure_html(figure, "padding", "Padding share: plain shuffled batches beside the module's batching.")


def label_bars(counts: Mapping[str, Mapping[int, int]], names: Sequence[str] | None = None) -> str:
    """Grouped bars of each class's share of each split (so a small split compares with a large one); the classes
    named by ``names`` (a ``ClassLabel``'s) where given."""
    figure, axes = _figure()
    classes = sorted({label for per_split in counts.values() for label in per_split})
    positions = np.arange(len(classes))
    width = 0.8 / max(1, len(counts))
    for index, (split, per_split) in enumerate(counts.items()):
        total = max(1, sum(per_split.values()))
        shares = [100 * per_split.get(label, 0) / total for label in classes]
        axes.bar(positions + index * width - 0.4 + width / 2, shares, width,
                 label=f"{split} ({sum(per_split.values())} rows)", color=COLORS[index % len(COLORS)])
    axes.set_xticks(positions, [class_name(label, names) for label in classes])
    axes.set_ylim(0, axes.get_ylim()[1] * 1.3)  # headroom: the legend sits above the bars, not on them
    axes.legend(fontsize=8, frameon=False, loc="upper center", ncol=max(1, len(counts)))
    _style(axes, "label distribution", "class", "% of the split's rows")
    return figure_html(figure, "labels", "Share of each class in each split (counts in the table).")


def mixture_bars(numbers: Mapping[str, Any]) -> str:
    """Grouped bars per source of a mixture: the share its weights asked for beside its share of the rows served
    and, where known, of the tokens served (``numbers``: a mixture summary)."""
    sources = numbers["sources"]
    figure, axes = _figure((4.6, 2.7))
    kinds = [("target", "target_share"), ("rows served", "row_share")]
    if numbers["tokens_known"]:
        kinds.append(("tokens served", "token_share"))
    positions = np.arange(len(sources))
    width = 0.8 / len(kinds)
    for index, (label, key) in enumerate(kinds):
        axes.bar(positions + index * width - 0.4 + width / 2, [100 * source[key] for source in sources.values()],
                 width, label=label, color=COLORS[index])
    axes.set_xticks(positions, list(sources))
    axes.set_ylim(0, max(axes.get_ylim()[1], 1.0) * 1.3)  # headroom: the legend sits above the bars
    axes.legend(fontsize=8, frameon=False, loc="upper center", ncol=len(kinds))
    where = f"step {numbers['step']}" if "block" not in numbers else f"block {numbers['step']}"
    _style(axes, f"mixture by {numbers['by']} at {where}", "source", "% share")
    return figure_html(figure, "mixture", "Each source's target share beside its share of the rows and tokens "
                                          "served since the start of training.")


def mixture_weights(numbers: Mapping[str, Any]) -> str:
    """Each source's weight by training step (``numbers['weights_by_step']`` of a mixture summary): a schedule's
    switches and ramps, and a dashed line at each step where the run went on from a checkpoint of another
    mixture."""
    by_step = numbers["weights_by_step"]
    figure, axes = _figure((4.6, 2.7))
    for index, (name, weights) in enumerate(by_step["weights"].items()):
        axes.plot(by_step["steps"], weights, label=name, color=COLORS[index % len(COLORS)], linewidth=1.6)
    for number, step in enumerate(by_step["changes"]):
        axes.axvline(step, color="#555555", linestyle="--", linewidth=1,
                     label="another mixture's checkpoint" if number == 0 else None)
    axes.set_ylim(0, 1.3)  # headroom: the legend sits above the lines
    axes.legend(fontsize=8, frameon=False, loc="upper center", ncol=min(4, len(by_step["weights"]) + 1))
    where = "step" if "block" not in numbers else "block"
    _style(axes, f"mixture weights by {where}", where, "weight")
    return figure_html(figure, "mixture-weights", "Each source's weight at each step since the start of training; "
                                                  "a dashed line marks a change of mixture on resume.")


def class_name(label: int, names: Sequence[str] | None) -> str:
    """``label``'s name where ``names`` has one, else the number."""
    return names[label] if names is not None and 0 <= label < len(names) else str(label)


def image_grid(images: Any, labels: Sequence[Any] | None = None, columns: int = 8) -> str:
    """A grid of the first images of a batch (``N x C x H x W``, uint8 or float, each scaled to its own range)."""
    images = np.asarray(images.detach().cpu().float() if hasattr(images, "detach") else images, dtype=np.float32)
    count = len(images)
    rows = -(-count // columns)
    figure = _figure((1.1 * min(count, columns), 1.2 * rows))[0]
    figure.clear()
    for index, image in enumerate(images):
        axes = figure.add_subplot(rows, min(count, columns), index + 1)
        image = np.moveaxis(image, 0, -1) if image.ndim == 3 else image
        low, high = float(image.min()), float(image.max())
        image = (image - low) / (high - low) if high > low else np.zeros_like(image)
        axes.imshow(image.squeeze(-1) if image.ndim == 3 and image.shape[-1] == 1 else image,
                    cmap="gray" if image.ndim == 2 or image.shape[-1] == 1 else None, interpolation="nearest")
        axes.set_axis_off()
        if labels is not None:
            axes.set_title(str(labels[index]), fontsize=8)
    return figure_html(figure, "sample-images", "The first images of a train batch, with their labels.")


def wait_timeline(wait_s: Sequence[float], step_s: Sequence[float]) -> str:
    """Per training step: the time spent waiting for data beside the whole step's time, in milliseconds."""
    figure, axes = _figure((6.0, 2.6))
    steps = np.arange(1, len(step_s) + 1)
    step_ms, wait_ms = 1e3 * np.asarray(step_s, dtype=float), 1e3 * np.asarray(wait_s, dtype=float)
    axes.fill_between(steps, 0, step_ms, step="mid", color=COLORS[0], alpha=0.35, label="step (wait + work)")
    axes.fill_between(steps, 0, wait_ms, step="mid", color=COLORS[3], alpha=0.85, label="waiting for data")
    axes.set_xlim(0.5, max(1, len(steps)) + 0.5)
    axes.set_ylim(bottom=0)
    axes.legend(fontsize=8, frameon=False, loc="upper right")
    share = wait_ms.sum() / step_ms.sum() if step_ms.sum() else 0.0
    _style(axes, f"data wait per step ({share:.0%} of the time waited)", "step", "ms")
    return figure_html(figure, "wait-timeline", "Time per training step, and the part of it spent waiting for data.")
