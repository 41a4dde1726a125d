"""Language modelling: a two-layer LSTM over 35-token windows (truncated backpropagation through
time), like Gavel's WikiText-2 job (the PyTorch word-language-model example: 200-wide embeddings
and hidden state, dropout 0.2, plain SGD at learning rate 20, gradients clipped at 0.25).

The hidden state is carried from one window to the next within an epoch (detached, so gradients
stop at the window's start) and reset at each epoch's start; it is part of the checkpoint.

Synthetic text (the default) comes from a fixed random grammar: each word has four possible
successors (a table drawn from the task seed), so a trained model's loss approaches log 4.
``--data-dir`` reads ``train.txt`` (or WikiText's own ``wiki.train.tokens``): plain text,
tokenised on whitespace, an ``<eos>`` closing every line, the vocabulary every word it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from worker_service.workloads.config import WorkloadConfig
from worker_service.workloads.data import (
    Batches,
    Vocabulary,
    first_existing,
    read_words,
    require_dir,
    sample_generator,
    task_generator,
)
from worker_service.workloads.errors import DataDirError
from worker_service.workloads.job import TrainingJob, seeded_module

BPTT_TOKENS = 35  # the window: the sequence length of Gavel's LM job, kept at every size
SUCCESSORS = 4  # synthetic grammar: the branching factor
EXPECTED = "train.txt (or wiki.train.tokens): plain text, words separated by whitespace"

Window = tuple[Tensor, Tensor, bool]  # (35, B) inputs, (35, B) next words, "an epoch starts here"


@dataclass(frozen=True)
class LSTMShape:
    vocab: int  # of synthetic text (a local corpus brings its own)
    embedding: int
    hidden: int
    layers: int
    dropout: float
    tokens_per_epoch: int = 2_088_628  # WikiText-2's training set


SHAPES = {
    # The model is Gavel's at both sizes (it is small); "small" cuts the synthetic vocabulary,
    # whose softmax is most of a step's work, to Penn Treebank's 10,000 words.
    "small": LSTMShape(vocab=10_000, embedding=200, hidden=200, layers=2, dropout=0.2),
    "full": LSTMShape(vocab=33_278, embedding=200, hidden=200, layers=2, dropout=0.2),
}


class SyntheticText(Batches[Window]):
    def __init__(self, shape: LSTMShape, batch_size: int, task_seed: int, sample_seed: int) -> None:
        super().__init__(max(1, (shape.tokens_per_epoch // batch_size - 1) // BPTT_TOKENS))
        self.vocab, self.batch_size, self.seed = shape.vocab, batch_size, sample_seed
        self.successors = torch.randint(shape.vocab, (shape.vocab, SUCCESSORS), generator=task_generator(task_seed))

    def make(self, epoch: int, index: int) -> Window:
        g = sample_generator(self.seed, epoch, index)
        words = [torch.randint(self.vocab, (self.batch_size,), generator=g)]
        choices = torch.randint(SUCCESSORS, (BPTT_TOKENS, self.batch_size), generator=g)
        for t in range(BPTT_TOKENS):
            words.append(self.successors[words[-1], choices[t]])
        text = torch.stack(words)  # (36, B)
        return text[:-1], text[1:], index == 0


class CorpusText(Batches[Window]):
    """The corpus cut into ``batch_size`` columns read top to bottom, 35 rows at a time (the
    example's "batchify"): column b continues where its previous window stopped."""

    def __init__(self, tokens: Tensor, batch_size: int) -> None:
        rows = len(tokens) // batch_size
        self.columns = tokens[: rows * batch_size].view(batch_size, rows).t().contiguous()  # (rows, B)
        super().__init__(max(1, (rows - 1) // BPTT_TOKENS))

    def make(self, epoch: int, index: int) -> Window:  # noqa: ARG002 (every epoch reads the same text)
        start = index * BPTT_TOKENS
        return self.columns[start : start + BPTT_TOKENS], self.columns[start + 1 : start + 1 + BPTT_TOKENS], index == 0


def read_corpus(directory: Path) -> tuple[Tensor, int]:
    """The corpus as one stream of word ids, and the vocabulary's size."""
    require_dir(directory, "LM", EXPECTED)
    path = first_existing(directory, ["train.txt", "wiki.train.tokens"])
    if path is None:
        raise DataDirError(f"LM --data-dir {directory}: expected {EXPECTED}")
    vocabulary = Vocabulary()
    ids = [vocabulary.add(word) for line in read_words(path) for word in (*line, "<eos>")]
    return torch.tensor(ids, dtype=torch.long), len(vocabulary)


class LSTMLanguageModel(nn.Module):
    def __init__(self, shape: LSTMShape, vocab: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, shape.embedding)
        self.lstm = nn.LSTM(shape.embedding, shape.hidden, shape.layers, dropout=shape.dropout)
        self.dropout = nn.Dropout(shape.dropout)
        self.decoder = nn.Linear(shape.hidden, vocab)

    def forward(self, words: Tensor, hidden: tuple[Tensor, Tensor] | None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """(T, B) word ids and the carried (h, c) -> (T, B, vocab) next-word logits and new (h, c)."""
        out, hidden = self.lstm(self.dropout(self.embedding(words)), hidden)
        return self.decoder(self.dropout(out)), hidden


class LanguageModelJob(TrainingJob):
    CLIP_NORM = 0.25

    def __init__(self, **job: Any) -> None:
        super().__init__(**job)
        self.hidden: tuple[Tensor, Tensor] | None = None

    def step(self, batch: Window) -> float:
        words, targets, epoch_starts = batch
        words, targets = words.to(self.device, non_blocking=True), targets.to(self.device, non_blocking=True)
        if epoch_starts:
            self.hidden = None  # zeros: an epoch does not continue the previous one's text
        net = self.nets["model"]
        net.train()
        logits, hidden = net(words, self.hidden)
        self.hidden = (hidden[0].detach(), hidden[1].detach())
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optimizer = self.optimizers["sgd"]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), self.CLIP_NORM)
        optimizer.step()
        return loss.item()

    def extra_state(self) -> dict[str, Any]:
        return {"hidden": None if self.hidden is None else [t.cpu() for t in self.hidden]}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        hidden = state["hidden"]
        self.hidden = None if hidden is None else (hidden[0].to(self.device), hidden[1].to(self.device))


def build(batch_size: int, config: WorkloadConfig) -> LanguageModelJob:
    shape = SHAPES[config.size]
    if config.data_dir is None:
        data: Batches = SyntheticText(shape, batch_size, config.seed, config.sample_seed)
        vocab = shape.vocab
    else:
        tokens, vocab = read_corpus(config.data_dir)
        if len(tokens) < batch_size * (BPTT_TOKENS + 1):
            raise DataDirError(
                f"LM --data-dir {config.data_dir}: {len(tokens)} words, fewer than one window "
                f"({batch_size} columns x {BPTT_TOKENS + 1} words)"
            )
        data = CorpusText(tokens, batch_size)
    model = seeded_module(config.seed, lambda: LSTMLanguageModel(shape, vocab)).to(config.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=20.0)
    return LanguageModelJob(family="LM", batch_size=batch_size, config=config, model=model, optimizers={"sgd": optimizer}, data=data)
