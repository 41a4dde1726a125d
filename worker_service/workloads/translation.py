"""Translation: an encoder-decoder Transformer (Vaswani et al., 2017), like Gavel's Multi30k job.

Synthetic data (the default) is a learnable "language pair": a source sentence is a run of random
words, its translation is the sentence reversed and mapped word by word through a fixed table
(drawn from the task seed), so the model must learn both attention (reversal) and a dictionary.
``--data-dir`` reads ``train.src`` and ``train.tgt``: aligned plain-text files, one sentence per
line, words separated by whitespace (Multi30k's train.de / train.en renamed).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from worker_service.workloads.config import WorkloadConfig
from worker_service.workloads.data import (
    Batches,
    epoch_order,
    first_existing,
    read_words,
    require_dir,
    sample_generator,
    task_generator,
)
from worker_service.workloads.errors import DataDirError
from worker_service.workloads.job import TrainingJob, seeded_module

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
EXPECTED = "train.src and train.tgt: aligned text files, one sentence per line, whitespace-separated words"


@dataclass(frozen=True)
class TransformerShape:
    d_model: int
    heads: int
    layers: int  # encoder layers = decoder layers
    feedforward: int
    source_vocab: int  # synthetic data's vocabularies (a local dataset brings its own)
    target_vocab: int
    min_words: int  # synthetic sentence lengths; also where a local dataset's sentences are cut
    max_words: int
    warmup_steps: int
    samples_per_epoch: int = 29_000  # Multi30k's training pairs


SHAPES = {
    "small": TransformerShape(
        d_model=64, heads=4, layers=2, feedforward=128, source_vocab=1000, target_vocab=1000,
        min_words=4, max_words=16, warmup_steps=400,
    ),
    # The base model of the paper; vocabularies of Multi30k's size (words seen at least twice).
    "full": TransformerShape(
        d_model=512, heads=8, layers=6, feedforward=2048, source_vocab=8000, target_vocab=6000,
        min_words=8, max_words=40, warmup_steps=4000,
    ),
}

Pair = tuple[Tensor, Tensor]  # (source words, target words) of one sentence, without specials


def pad_batch(pairs: list[Pair]) -> tuple[Tensor, Tensor]:
    """(B, S) source ids and (B, T + 2) target ids framed by <bos> ... <eos>, padded with <pad>."""
    sources = [src for src, _ in pairs]
    targets = [torch.cat([torch.tensor([BOS]), tgt, torch.tensor([EOS])]) for _, tgt in pairs]
    return (
        nn.utils.rnn.pad_sequence(sources, batch_first=True, padding_value=PAD),
        nn.utils.rnn.pad_sequence(targets, batch_first=True, padding_value=PAD),
    )


class SyntheticPairs(Batches[tuple[Tensor, Tensor]]):
    def __init__(self, shape: TransformerShape, batch_size: int, task_seed: int, sample_seed: int) -> None:
        super().__init__(shape.samples_per_epoch // batch_size)
        self.shape, self.batch_size, self.seed = shape, batch_size, sample_seed
        first = len(SPECIALS)
        self.dictionary = torch.randint(first, shape.target_vocab, (shape.source_vocab,), generator=task_generator(task_seed))

    def make(self, epoch: int, index: int) -> tuple[Tensor, Tensor]:
        g = sample_generator(self.seed, epoch, index)
        lengths = torch.randint(self.shape.min_words, self.shape.max_words + 1, (self.batch_size,), generator=g)
        pairs = []
        for length in lengths.tolist():
            source = torch.randint(len(SPECIALS), self.shape.source_vocab, (length,), generator=g)
            pairs.append((source, self.dictionary[source.flip(0)]))
        return pad_batch(pairs)


class CorpusPairs(Batches[tuple[Tensor, Tensor]]):
    def __init__(self, pairs: list[Pair], batch_size: int, seed: int) -> None:
        super().__init__(len(pairs) // batch_size)
        self.pairs, self.batch_size, self.seed = pairs, batch_size, seed
        self._order: tuple[int, list[int]] | None = None

    def make(self, epoch: int, index: int) -> tuple[Tensor, Tensor]:
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, epoch_order(self.seed, epoch, len(self.pairs)).tolist())
        rows = self._order[1][index * self.batch_size : (index + 1) * self.batch_size]
        return pad_batch([self.pairs[r] for r in rows])


def read_corpus(directory: Path, shape: TransformerShape) -> tuple[list[Pair], int, int]:
    """The aligned pairs (cut at ``max_words`` words) and the two vocabularies' sizes."""
    require_dir(directory, "Transformer", EXPECTED)
    src_path, tgt_path = first_existing(directory, ["train.src"]), first_existing(directory, ["train.tgt"])
    if src_path is None or tgt_path is None:
        raise DataDirError(f"Transformer --data-dir {directory}: expected {EXPECTED}")
    sources, targets = read_words(src_path), read_words(tgt_path)
    if len(sources) != len(targets):
        raise DataDirError(f"Transformer --data-dir {directory}: train.src has {len(sources)} lines, train.tgt {len(targets)}")
    vocabularies = []
    for side in (sources, targets):
        counts = Counter(word for line in side for word in line)
        words = sorted(counts, key=lambda w: (-counts[w], w))  # most frequent first, ties by spelling
        vocabularies.append({w: i for i, w in enumerate(words, start=len(SPECIALS))})
    src_ids, tgt_ids = vocabularies
    pairs = [
        (torch.tensor([src_ids[w] for w in s[: shape.max_words]]), torch.tensor([tgt_ids[w] for w in t[: shape.max_words]]))
        for s, t in zip(sources, targets, strict=True)
        if s and t
    ]
    return pairs, len(src_ids) + len(SPECIALS), len(tgt_ids) + len(SPECIALS)


