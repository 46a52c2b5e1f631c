"""A byte-level text corpus from the Python standard library's own source files (vocab 256).

Owns reading the corpus and cutting it into (tokens, targets) batches. Deterministic: files are the
stdlib's *.py files in sorted relative-path order (site-packages and dist-packages left out), every
`val_every`-th file goes to the validation split, and reading stops once `max_bytes` have been read.
Nothing is read at import or in a constructor: `ByteCorpus.from_stdlib` reads.
Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from piper_sim.errors import ConfigError

VOCAB_SIZE = 256
SPLITS = ("train", "val")
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def iter_sources(root: Path | None = None) -> Iterator[Path]:
    """The *.py files under root (default: the stdlib) in sorted relative-path order, lazily.

    A depth-first walk whose siblings are ordered by name + "/" for directories yields exactly the
    sorted order of the relative POSIX paths, so a capped read touches only the files it needs.
    """
    yield from _walk(root or stdlib_root())


def _walk(directory: Path) -> Iterator[Path]:
    for entry in sorted(directory.iterdir(), key=lambda p: p.name + ("/" if p.is_dir() else "")):
        if entry.is_dir():
            if entry.name not in _SKIP_DIRS:
                yield from _walk(entry)
        elif entry.suffix == ".py" and entry.is_file():
            yield entry


@dataclass(frozen=True, kw_only=True)
class ByteCorpus:
    """Train and validation bytes as uint8 tensors, and the files each came from."""

    train: Tensor
    val: Tensor
    train_files: tuple[str, ...]
    val_files: tuple[str, ...]

    @classmethod
    def from_stdlib(cls, *, max_bytes: int = 4_000_000, val_every: int = 10, root: Path | None = None) -> ByteCorpus:
        """Read sorted stdlib sources until max_bytes; file i goes to val when i % val_every == val_every-1."""
        if max_bytes <= 0:
            raise ConfigError("corpus.max_bytes", max_bytes, "a positive integer")
        if val_every < 2:
            raise ConfigError("corpus.val_every", val_every, "an integer >= 2")
        base = root or stdlib_root()
        parts: dict[str, list[bytes]] = {"train": [], "val": []}
        names: dict[str, list[str]] = {"train": [], "val": []}
        total = 0
        for index, path in enumerate(iter_sources(base)):
            if total >= max_bytes:
                break
            data = path.read_bytes()[: max_bytes - total]
            split = "val" if index % val_every == val_every - 1 else "train"
            parts[split].append(data)
            names[split].append(path.relative_to(base).as_posix())
            total += len(data)
        return cls(
            train=_as_tensor(b"".join(parts["train"])),
            val=_as_tensor(b"".join(parts["val"])),
            train_files=tuple(names["train"]),
            val_files=tuple(names["val"]),
        )

    def data(self, split: str) -> Tensor:
        if split not in SPLITS:
            raise ConfigError("corpus.split", split, f"one of {', '.join(SPLITS)}")
        return self.train if split == "train" else self.val

    def batches(
        self, seq_len: int, batch_size: int, seed: int, split: str = "train", num_batches: int | None = None
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """Random windows (seeded): tokens (batch, seq_len) and targets shifted by one, both int64.

        Endless unless num_batches is given.
        """
        data = self.data(split)
        if data.numel() < seq_len + 2:
            raise ConfigError(
                "corpus.max_bytes", data.numel(), f"more than seq_len + 1 ({seq_len + 1}) bytes in the {split} split"
            )
        gen = torch.Generator().manual_seed(seed)
        offsets = torch.arange(seq_len + 1)
        count = 0
        while num_batches is None or count < num_batches:
            starts = torch.randint(0, data.numel() - seq_len, (batch_size,), generator=gen)
            windows = data[starts[:, None] + offsets].long()
            yield windows[:, :-1], windows[:, 1:]
            count += 1


def _as_tensor(data: bytes) -> Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
