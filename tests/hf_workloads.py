"""Hugging Face models as a person hands them to the lab: unwrapped, random weights from a config
(nothing is downloaded), fed bytes of Python's own standard-library source.

    commlab run --workload tests.hf_workloads:gpt2 --hook powersgd --matrix-approximation-rank 2

``gpt2`` yields ``(inputs, targets)`` and GPT-2 returns a ``CausalLMOutputWithCrossAttentions``:
the lab reads its ``.logits``.  ``gpt2_labels`` yields Hugging Face's dict with ``labels``: the
model's own (shifted) loss trains.  ``bert`` yields ``input_ids``, ``attention_mask`` and
``labels`` for a sequence classifier.  ``gpt2_smoothed`` gives a loss of its own.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel

from commlab.seeds import stream_seed
from commlab.workloads import stdlib_held_out_text, stdlib_text

BLOCK = 64


def gpt2_model() -> GPT2LMHeadModel:
    # The model; no cache: training reads nothing back from it.
    return GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=BLOCK, n_embd=128, n_layer=2, n_head=4,
                                      use_cache=False, bos_token_id=0, eos_token_id=0))


def _windows(data: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    return torch.stack([data[i:i + BLOCK + 1] for i in starts])


def _byte_windows(rank: int, seed: int, batch_size: int):
    """Windows of BLOCK + 1 bytes of standard-library source, this rank's own stream; and the
    held-out windows (other files)."""
    data = torch.frombuffer(bytearray(stdlib_text(1 << 18)), dtype=torch.uint8).long()
    held = torch.frombuffer(bytearray(stdlib_held_out_text(1 << 14)), dtype=torch.uint8).long()

    def train():
        g = torch.Generator().manual_seed(stream_seed(seed, rank))
        while True:
            yield _windows(data, torch.randint(len(data) - BLOCK - 1, (batch_size,), generator=g))

    def held_out():
        return _windows(held, torch.linspace(0, len(held) - BLOCK - 2, 32).long()).split(16)

    return train, held_out


def gpt2(rank: int = 0, seed: int = 0, batch_size: int = 8):
    train, held_out = _byte_windows(rank, seed, batch_size)
    return (gpt2_model(), lambda: ((w[:, :-1], w[:, 1:]) for w in train()),
            lambda: ((w[:, :-1], w[:, 1:]) for w in held_out()))


def _labelled(windows):
    # Hugging Face's causal LMs shift the labels themselves: labels are the inputs.
    return ({"input_ids": w[:, :-1], "labels": w[:, :-1]} for w in windows)


def gpt2_labels(rank: int = 0, seed: int = 0, batch_size: int = 8):
    train, held_out = _byte_windows(rank, seed, batch_size)
    return gpt2_model(), lambda: _labelled(train()), lambda: _labelled(held_out())


def smoothed_loss(outputs, batch) -> torch.Tensor:
    """Next-byte cross-entropy with label smoothing: neither of the lab's losses."""
    logits = outputs.logits[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["input_ids"][:, 1:].reshape(-1),
                           label_smoothing=0.1)


def gpt2_smoothed(rank: int = 0, seed: int = 0, batch_size: int = 8):
    train, held_out = _byte_windows(rank, seed, batch_size)
    unlabelled = lambda windows: ({"input_ids": w[:, :-1]} for w in windows)  # noqa: E731
    return {"model": gpt2_model(), "batches": lambda: unlabelled(train()),
            "eval_batches": lambda: unlabelled(held_out()), "loss": smoothed_loss}


def bert_model() -> BertForSequenceClassification:
    return BertForSequenceClassification(BertConfig(
        vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=BLOCK, num_labels=2))


def _classified(windows, g: torch.Generator):
    """Is there a line break in the window's unpadded part?  Each row keeps a random length, the
    rest padded and masked out, so the attention mask matters."""
    for w in windows:
        ids = w[:, :BLOCK].clone()
        lengths = torch.randint(BLOCK // 4, BLOCK + 1, (len(ids),), generator=g)
        mask = (torch.arange(BLOCK) < lengths[:, None]).long()
        ids[mask == 0] = 0
        labels = ((ids == ord("\n")) & (mask == 1)).any(dim=1).long()
        yield {"input_ids": ids, "attention_mask": mask, "labels": labels}


def bert(rank: int = 0, seed: int = 0, batch_size: int = 8):
    train, held_out = _byte_windows(rank, seed, batch_size)
    return (bert_model(), lambda: _classified(train(), torch.Generator().manual_seed(stream_seed(seed, rank))),
            lambda: _classified(held_out(), torch.Generator().manual_seed(0)))