class PositionalEncoding(nn.Module):
    """The paper's sinusoids, added to the scaled embeddings."""

    def __init__(self, d_model: int, max_len: int = 512) -> None:
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)
        frequency = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10_000.0) / d_model))
        table = torch.zeros(max_len, d_model)
        table[:, 0::2] = torch.sin(position * frequency)
        table[:, 1::2] = torch.cos(position * frequency)
        self.register_buffer("table", table, persistent=False)  # a function of the shape: not state

    def forward(self, x: Tensor) -> Tensor:
        return x + self.table[: x.shape[1]]


class Seq2SeqTransformer(nn.Module):
    def __init__(self, shape: TransformerShape, source_vocab: int, target_vocab: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.scale = math.sqrt(shape.d_model)
        self.source_embedding = nn.Embedding(source_vocab, shape.d_model, padding_idx=PAD)
        self.target_embedding = nn.Embedding(target_vocab, shape.d_model, padding_idx=PAD)
        self.position = PositionalEncoding(shape.d_model)
        self.dropout = nn.Dropout(dropout)
        self.transformer = nn.Transformer(
            d_model=shape.d_model, nhead=shape.heads, num_encoder_layers=shape.layers,
            num_decoder_layers=shape.layers, dim_feedforward=shape.feedforward, dropout=dropout, batch_first=True,
        )
        self.generator = nn.Linear(shape.d_model, target_vocab)

    def forward(self, source: Tensor, target_in: Tensor) -> Tensor:
        """(B, S) source ids, (B, T) target ids so far -> (B, T, target vocab) next-word logits."""
        src = self.dropout(self.position(self.source_embedding(source) * self.scale))
        tgt = self.dropout(self.position(self.target_embedding(target_in) * self.scale))
        steps = target_in.shape[1]  # True above the diagonal: a word never attends to later words
        causal = torch.ones(steps, steps, dtype=torch.bool, device=target_in.device).triu(diagonal=1)
        source_pad = source == PAD
        out = self.transformer(
            src, tgt, tgt_mask=causal, tgt_is_causal=True,
            src_key_padding_mask=source_pad, tgt_key_padding_mask=target_in == PAD, memory_key_padding_mask=source_pad,
        )
        return self.generator(out)


class TranslationJob(TrainingJob):
    def __init__(self, *, shape: TransformerShape, **job: Any) -> None:
        super().__init__(**job)
        self.shape = shape
        self.updates = 0  # optimizer steps so far: the learning-rate schedule's clock

    def learning_rate(self) -> float:
        """The paper's schedule: linear warm-up, then inverse square root of the step."""
        step = self.updates + 1
        return self.shape.d_model**-0.5 * min(step**-0.5, step * self.shape.warmup_steps**-1.5)

    def step(self, batch: tuple[Tensor, Tensor]) -> float:
        source, target = (t.to(self.device, non_blocking=True) for t in batch)
        net = self.nets["model"]
        net.train()
        logits = net(source, target[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), target[:, 1:].flatten(), ignore_index=PAD, label_smoothing=0.1)
        optimizer = self.optimizers["adam"]
        for group in optimizer.param_groups:
            group["lr"] = self.learning_rate()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        self.updates += 1
        return loss.item()

    def extra_state(self) -> dict[str, int]:
        return {"updates": self.updates}

    def load_extra_state(self, state: dict[str, int]) -> None:
        self.updates = int(state["updates"])


def build(batch_size: int, config: WorkloadConfig) -> TranslationJob:
    shape = SHAPES[config.size]
    if config.data_dir is None:
        data: Batches = SyntheticPairs(shape, batch_size, config.seed, config.sample_seed)
        source_vocab, target_vocab = shape.source_vocab, shape.target_vocab
    else:
        pairs, source_vocab, target_vocab = read_corpus(config.data_dir, shape)
        if len(pairs) < batch_size:
            raise DataDirError(f"Transformer --data-dir {config.data_dir}: {len(pairs)} sentence pairs, fewer than one batch of {batch_size}")
        data = CorpusPairs(pairs, batch_size, config.sample_seed)
    model = seeded_module(config.seed, lambda: Seq2SeqTransformer(shape, source_vocab, target_vocab)).to(config.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9)  # lr: set per step
    return TranslationJob(
        shape=shape, family="Transformer", batch_size=batch_size, config=config, model=model,
        optimizers={"adam": optimizer}, data=data,
    )
