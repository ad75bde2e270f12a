"""Tiny LightningModules for the demo: one per task, each at most a hundred thousand parameters.

Every model reads the batch keys the collators promise, records its training loss per step and the batch
statistics the demo prints (shapes of the first batch, share of padded positions), and trains in seconds on a CPU.
"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100


class DemoModel(L.LightningModule):
    """Base class: subclasses define :meth:`loss`; this records losses and batch statistics while training."""

    def __init__(self, lr: float = 3e-3) -> None:
        super().__init__()
        self.lr = lr
        self.train_losses: list[float] = []
        self.batch_shapes: dict[str, tuple[int, ...]] = {}
        self.padded = 0
        self.positions = 0

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if not self.batch_shapes:
            self.batch_shapes = {key: tuple(value.shape) for key, value in batch.items() if torch.is_tensor(value)}
        mask = batch.get("attention_mask")
        if mask is not None:
            self.padded += int((mask == 0).sum())
            self.positions += mask.numel()
        loss = self.loss(batch)
        self.train_losses.append(float(loss.detach()))
        return loss

    @torch.no_grad()
    def mean_loss(self, batches: list[dict[str, torch.Tensor]]) -> float:
        """Mean loss over ``batches`` in eval mode (used before and after training on fixed val batches)."""
        was_training = self.training
        self.eval()
        losses = [float(self.loss(batch)) for batch in batches]
        self.train(was_training)
        return sum(losses) / max(len(losses), 1)

    @property
    def padding_share(self) -> float | None:
        """Share of padded positions (``attention_mask == 0``) in the batches trained on; None without a mask."""
        return self.padded / self.positions if self.positions else None

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` [B, T, D] over the positions where ``mask`` [B, T] is nonzero."""
    mask = mask.unsqueeze(-1).to(x.dtype)
    return (x * mask).sum(1) / mask.sum(1).clamp(min=1)


class CausalLM(DemoModel):
    """Embedding + GRU + linear head; predicts token ``t + 1`` from tokens ``<= t`` (labels shift here)."""

    def __init__(self, vocab_size: int, dim: int = 64, lr: float = 3e-3) -> None:
        super().__init__(lr)
        self.embed = nn.Embedding(vocab_size, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, vocab_size)

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden, _ = self.rnn(self.embed(batch["input_ids"]))
        logits = self.head(hidden[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), batch["labels"][:, 1:].flatten(), ignore_index=IGNORE_INDEX)


class MaskedLM(DemoModel):
    """Embedding + bidirectional GRU + linear head; predicts the tokens at the masked positions."""

    def __init__(self, vocab_size: int, dim: int = 64, lr: float = 3e-3) -> None:
        super().__init__(lr)
        self.embed = nn.Embedding(vocab_size, dim)
        self.rnn = nn.GRU(dim, dim // 2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(dim, vocab_size)

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden, _ = self.rnn(self.embed(batch["input_ids"]))
        logits = self.head(hidden)
        return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX)


def document_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """Boolean ``[B, T, T]`` attention mask of packed sequences: token ``i`` sees token ``j`` only when ``j <= i``
    and both belong to the same document (a document starts where ``position_ids`` is 0)."""
    document = (position_ids == 0).cumsum(-1)  # [B, T]: which document each token belongs to
    same = document.unsqueeze(-1) == document.unsqueeze(-2)
    return same.tril_()


class PackedCausalLM(DemoModel):
    """One causal self-attention block over packed batches (``input_ids`` ``[1, T]``): positions come from
    ``position_ids`` and attention stays within each document, so a document's logits are the same packed or
    alone. Labels shift here; the collator's -100 at each document's first position stops cross-document targets."""

    def __init__(self, vocab_size: int, dim: int = 64, max_positions: int = 1024, heads: int = 4,
                 lr: float = 3e-3) -> None:
        super().__init__(lr)
        self.heads = heads
        self.embed = nn.Embedding(vocab_size, dim)
        self.position = nn.Embedding(max_positions, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size)

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """``[B, T, vocab]`` next-token logits of a packed (or single-document) batch."""
        position_ids = batch["position_ids"]
        hidden = self.embed(batch["input_ids"]) + self.position(position_ids)
        q, k, v = (part.unflatten(-1, (self.heads, -1)).transpose(1, 2) for part in self.qkv(hidden).chunk(3, -1))
        mask = document_causal_mask(position_ids).unsqueeze(1)  # [B, 1, T, T], broadcast over heads
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).flatten(2)
        hidden = hidden + self.out(attended)
        hidden = hidden + self.mlp(hidden)
        return self.head(self.norm(hidden))

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = self.logits(batch)[:, :-1]
        return F.cross_entropy(logits.flatten(0, 1), batch["labels"][:, 1:].flatten(), ignore_index=IGNORE_INDEX)


