"""Sample data the project ships: a bundled text corpus, a tokenizer trained on it, and small synthetic datasets.

Everything here is deterministic from a seed and works offline: nothing is downloaded. The text datasets come from
``demo/data/corpus.txt``, a generated corpus of short English sentences about two themes (nature and town), so a
tiny model learns it within a few dozen steps. Images and audio are synthesized per index from a seeded generator,
so the datasets hold no tensors and pickle cheaply into worker processes.
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path

import datasets
import torch
from torch.utils.data import Dataset
from transformers import PreTrainedTokenizerFast

CORPUS_PATH = Path(__file__).with_name("data") / "corpus.txt"
SPECIAL_TOKENS = {
    "pad_token": "<pad>",
    "unk_token": "<unk>",
    "bos_token": "<bos>",
    "eos_token": "<eos>",
    "mask_token": "<mask>",
    "cls_token": "<cls>",
    "sep_token": "<sep>",
}
"""Special tokens of :func:`build_tokenizer`, in id order (``<pad>`` is 0)."""


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


TOPIC_WORDS = (
    _words("fox bird owl deer rabbit wolf heron bear squirrel horse tortoise swan trees hill lake fog river "
           "forest rocks meadow moon mountain cones berries pond rain sun winter snow night spring "
           "stars"),
    _words("baker teacher driver keeper neighbour doctor clerk mayor postman painter librarian cook shop shops "
           "station market bus library bridge cafe hall queue parking bread school office paper monday noon "
           "evening work meeting lunch saturday"),
)
"""Words that mark each class of :func:`classification_dataset`: 0 = nature, 1 = town."""
CLASS_NAMES = ("nature", "town")


def load_corpus() -> list[str]:
    """The bundled corpus, one line (one to three sentences) per item.

    Example:
        >>> len(load_corpus()) > 500
        True
    """
    return CORPUS_PATH.read_text(encoding="utf-8").splitlines()


@functools.lru_cache(maxsize=4)
def build_tokenizer(vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on the bundled corpus; cached per ``vocab_size``.

    Encoding adds ``<bos>`` and ``<eos>`` around each text (and ``<sep>`` between a pair). Byte-level BPE
    round-trips any text: ``decode(encode(text), skip_special_tokens=True) == text``.

    Args:
        vocab_size: Largest vocabulary size, special and 256 byte tokens included; the small corpus runs out of
            merges at about 720 tokens, so use ``len(tokenizer)`` for the embedding size.

    Returns:
        A fast tokenizer with pad/unk/bos/eos/mask/cls/sep set; ``pad_token_id`` is 0.

    Raises:
        ValueError: If ``vocab_size`` cannot hold the special and byte tokens.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    minimum = len(SPECIAL_TOKENS) + 256
    if not isinstance(vocab_size, int) or vocab_size < minimum:
        raise ValueError(f"vocab_size should be an int >= {minimum} (special + byte tokens), but got {vocab_size!r}")
    specials = list(SPECIAL_TOKENS.values())
    tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(load_corpus(), trainer=trainer)
    bos, eos, sep = SPECIAL_TOKENS["bos_token"], SPECIAL_TOKENS["eos_token"], SPECIAL_TOKENS["sep_token"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}",
        pair=f"{bos} $A {sep} $B {eos}",
        special_tokens=[(token, tokenizer.token_to_id(token)) for token in (bos, eos, sep)],
    )
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=512, **SPECIAL_TOKENS)


def _take(rows: list, n: int | None, what: str) -> list:
    if n is None:
        return rows
    if not isinstance(n, int) or isinstance(n, bool) or not 0 < n <= len(rows):
        raise ValueError(f"{what}(n=...) should be an int in [1, {len(rows)}] or None, but got n={n!r}")
    return rows[:n]


def text_dataset(n: int | None = None) -> datasets.Dataset:
    """The corpus as a ``datasets.Dataset`` with one raw ``text`` column (for causal and masked LM).

    Args:
        n: Number of lines to keep (the first ``n``); None keeps all.
    """
    return datasets.Dataset.from_dict({"text": _take(load_corpus(), n, "text_dataset")})


def topic_of(text: str) -> int:
    """The class of a corpus line: 0 if it mentions more nature words, else 1 (town)."""
    words = re.findall(r"[a-z]+", text.lower())
    nature = sum(word in TOPIC_WORDS[0] for word in words)
    town = sum(word in TOPIC_WORDS[1] for word in words)
    return 0 if nature > town else 1


def classification_dataset(n: int | None = None) -> datasets.Dataset:
    """Corpus lines labelled by theme: ``text`` and ``labels`` (0 = nature, 1 = town), about half each.

    The themes use disjoint nouns, so a bag-of-words model separates them.
    """
    lines = _take(load_corpus(), n, "classification_dataset")
    return datasets.Dataset.from_dict({"text": lines, "labels": [topic_of(line) for line in lines]})


def seq2seq_dataset(n: int | None = None) -> datasets.Dataset:
    """Sentence pairs: ``source`` is a lower-cased corpus sentence, ``target`` the same words in reverse order.

    Args:
        n: Number of pairs to keep (the first ``n``); None keeps all (one per corpus sentence).
    """
    sentences = [s for line in load_corpus() for s in re.findall(r"[^.]+\.", line)]
    sources = [" ".join(re.findall(r"[a-z]+", s.lower())) for s in sentences]
    sources = _take([s for s in sources if s], n, "seq2seq_dataset")
    return datasets.Dataset.from_dict({"source": sources, "target": [" ".join(s.split()[::-1]) for s in sources]})


def _check_size(n: int, what: str) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise ValueError(f"{what}(n=...) should be a positive int, but got n={n!r}")
    return n


class _SeededRows(Dataset):
    """Rows generated on access from ``(seed, index)``: nothing is held in memory, any worker gets the same row."""

    num_classes = 4

    def __init__(self, n: int, seed: int, what: str) -> None:
        self.n, self.seed = _check_size(n, what), seed

    def __len__(self) -> int:
        return self.n

    def _row(self, index: int) -> tuple[int, torch.Generator]:
        if not -self.n <= index < self.n:
            raise IndexError(f"index should be in [-{self.n}, {self.n}), but got index={index}")
        index %= self.n
        return index, torch.Generator().manual_seed(self.seed * 1_000_003 + index)


class SyntheticImages(_SeededRows):
    """Map-style dataset of 3x32x32 uint8 images in 4 classes, each row generated from ``(seed, index)``.

    Class 0 has horizontal stripes, 1 vertical, 2 diagonal, 3 a checkerboard; colours, stripe period, phase and
    noise are random per row. Rows are ``{'pixel_values': uint8 [3, 32, 32], 'labels': int}``.
    """


    def __init__(self, n: int = 512, seed: int = 0) -> None:
        super().__init__(n, seed, "image_dataset")

    def __getitem__(self, index: int) -> dict:
        index, gen = self._row(index)
        label = index % self.num_classes
        period = 4 + int(torch.randint(0, 5, (), generator=gen))
        phase = float(torch.rand((), generator=gen)) * 2 * math.pi
        y, x = torch.meshgrid(torch.arange(32.0), torch.arange(32.0), indexing="ij")
        coord = (y, x, x + y, None)[label]
        if coord is None:
            wave = torch.sin(x * 2 * math.pi / period + phase) * torch.sin(y * 2 * math.pi / period + phase)
        else:
            wave = torch.sin(coord * 2 * math.pi / period + phase)
        mix = (wave > 0).float()
        fg, bg = torch.rand(2, 3, 1, 1, generator=gen) * 255
        image = fg * mix + bg * (1 - mix) + torch.randn(3, 32, 32, generator=gen) * 20
        return {"pixel_values": image.clamp(0, 255).to(torch.uint8), "labels": label}


class SyntheticAudio(_SeededRows):
    """Map-style dataset of 16 kHz mono tones in 4 classes, each row generated from ``(seed, index)``.

    Class ``k`` is a tone near ``FREQUENCIES[k]`` Hz (jittered by up to 5%) with random amplitude, phase and
    noise, 0.25 to 1.0 s long. Rows are ``{'input_values': float32 [samples], 'labels': int}``.
    """

    sample_rate = 16000
    FREQUENCIES = (220.0, 440.0, 880.0, 1760.0)

    def __init__(self, n: int = 256, seed: int = 0) -> None:
        super().__init__(n, seed, "audio_dataset")

    def __getitem__(self, index: int) -> dict:
        index, gen = self._row(index)
        label = index % self.num_classes
        r = torch.rand(4, generator=gen)
        samples = int(self.sample_rate * (0.25 + 0.75 * float(r[0])))
        freq = self.FREQUENCIES[label] * (0.95 + 0.1 * float(r[1]))
        t = torch.arange(samples, dtype=torch.float32) / self.sample_rate
        wave = (0.2 + 0.6 * float(r[2])) * torch.sin(2 * math.pi * freq * t + 2 * math.pi * float(r[3]))
        wave = wave + 0.05 * torch.randn(samples, generator=gen)
        return {"input_values": wave.to(torch.float32), "labels": label}


def image_dataset(n: int = 512, seed: int = 0) -> SyntheticImages:
    """``n`` synthetic 3x32x32 uint8 images in 4 classes (see :class:`SyntheticImages`)."""
    return SyntheticImages(n, seed)


def audio_dataset(n: int = 256, seed: int = 0) -> SyntheticAudio:
    """``n`` synthetic variable-length 16 kHz waveforms in 4 classes (see :class:`SyntheticAudio`)."""
    return SyntheticAudio(n, seed)


CAPTION_VOCAB = ("<pad>", "<image>", "<eos>", "a", "picture", "of", "horizontal", "vertical", "diagonal", "checkered",
                 "stripes", "squares")
"""The caption words of :class:`SyntheticCaptions`, in id order: ``<pad>`` is 0 and ``<image>`` 1, as
``TaskSpec.vlm_tiny()`` has them."""
CAPTIONS = ("a picture of horizontal stripes", "a picture of vertical stripes", "a picture of diagonal stripes",
            "a picture of checkered squares")
"""The caption of each class of :class:`SyntheticImages` pattern."""


class SyntheticCaptions(_SeededRows):
    """Map-style image-caption dataset: a :class:`SyntheticImages` pattern, resized to a side of 24 to 48 pixels and
    encoded as JPEG bytes, with the caption that names the pattern. Rows are ``{'image': bytes, 'input_ids':
    list[int]}`` (ids in :data:`CAPTION_VOCAB`, ending in ``<eos>``); the collator places the image's tokens first.
    The images are made on access from ``(seed, index)``: nothing binary ships with the project."""

    def __init__(self, n: int = 512, seed: int = 0) -> None:
        super().__init__(n, seed, "caption_dataset")
        self.images = SyntheticImages(n, seed)

    def __getitem__(self, index: int) -> dict:
        import io

        from PIL import Image

        index, gen = self._row(index)
        row = self.images[index]
        height, width = (24 + 8 * int(side) for side in torch.randint(0, 4, (2,), generator=gen))
        picture = Image.fromarray(row["pixel_values"].permute(1, 2, 0).numpy()).resize((width, height))
        buffer = io.BytesIO()
        picture.save(buffer, format="JPEG", quality=90)
        words = CAPTIONS[row["labels"]].split() + ["<eos>"]
        return {"image": buffer.getvalue(), "input_ids": [CAPTION_VOCAB.index(word) for word in words]}


def caption_dataset(n: int = 512, seed: int = 0) -> SyntheticCaptions:
    """``n`` synthetic JPEG images with their captions (see :class:`SyntheticCaptions`)."""
    return SyntheticCaptions(n, seed)
