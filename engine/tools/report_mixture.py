"""A mixture's target against what was served, per source: the numbers behind ``dm.report()``'s mixture section
and :class:`~engine.tools.mixture_callback.MixtureCallback`.

The counts are those of the train loader's saved state (the batches handed to the caller, on all ranks, since the
start of training), not of its sampler, which runs ahead of the caller by the batches handed to workers or
threads. So the report and the log agree with what a checkpoint saves, and go on from it after a resume.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

import numpy as np

from engine.core.compat import sampler_state_of
from engine.sampling.mixtures.order import MixtureOrder
from engine.sampling.position import PassState

STEP_BLOCKS = ("plain", "grouped")
"""Batching modes under which a mixture's block is one training step (the global batch)."""


class _SamplerAt:
    """A batch sampler seen at another position (a saved state's): what a mixture's summary reads of it."""

    def __init__(self, sampler: Any, position: PassState) -> None:
        self._sampler, self._pass = sampler, position

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sampler, name)


def served_summary(loader: Any) -> dict[str, Any] | None:
    """:meth:`MixtureOrder.summary <engine.sampling.mixtures.order.MixtureOrder.summary>` at the last batch ``loader``
    handed out, with the rows and tokens its state carries; None for a loader without a mixture."""
    sampler = getattr(loader, "batch_sampler", None)
    order = getattr(sampler, "mixture", None)
    if order is None:
        return None
    state = sampler_state_of(loader.data_state())
    if not isinstance(state, Mapping) or not isinstance(state.get("mixture"), Mapping):
        return order.summary(sampler)
    segments = tuple(tuple(int(value) for value in segment) for segment in state.get("served", ()))
    position = PassState.at(int(state["epoch"]), int(state["position"]), int(state.get("epoch_offset", 0)), segments)
    summary = order.summary(_SamplerAt(sampler, position))
    return with_served(summary, state["mixture"]["served"])


def with_served(summary: dict[str, Any], served: Mapping[str, Any]) -> dict[str, Any]:
    """``summary`` with each source's rows and tokens (and their shares) set from ``served`` ({name: [rows,
    tokens]}, a sampler state's counts)."""
    names = list(summary["sources"])
    counts = np.array([[int(value) for value in served.get(name, (0, 0))] for name in names],
                      dtype=np.int64).reshape(len(names), 2)
    totals = counts.sum(axis=0)
    for source, (rows, tokens) in zip(summary["sources"].values(), counts):
        source.update(rows=int(rows), tokens=int(tokens),
                      row_share=float(rows / totals[0]) if totals[0] else 0.0,
                      token_share=float(tokens / totals[1]) if totals[1] else 0.0)
    return summary


def mixture_numbers(dm: Any) -> dict[str, Any] | None:
    """The mixture section of ``dm.report().numbers``: the declared mixture's ``by`` and the served summary of the
    module's train loader (the one training iterates); None for a module without a mixture."""
    if getattr(dm, "mixture", None) is None or "train" not in dm.datasets:
        return None
    loader = dm.train_dataloader()
    numbers = served_summary(loader)
    order = loader.batch_sampler.mixture
    if dm.batching not in STEP_BLOCKS:  # a step holds a varying number of documents: the order counts blocks
        numbers["block"] = int(order.block)
    numbers["weights_by_step"] = order.weights_by_step(numbers["step"])
    numbers["history"] = [{"step": step, "weights": dict(declared["weights"])} for step, declared in order.history]
    return numbers


def changed_lines(numbers: Mapping[str, Any]) -> list[str]:
    """One line per checkpoint of another mixture the run went on from: its step and the weights served before."""
    return [f"changed at step {entry['step']} from a checkpoint of another mixture (weights before: "
            + ", ".join(f"{name}={weight:.3g}" for name, weight in entry["weights"].items()) + ")"
            for entry in numbers.get("history", ())]


def fresh_mixture_order(dm: Any) -> MixtureOrder | None:
    """A new order equal to the one the module's train loader draws from (its caches its own), for the report's
    samplers built afresh; None for a module without a mixture."""
    if getattr(dm, "mixture", None) is None or "train" not in dm.datasets:
        return None
    live = dm.train_dataloader().batch_sampler.mixture
    return MixtureOrder(live.mixture, live.sizes, block=live.block, seed=live.seed, lengths=live.lengths)


def columns(numbers: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(heading, key)`` of the mixture table: tokens only where the rows' token counts are known."""
    shown = [("weight now", "weight"), ("target share", "target_share"), ("rows served", "rows"),
             ("row share", "row_share")]
    if numbers["tokens_known"]:
        shown += [("tokens served", "tokens"), ("token share", "token_share")]
    return shown


def _cell(key: str, value: Any) -> str:
    if key == "weight":
        return f"{value:.3g}"
    return f"{value:.1%}" if key.endswith("share") else str(value)


def heading(numbers: Mapping[str, Any]) -> str:
    """One line: what the weights are shares of, and where training stands (in training steps, or in blocks of
    documents where a step holds a varying number of them)."""
    where = f"at step {numbers['step']}" if "block" not in numbers else \
        f"after {numbers['step']} blocks of {numbers['block']} documents"
    return f"by {numbers['by']}, {where} (epoch {numbers['epoch']}); served since the start of training, all ranks"


def mixture_lines(numbers: Mapping[str, Any] | None) -> list[str]:
    """The mixture section as text lines (empty without a mixture)."""
    if not numbers:
        return []
    shown = columns(numbers)
    lines = [f"  mixture now: {heading(numbers)}"] + [f"  mixture {line}" for line in changed_lines(numbers)]
    for name, source in numbers["sources"].items():
        lines.append(f"  mixture {name}: " + ", ".join(f"{label} {_cell(key, source[key])}"
                                                     for label, key in shown))
    return lines


def mixture_html(numbers: Mapping[str, Any] | None) -> str:
    """The mixture section as an HTML table, one row per source (empty without a mixture)."""
    if not numbers:
        return ""
    shown = columns(numbers)
    head = "".join(f"<th>{html.escape(label)}</th>" for label, _ in shown)
    body = "".join(f"<tr><th>{html.escape(name)}</th>" + "".join(f"<td>{_cell(key, source[key])}</td>"
                                                                 for _, key in shown) + "</tr>"
                   for name, source in numbers["sources"].items())
    changed = "".join(f"<p>{html.escape(line)}</p>" for line in changed_lines(numbers))
    return (f"<h4>mixture</h4><p>{html.escape(heading(numbers))}</p>{changed}"
            f'<table data-section="mixture"><tr><th>source</th>{head}</tr>{body}</table>')