class TextClassifier(DemoModel):
    """Bag of embeddings: masked mean of token embeddings, then a linear layer."""

    def __init__(self, vocab_size: int, num_classes: int, dim: int = 32, lr: float = 3e-3) -> None:
        super().__init__(lr)
        self.embed = nn.Embedding(vocab_size, dim)
        self.head = nn.Linear(dim, num_classes)

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        pooled = _masked_mean(self.embed(batch["input_ids"]), batch["attention_mask"])
        return F.cross_entropy(self.head(pooled), batch["labels"])


class Seq2Seq(DemoModel):
    """GRU encoder-decoder without attention; the decoder is teacher-forced on the labels shifted right."""

    def __init__(self, vocab_size: int, pad_token_id: int, decoder_start_token_id: int, dim: int = 64,
                 lr: float = 3e-3) -> None:
        super().__init__(lr)
        self.pad_token_id, self.start_id = pad_token_id, decoder_start_token_id
        self.embed = nn.Embedding(vocab_size, dim)
        self.encoder = nn.GRU(dim, dim, batch_first=True)
        self.decoder = nn.GRU(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, vocab_size)

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        encoded, _ = self.encoder(self.embed(batch["input_ids"]))
        # Right padding: the encoder state that summarizes a row is the one at its last real token.
        last = batch["attention_mask"].sum(1).clamp(min=1) - 1
        state = encoded[torch.arange(encoded.shape[0]), last].unsqueeze(0).contiguous()
        labels = batch["labels"]
        decoder_in = labels.masked_fill(labels == IGNORE_INDEX, self.pad_token_id).roll(1, dims=1)
        decoder_in[:, 0] = self.start_id
        decoded, _ = self.decoder(self.embed(decoder_in), state)
        logits = self.head(decoded)
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)


class ImageClassifier(DemoModel):
    """Three 3x3 convolutions (batch-normed) with pooling, global average pool, linear layer."""

    def __init__(self, num_classes: int, channels: int = 16, lr: float = 3e-3) -> None:
        super().__init__(lr)
        self.net = nn.Sequential(
            nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.BatchNorm2d(2 * channels), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(2 * channels, 2 * channels, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * channels, num_classes),
        )

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(self.net(batch["pixel_values"].float()), batch["labels"])


class AudioClassifier(DemoModel):
    """Log-mel features, normalized per utterance, through a 1-D convolution and a masked mean over frames."""

    def __init__(self, num_classes: int, n_mels: int, channels: int = 32, lr: float = 3e-3) -> None:
        super().__init__(lr)
        self.conv = nn.Sequential(nn.Conv1d(n_mels, channels, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(channels, num_classes)

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        features = batch["input_features"]  # [B, n_mels, frames]
        frames = torch.arange(features.shape[-1], device=features.device)
        mask = (frames.unsqueeze(0) < batch["feature_lengths"].unsqueeze(1)).to(features.dtype)  # [B, frames]
        # Normalize each utterance over its real frames, so loudness and the padding value do not matter.
        weight = mask.unsqueeze(1)
        count = (weight.sum((1, 2), keepdim=True) * features.shape[1]).clamp(min=1)
        mean = (features * weight).sum((1, 2), keepdim=True) / count
        std = ((((features - mean) * weight) ** 2).sum((1, 2), keepdim=True) / count).sqrt()
        normed = (features - mean) / (std + 1e-5) * weight
        pooled = _masked_mean(self.conv(normed).transpose(1, 2), mask)
        return F.cross_entropy(self.head(pooled), batch["labels"])


class VisionLanguageLM(DemoModel):
    """A tiny Llava-style captioner: 8x8 patches embedded by a strided convolution take the places of the image
    tokens in the text's embeddings, then a GRU predicts each next caption token (labels shift here)."""

    def __init__(self, vocab_size: int, image_token_id: int, patch_size: int = 8, dim: int = 64,
                 lr: float = 3e-3) -> None:
        super().__init__(lr)
        self.image_token_id = image_token_id
        self.patches = nn.Conv2d(3, dim, patch_size, stride=patch_size)
        self.embed = nn.Embedding(vocab_size, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, vocab_size)

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        ids = batch["input_ids"]
        features = self.patches(batch["pixel_values"]).flatten(2).transpose(1, 2)  # [images, tokens, dim]
        embeds = self.embed(ids)
        slots = (ids == self.image_token_id).unsqueeze(-1)  # the images' tokens, in row order
        embeds = embeds.masked_scatter(slots, features.reshape(-1, features.shape[-1]).to(embeds.dtype))
        hidden, _ = self.rnn(embeds)
        logits = self.head(hidden[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), batch["labels"][:, 1:].flatten(), ignore_index=IGNORE_INDEX)
