"""Vision-language collation: text with image placeholders for a decoder, and image-text pairs.

:class:`VisionLanguageCollator` (task_type ``causal_lm``) expands each image placeholder token of a row into the
image's number of image tokens (as Llava-style processors do), pads the rows, and gives ``labels`` at -100 on image
tokens, padding and the prompt. :class:`ImageTextCollator` (classification, contrastive pairs) pads ``input_ids``
and stacks one image per row. Both decode and resize images with :class:`collators._vlm_images.ImagePipeline`, or
leave them encoded for decoding on the device (``decode_device``, see :mod:`collators._vlm_decode`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from collators._extra import add_extra_keys
from collators._padding import check_padding_side, pad_sequences
from collators._vlm_decode import ENCODED_KEY, FLIPS_KEY, check_decode_device, encoded_batch
from collators._vlm_images import ImagePipeline
from collators.default import MISSING, check_targets_present, collate_labels
from collators.targets import row_name
from task_spec import TaskSpec

__all__ = ["ENCODED_KEY", "FLIPS_KEY", "ImageTextCollator", "VisionLanguageCollator", "create_multimodal_collator",
           "expand_placeholders"]

IMAGE_KEYS = ("images", "image")
"""Where a row holds its images: ``images`` (a list, in order) or ``image`` (one)."""
CONSUMED = {*IMAGE_KEYS, "prompt_length", "labels"}
"""Row keys a vision-language batch is made from, not passed through."""


class _ImageTextBase:
    """What both collators share: the token ids of a row, its images, the pad id, the image step."""

    def __init__(self, *, images: ImagePipeline, tokenizer: Any = None, pad_token_id: int | None = None,
                 padding_side: str = "right", max_length: int | None = None, text_field: str = "text",
                 input_field: str = "input_ids", image_field: str = "pixel_values",
                 decode_device: str | None = None) -> None:
        self.images = images
        if pad_token_id is None and tokenizer is not None:
            pad_token_id = tokenizer.pad_token_id
        if pad_token_id is None:
            raise ValueError("padding needs pad_token_id, but got none: pass pad_token_id=..., a tokenizer with a "
                             "pad token, or set the spec's special_tokens['pad_token_id']")
        if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)
                                       or max_length < 1):
            raise ValueError(f"max_length should be a positive int or None, but got max_length={max_length!r}")
        self.tokenizer, self.pad_token_id = tokenizer, int(pad_token_id)
        self.padding_side, self.max_length = check_padding_side(padding_side), max_length
        self.text_field, self.input_field, self.image_field = text_field, input_field, image_field
        self.decode_device = check_decode_device(decode_device, images)

    def _ids(self, row: Mapping[str, Any], where: str) -> list[int]:
        """The row's token ids: its ``input_field``, or its raw text tokenized with the tokenizer."""
        if self.input_field in row:
            ids = row[self.input_field]
            return ids.tolist() if isinstance(ids, torch.Tensor) else [int(token) for token in ids]
        if self.text_field in row and self.tokenizer is not None:
            return list(self.tokenizer(row[self.text_field])["input_ids"])
        raise KeyError(f"{where} has neither {self.input_field!r} nor {self.text_field!r} with a tokenizer (keys: "
                       f"{sorted(row)}); pass token ids, or raw text and tokenizer=...")

    @staticmethod
    def _row_images(row: Mapping[str, Any]) -> list[Any]:
        if "images" in row:
            images = row["images"]
            return [] if images is None else list(images)
        return [row["image"]] if row.get("image") is not None else []

    def image_batch(self, images: list[Any], where: list[str], sizes: list[tuple[int, int]],
                     generator: torch.Generator | None) -> dict[str, Any]:
        """``pixel_values`` (or, with ``decode_device``, the encoded images for the device step), plus
        ``image_sizes`` when sizes vary."""
        flips = self.images.draw_flips(len(images), generator)
        if self.decode_device is not None:
            batch = encoded_batch(images, where, flips, self.image_field)
        elif images:
            batch = {self.image_field: self.images(images, where, flips)}
        else:
            batch = {self.image_field: torch.zeros((0, 3, *(sizes[0] if sizes else self.images.image_size or (0, 0))))}
        if self.images.varies:
            batch["image_sizes"] = torch.tensor(sizes, dtype=torch.int64).reshape(-1, 2)
        if self.images.resize == "tile" and self.images.image_processor is None:
            tile = torch.tensor(self.images.image_size, dtype=torch.int64)
            batch["image_grid"] = (torch.tensor(sizes, dtype=torch.int64).reshape(-1, 2) // tile).reshape(-1, 2)
        return batch

    def _pad(self, sequences: list[list[int]], value: int) -> torch.Tensor:
        padded, _ = pad_sequences([torch.tensor(ids, dtype=torch.int64) for ids in sequences], pad_value=value,
                                  padding_side=self.padding_side)
        return padded


class VisionLanguageCollator(_ImageTextBase):
    """Causal LM batches of text with images: placeholders expanded, images decoded, prompt and images unlabelled.

    A row is a dict with ``input_ids`` (or raw ``text`` and a tokenizer) holding one ``image_token_id`` per image,
    in order, and its images under ``images`` (a list) or ``image``; a row without any placeholder gets its images'
    tokens before its text (captioning data). ``prompt_length`` (optional) counts the leading tokens of the row's
    own ids that are the prompt: their labels are -100. Other keys pass through to the batch.

    The batch: ``input_ids``, ``attention_mask``, ``labels`` ``[B, T]`` (labels -100 on image tokens, padding and
    prompts); ``pixel_values`` ``[N, 3, H, W]``, the N images of the batch in row order; ``images_per_row`` ``[B]``;
    ``image_sizes`` ``[N, 2]`` when sizes vary (``resize='longest'``; pixels padded at the bottom and right).

    Args:
        images: The image step (decode, resize, normalize).
        image_token_id: The placeholder id; read from ``tokenizer`` for ``image_token`` when not given.
        image_token: The placeholder token in the tokenizer's vocabulary.
        tokenizer: Gives the pad and image token ids, and tokenizes raw text.
        pad_token_id: Padding id (the tokenizer's when not given).
        padding_side: ``'right'`` or ``'left'``.
        max_length: Longest expanded row; a longer one raises (cutting would split an image's tokens).
        label_pad_token_id: The label of unlabelled positions.
        decode_device: Leave images encoded for decoding on this device after collation (see
            :class:`collators._vlm_decode.DeviceDecode`); None decodes in the loader's workers.

    Example:
        >>> images = ImagePipeline(image_size=(4, 4), image_tokens=2)
        >>> collate = VisionLanguageCollator(images=images, image_token_id=9, pad_token_id=0)
        >>> batch = collate([{"input_ids": [9, 5, 6], "image": torch.zeros(3, 8, 8, dtype=torch.uint8)}])
        >>> batch["input_ids"].tolist(), batch["labels"].tolist(), tuple(batch["pixel_values"].shape)
        ([[9, 9, 5, 6]], [[-100, -100, 5, 6]], (1, 3, 4, 4))
    """

    def __init__(self, *, images: ImagePipeline, image_token_id: int | None = None, image_token: str = "<image>",
                 tokenizer: Any = None, pad_token_id: int | None = None, padding_side: str = "right",
                 max_length: int | None = None, label_pad_token_id: int = -100, text_field: str = "text",
                 input_field: str = "input_ids", image_field: str = "pixel_values",
                 decode_device: str | None = None) -> None:
        super().__init__(images=images, tokenizer=tokenizer, pad_token_id=pad_token_id, padding_side=padding_side,
                         max_length=max_length, text_field=text_field, input_field=input_field,
                         image_field=image_field, decode_device=decode_device)
        self.image_token_id = image_token_id_of(image_token_id, image_token, tokenizer)
        self.label_pad_token_id = int(label_pad_token_id)

    def row_length(self, row: Mapping[str, Any]) -> int:
        """The row's token count with its image tokens: what length-aware batching and packing plan by (encoded
        images are measured from their headers, not decoded)."""
        return len(self._expand(row, "row")[0])

    def _expand(self, row: Any, where: str) -> tuple[list[int], list[int], list[Any], list[tuple[int, int]]]:
        """One row's expanded ids, its labels, its images and their resized sizes."""
        if not isinstance(row, Mapping):
            raise TypeError(f"{where} should be a dict with token ids and images, but got {type(row).__name__}")
        images = self._row_images(row)
        sizes = self.images.sizes(images, [where] * len(images))
        ids, prompt_end = expand_placeholders(self._ids(row, where), self.image_token_id,
                                              [self.images.tokens(size) for size in sizes], where=where,
                                              prompt_length=row.get("prompt_length"))
        if self.max_length is not None and len(ids) > self.max_length:
            raise ValueError(f"{where} has {len(ids)} tokens with its image tokens, more than max_length="
                             f"{self.max_length}; cutting it would split an image's tokens: drop or shorten the "
                             f"row, or raise max_length (the spec's additional_config['max_seq_len'])")
        labels = [self.label_pad_token_id if index < prompt_end or token == self.image_token_id else token
                  for index, token in enumerate(ids)]
        return ids, labels, images, sizes

    def expand_rows(self, rows: Sequence[Any]) -> tuple[list[list[int]], list[list[int]], list[Any], list[str],
                                                        list[tuple[int, int]], list[int]]:
        """Every row's expanded ids and labels, the batch's images in order with their names and sizes, and the
        image count of each row."""
        ids, labels, images, where, sizes, counts = [], [], [], [], [], []
        for position, row in enumerate(rows):
            name = row_name(rows, position)
            row_ids, row_labels, row_images, row_sizes = self._expand(row, name)
            ids.append(row_ids)
            labels.append(row_labels)
            images += row_images
            where += [f"{name}'s image {index}" for index in range(len(row_images))]
            sizes += row_sizes
            counts.append(len(row_images))
        return ids, labels, images, where, sizes, counts

    def __call__(self, rows: Sequence[Any], generator: torch.Generator | None = None) -> dict[str, Any]:
        """Collate ``rows``; ``generator`` draws the random flips (when ``flip_probability`` > 0)."""
        if len(rows) == 0:
            raise ValueError("VisionLanguageCollator got an empty list of rows; a batch needs at least one row")
        ids, labels, images, where, sizes, counts = self.expand_rows(rows)
        batch = {self.input_field: self._pad(ids, self.pad_token_id),
                 "attention_mask": self._pad([[1] * len(row) for row in ids], 0),
                 "labels": self._pad(labels, self.label_pad_token_id),
                 **self.image_batch(images, where, sizes, generator),
                 "images_per_row": torch.tensor(counts, dtype=torch.int64)}
        return add_extra_keys(batch, rows, CONSUMED | {self.input_field, self.text_field})

    def __repr__(self) -> str:
        return (f"VisionLanguageCollator(images={self.images!r}, image_token_id={self.image_token_id}, "
                f"pad_token_id={self.pad_token_id}, padding_side={self.padding_side!r}, max_length={self.max_length}, "
                f"decode_device={self.decode_device!r})")


class ImageTextCollator(_ImageTextBase):
    """Image-text pairs: padded ``input_ids`` and ``attention_mask``, one image per row in ``pixel_values``
    ``[B, 3, H, W]``, and labels when the rows carry them (classification; contrastive pairs have none: row i's
    text matches row i's image).

    Example:
        >>> collate = ImageTextCollator(images=ImagePipeline(image_size=4, image_tokens=1), pad_token_id=0)
        >>> batch = collate([{"input_ids": [5, 6], "image": torch.zeros(3, 8, 8, dtype=torch.uint8), "labels": 1},
        ...                  {"input_ids": [7], "image": torch.zeros(3, 6, 6, dtype=torch.uint8), "labels": 0}])
        >>> batch["input_ids"].tolist(), tuple(batch["pixel_values"].shape), batch["labels"].tolist()
        ([[5, 6], [7, 0]], (2, 3, 4, 4), [1, 0])
    """

    def __init__(self, *, images: ImagePipeline, tokenizer: Any = None, pad_token_id: int | None = None,
                 padding_side: str = "right", max_length: int | None = None, target_field: str | None = "labels",
                 num_classes: int | None = None, require_targets: bool = False, text_field: str = "text",
                 input_field: str = "input_ids", image_field: str = "pixel_values",
                 decode_device: str | None = None) -> None:
        super().__init__(images=images, tokenizer=tokenizer, pad_token_id=pad_token_id, padding_side=padding_side,
                         max_length=max_length, text_field=text_field, input_field=input_field,
                         image_field=image_field, decode_device=decode_device)
        self.target_field, self.num_classes, self.require_targets = target_field, num_classes, bool(require_targets)

    def __call__(self, rows: Sequence[Any], generator: torch.Generator | None = None) -> dict[str, Any]:
        """Collate ``rows``; ``generator`` draws the random flips (when ``flip_probability`` > 0)."""
        if len(rows) == 0:
            raise ValueError("ImageTextCollator got an empty list of rows; a batch needs at least one row")
        ids, images, where, labels = [], [], [], []
        for position, row in enumerate(rows):
            name = row_name(rows, position)
            if not isinstance(row, Mapping):
                raise TypeError(f"{name} should be a dict with token ids and an image, but got {type(row).__name__}")
            row_images = self._row_images(row) if any(key in row for key in IMAGE_KEYS) else (
                [row[self.image_field]] if self.image_field in row else [])
            if len(row_images) != 1:
                raise ValueError(f"{name} should hold one image (under 'image'), but got {len(row_images)}; image-"
                                 f"text pairs have one image per row (rows with several images are for causal_lm)")
            row_ids = self._ids(row, name)
            if self.max_length is not None:
                row_ids = row_ids[: self.max_length]
            ids.append(row_ids)
            images += row_images
            where.append(f"{name}'s image")
            label = row.get(self.target_field) if self.target_field is not None else None
            labels.append(MISSING if label is None else label)
        sizes = self.images.sizes(images, where)
        batch = {self.input_field: self._pad(ids, self.pad_token_id),
                 "attention_mask": self._pad([[1] * len(row) for row in ids], 0),
                 **self.image_batch(images, where, sizes, generator)}
        check_targets_present(labels, rows, str(self.target_field), self.require_targets)
        if any(label is not MISSING for label in labels):
            batch[str(self.target_field)] = collate_labels(labels, key=str(self.target_field),
                                                           num_classes=self.num_classes, rows=rows)
        consumed = {self.input_field, self.text_field, self.image_field, *IMAGE_KEYS, str(self.target_field)}
        return add_extra_keys(batch, rows, consumed)

    def __repr__(self) -> str:
        return (f"ImageTextCollator(images={self.images!r}, pad_token_id={self.pad_token_id}, "
                f"target_field={self.target_field!r}, decode_device={self.decode_device!r})")


def image_token_id_of(image_token_id: int | None, image_token: str, tokenizer: Any) -> int:
    """The placeholder id: given, or the tokenizer's id of ``image_token`` (which must be in its vocabulary)."""
    if image_token_id is not None:
        if isinstance(image_token_id, bool) or not isinstance(image_token_id, int) or image_token_id < 0:
            raise ValueError(f"image_token_id should be a non-negative int, but got image_token_id={image_token_id!r}")
        return image_token_id
    if tokenizer is None:
        raise ValueError("the image placeholder needs image_token_id=... or a tokenizer that holds image_token "
                         f"{image_token!r}, but got neither; pass one, or set the spec's "
                         "special_tokens['image_token_id']")
    token_id = tokenizer.convert_tokens_to_ids(image_token)
    if token_id is None or token_id == tokenizer.unk_token_id:
        raise ValueError(f"the tokenizer has no token {image_token!r} (it reads as unknown); add it with "
                         f"tokenizer.add_special_tokens({{'additional_special_tokens': [{image_token!r}]}}), or pass "
                         f"image_token= naming the tokenizer's image token")
    return int(token_id)


def expand_placeholders(ids: Sequence[int], token_id: int, tokens: Sequence[int], *, where: str = "row 0",
                        prompt_length: int | None = None) -> tuple[list[int], int]:
    """``ids`` with its i-th ``token_id`` repeated ``tokens[i]`` times, and where the prompt ends in the result.

    Without any placeholder, the images' tokens go first (a caption after its image). ``prompt_length`` counts the
    leading tokens of ``ids`` that are the prompt (0 when None); placeholders inside it grow it by their tokens.
    """
    positions = [index for index, token in enumerate(ids) if token == token_id]
    prompt = 0 if prompt_length is None else int(prompt_length)
    if not 0 <= prompt <= len(ids):
        raise ValueError(f"{where}: prompt_length should be in [0, {len(ids)}] (the row's token count), but got "
                         f"prompt_length={prompt_length!r}")
    if not positions and tokens:
        ids, positions, prompt = [token_id] * len(tokens) + list(ids), list(range(len(tokens))), prompt + len(tokens)
    if len(positions) != len(tokens):
        raise ValueError(f"{where} has {len(positions)} image placeholder(s) (token id {token_id}) but "
                         f"{len(tokens)} image(s); put one placeholder in the text where each image goes, in order")
    out: list[int] = []
    previous = 0
    prompt_end = prompt
    for position, count in zip(positions, tokens):
        out += ids[previous:position]
        out += [token_id] * count
        previous = position + 1
        if position < prompt:
            prompt_end += count - 1
    out += ids[previous:]
    return out, prompt_end


def create_multimodal_collator(task_spec: TaskSpec | None = None, tokenizer: Any = None, **kwargs: Any) -> Any:
    """Factory for the registry: a :class:`VisionLanguageCollator` for ``causal_lm``, else an
    :class:`ImageTextCollator`; options from ``task_spec``, overridden by ``kwargs``.

    Token ids resolve as in the text collator: the explicit argument, then the tokenizer (``image_token``, its pad
    token), then ``special_tokens`` (``image_token_id``, ``pad_token_id``). The image step reads
    ``additional_config`` (``image_size``, ``max_image_size``, ``max_tiles``, ``patch_size``, ``image_tokens``) and
    ``preprocessing_config`` (``normalization``, ``resize``, ``flip_probability``, ``decode_device``) unless kwargs
    give them; ``image_processor=`` replaces resize and normalization.
    """
    kwargs["tokenizer"] = tokenizer
    image_keys = ("image_size", "resize", "max_image_size", "max_tiles", "patch_size", "image_tokens",
                  "normalization", "mean", "std", "flip_probability", "image_processor")
    image_options = {key: kwargs.pop(key) for key in image_keys if key in kwargs}
    causal = kwargs.pop("task_type", task_spec.task_type if task_spec is not None else "causal_lm") == "causal_lm"
    if task_spec is not None:
        config, options = task_spec.additional_config, task_spec.preprocessing_config
        for key in ("image_size", "max_image_size", "max_tiles", "patch_size", "image_tokens"):
            if config.get(key) is not None:
                image_options.setdefault(key, config[key])
        for key in ("normalization", "resize", "flip_probability"):
            if options.get(key) is not None and not ("mean" in image_options and key == "normalization"):
                image_options.setdefault(key, options[key])
        if options.get("decode_device") is not None:
            kwargs.setdefault("decode_device", options["decode_device"])
        if options.get("padding_side") is not None:
            kwargs.setdefault("padding_side", options["padding_side"])
        if task_spec.special_tokens.get("pad_token_id") is not None and getattr(tokenizer, "pad_token_id",
                                                                                 None) is None:
            kwargs.setdefault("pad_token_id", task_spec.special_tokens["pad_token_id"])
        if causal:
            kwargs.setdefault("max_length", task_spec.max_seq_len)
            if task_spec.special_tokens.get("image_token_id") is not None and not _holds(
                    tokenizer, kwargs.get("image_token", "<image>")):
                kwargs.setdefault("image_token_id", task_spec.special_tokens["image_token_id"])
        else:
            kwargs.setdefault("target_field", task_spec.target_field)
            kwargs.setdefault("require_targets", task_spec.is_supervised and task_spec.target_field is not None
                              and task_spec.loss_type != "contrastive")
            if task_spec.loss_type == "cross_entropy":
                kwargs.setdefault("num_classes", task_spec.num_classes)
    if "image_tokens" not in image_options and "patch_size" not in image_options and not causal:
        image_options["image_tokens"] = 1  # pairs do not expand placeholders: the count is unused
    images = ImagePipeline(**image_options)
    return VisionLanguageCollator(images=images, **kwargs) if causal else ImageTextCollator(images=images, **kwargs)


def _holds(tokenizer: Any, token: str) -> bool:
    """Whether ``tokenizer`` has ``token`` in its vocabulary (not read as unknown)."""
    if tokenizer is None:
        return False
    token_id = tokenizer.convert_tokens_to_ids(token)
    return token_id is not None and token_id != tokenizer.unk_token_id
