"""Masked-LM masking as a pure function of (ids, generator): BERT's select-15%, then 80/10/10 replacement rule."""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["build_special_tokens_mask", "mask_tokens"]


def build_special_tokens_mask(input_ids: torch.Tensor, special_ids: Iterable[int]) -> torch.Tensor:
    """Boolean tensor shaped like ``input_ids``: True where the id is one of ``special_ids``.

    Example:
        >>> build_special_tokens_mask(torch.tensor([[101, 7, 102, 0]]), [0, 101, 102])
        tensor([[ True, False,  True,  True]])
    """
    ids = sorted({int(token_id) for token_id in special_ids})
    if not ids:
        return torch.zeros_like(input_ids, dtype=torch.bool)
    runs = _runs(ids)
    if len(runs) <= _MAX_RUNS:  # special ids cluster (0..5, or 0 and 100..103): a few comparisons beat isin
        out = None
        for low, high in runs:
            hit = input_ids == low if low == high else (input_ids >= low) & (input_ids <= high)
            out = hit if out is None else out.logical_or_(hit)
        return out
    return torch.isin(input_ids, torch.tensor(ids, dtype=input_ids.dtype, device=input_ids.device))


_MAX_RUNS = 4
"""Above this many runs of consecutive special ids, ``torch.isin`` is the faster test."""


def _runs(ids: list[int]) -> list[tuple[int, int]]:
    """Sorted distinct ints as ``(first, last)`` runs of consecutive values: [0, 100, 101] -> [(0, 0), (100, 101)]."""
    runs = [(ids[0], ids[0])]
    for token_id in ids[1:]:
        if token_id == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], token_id)
        else:
            runs.append((token_id, token_id))
    return runs


def _check_probability(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} should be a probability in [0, 1], but got {name}={value!r}")
    return float(value)


def mask_tokens(
    input_ids: torch.Tensor,
    *,
    mask_token_id: int,
    vocab_size: int,
    generator: torch.Generator,
    special_ids: Iterable[int] = (),
    special_tokens_mask: torch.Tensor | None = None,
    padding_mask: torch.Tensor | None = None,
    mlm_probability: float = 0.15,
    mask_replace_prob: float = 0.8,
    random_replace_prob: float = 0.1,
    label_pad_token_id: int = -100,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose tokens to predict and corrupt them, without touching ``input_ids`` or the global RNG.

    Each token that is not protected is selected independently with probability ``mlm_probability``.
    Of the selected, ``mask_replace_prob`` become ``mask_token_id``, ``random_replace_prob`` become a uniform
    random id in ``[0, vocab_size)``, and the rest keep their id. Protected (never selected): ids in
    ``special_ids``, positions where ``special_tokens_mask`` is true, and positions where ``padding_mask`` is
    true (padding is found by position, so a real token that shares the pad id can still be selected unless it is
    listed in ``special_ids``).

    Args:
        input_ids: integer tensor of token ids, any shape (usually ``[batch, length]``).
        mask_token_id: id written at the positions replaced by the mask token.
        vocab_size: random replacements are drawn from ``[0, vocab_size)``.
        generator: the only source of randomness; pass one derived from (seed, epoch, batch).
        special_ids: ids that are never selected (CLS, SEP, PAD, ...).
        special_tokens_mask: optional tensor shaped like ``input_ids``; nonzero means never select.
        padding_mask: optional boolean tensor shaped like ``input_ids``; True marks padding, never selected.
        mlm_probability: chance that an unprotected token is selected.
        mask_replace_prob: share of selected tokens replaced by ``mask_token_id``.
        random_replace_prob: share of selected tokens replaced by a random id.
        label_pad_token_id: label at positions that were not selected (ignored by the loss).

    Returns:
        ``(masked_input_ids, labels)``: new tensors; labels hold the original id at selected positions and
        ``label_pad_token_id`` elsewhere.

    Raises:
        TypeError: ``generator`` is not a ``torch.Generator`` or ``input_ids`` is not an integer tensor.
        ValueError: a probability is outside [0, 1], the replacement shares sum past 1, or ``vocab_size`` < 1.

    Example:
        >>> ids = torch.tensor([[101, 5, 6, 7, 102]])
        >>> masked, labels = mask_tokens(ids, mask_token_id=103, vocab_size=200, special_ids=[101, 102],
        ...                              mlm_probability=1.0, generator=torch.Generator().manual_seed(0))
        >>> labels
        tensor([[-100,    5,    6,    7, -100]])
    """
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"mask_tokens() draws only from an explicit generator, but got generator={generator!r}; "
            f"pass generator=torch.Generator().manual_seed(seed)"
        )
    if not isinstance(input_ids, torch.Tensor) or input_ids.is_floating_point() or input_ids.dtype == torch.bool:
        found = input_ids.dtype if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise TypeError(f"input_ids should be an integer torch.Tensor, but got {found}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size should be a positive int, but got vocab_size={vocab_size!r}")
    mlm_probability = _check_probability("mlm_probability", mlm_probability)
    mask_replace_prob = _check_probability("mask_replace_prob", mask_replace_prob)
    random_replace_prob = _check_probability("random_replace_prob", random_replace_prob)
    if mask_replace_prob + random_replace_prob > 1.0 + 1e-9:
        raise ValueError(
            f"mask_replace_prob + random_replace_prob should not exceed 1, but got "
            f"{mask_replace_prob} + {random_replace_prob}"
        )

    protected = build_special_tokens_mask(input_ids, special_ids)
    if special_tokens_mask is not None:
        protected |= special_tokens_mask.to(device=input_ids.device, dtype=torch.bool)
    if padding_mask is not None:
        protected |= padding_mask.to(device=input_ids.device, dtype=torch.bool)

    # Draw on the generator's device, then move: a CPU generator can still mask ids that live on a GPU.
    def uniform() -> torch.Tensor:
        return torch.rand(input_ids.shape, generator=generator, device=generator.device).to(input_ids.device)

    # In-place logical ops on the few [batch, length] temporaries: the draws and their order are unchanged.
    selected = (uniform() < mlm_probability).logical_and_(protected.logical_not_())
    unselected = selected.logical_not()
    labels = input_ids.masked_fill(unselected, label_pad_token_id)
    # One draw decides the replacement: [0, p_mask) -> mask, [p_mask, p_mask + p_random) -> random, else keep.
    how = uniform()
    to_mask = how < mask_replace_prob
    to_random = (how < mask_replace_prob + random_replace_prob).logical_and_(selected).logical_and_(
        to_mask.logical_not())
    to_mask.logical_and_(selected)
    masked = input_ids.masked_fill(to_mask, mask_token_id)
    count = int(to_random.sum())
    if count:
        random_ids = torch.randint(vocab_size, (count,), generator=generator, device=generator.device)
        masked[to_random] = random_ids.to(device=input_ids.device, dtype=input_ids.dtype)
    return masked, labels
