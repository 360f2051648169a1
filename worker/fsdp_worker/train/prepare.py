"""Data prep: a text corpus in, the token file the built-in trainer reads out.

`python -m fsdp_worker.train.prepare --corpus text.txt --out tokens.bin` trains a byte-level BPE
tokenizer on the corpus itself (nothing is downloaded), writes every document's tokens, each
followed by the end-of-text token, as one flat little-endian array (`training.data.dtype`:
uint16, or uint32 above 65,536 tokens; data.TokenFileSource reads it), and saves the tokenizer
beside it as `tokenizer.json` (Hugging Face `tokenizers` format) so the model's output can be
decoded. Documents are separated by blank lines. `--tokenizer bytes` needs no extra: a token is
a byte (vocabSize 256), for tiny runs.

The BPE needs the `prep` extra (`pip install 'fsdp-operator[prep]'`), imported only here and
only when asked for: the worker image never needs it. This module runs on a laptop: no torch,
no process group, nothing of the trainer.
"""

from __future__ import annotations

import argparse
import enum
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the prep extra; imported lazily by _bpe_tokenizer
    import tokenizers

END_OF_TEXT = "<|endoftext|>"
TOKENIZER_FILE = "tokenizer.json"
_UINT16_TOKENS = 2**16
_CHUNK_DOCUMENTS = 1024  # documents encoded per batch: bounded memory on a large corpus


class TokenizerKind(enum.StrEnum):
    BPE = "bpe"
    BYTES = "bytes"


class MissingExtraError(RuntimeError):
    """The BPE was asked for without the `prep` extra installed."""


@dataclass(frozen=True)
class Prepared:
    """What was written, and the spec fields that must agree with it."""

    tokens: int
    vocab_size: int
    dtype: str
    out: Path
    tokenizer: Path | None

    def summary(self) -> str:
        """The lines a user copies into the FSDPJob."""
        saved = f" and {self.tokenizer}" if self.tokenizer else ""
        return (
            f"wrote {self.tokens} tokens to {self.out}{saved}\n"
            f"set in the FSDPJob: training.data: {{kind: tokenFile, dtype: {self.dtype}}}, "
            f"training.model.vocabSize >= {self.vocab_size}"
        )


def documents(lines: Iterable[str]) -> Iterator[str]:
    """The corpus split at blank lines; each document keeps its own line breaks."""
    current: list[str] = []
    for line in lines:
        if line.strip():
            current.append(line)
        elif current:
            yield "".join(current)
            current = []
    if current:
        yield "".join(current)


def dtype_for(vocab_size: int) -> str:
    """The smallest token dtype the trainer reads that holds every id."""
    return "uint16" if vocab_size <= _UINT16_TOKENS else "uint32"


def _bpe_tokenizer(corpus: Path, *, vocab_size: int) -> tokenizers.Tokenizer:
    """A byte-level BPE trained on the corpus (every byte is in its alphabet: no unknowns)."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError as exc:
        raise MissingExtraError(
            "--tokenizer bpe needs the `tokenizers` package: pip install 'fsdp-operator[prep]' "
            "(or --tokenizer bytes, a vocabulary of 256 bytes, without it)"
        ) from exc
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    with corpus.open(encoding="utf-8") as text:
        tokenizer.train_from_iterator(documents(text), trainer=trainer)
    return tokenizer


def _chunks(corpus: Path) -> Iterator[list[str]]:
    """Documents of the corpus, a bounded batch at a time."""
    batch: list[str] = []
    with corpus.open(encoding="utf-8") as text:
        for doc in documents(text):
            batch.append(doc)
            if len(batch) == _CHUNK_DOCUMENTS:
                yield batch
                batch = []
    if batch:
        yield batch


def _bpe_ids(tokenizer: tokenizers.Tokenizer, batch: list[str]) -> list[int]:
    end = tokenizer.token_to_id(END_OF_TEXT)
    assert end is not None  # the trainer's one special token
    return [i for enc in tokenizer.encode_batch(batch) for i in (*enc.ids, end)]


def _byte_ids(batch: list[str]) -> list[int]:
    """Bytes, with 0 (NUL, absent from text) ending each document."""
    return [i for doc in batch for i in (*doc.encode("utf-8"), 0)]


def prepare(
    *, corpus: Path, out: Path, kind: TokenizerKind = TokenizerKind.BPE, vocab_size: int = 32000
) -> Prepared:
    """Write `out` (and, for BPE, tokenizer.json beside it); ValueError naming the flag when the
    corpus or the vocabulary cannot give the trainer a file."""
    if not corpus.is_file():
        raise ValueError(f"--corpus {corpus}: not a readable file")
    if kind is TokenizerKind.BPE and not 257 <= vocab_size <= 2**32:
        raise ValueError(f"--vocab-size {vocab_size}: a byte-level BPE needs 257 to 2**32")
    tokenizer = _bpe_tokenizer(corpus, vocab_size=vocab_size) if kind is TokenizerKind.BPE else None
    vocab = tokenizer.get_vocab_size() if tokenizer else 256
    dtype = dtype_for(vocab)
    written = 0
    with out.open("wb") as sink:
        for batch in _chunks(corpus):
            ids = _bpe_ids(tokenizer, batch) if tokenizer else _byte_ids(batch)
            np.asarray(ids, dtype=np.dtype(dtype).newbyteorder("<")).tofile(sink)
            written += len(ids)
    if written == 0:
        raise ValueError(f"--corpus {corpus}: holds no text")
    saved = out.with_name(TOKENIZER_FILE) if tokenizer else None
    if tokenizer and saved:
        tokenizer.save(str(saved))
    return Prepared(tokens=written, vocab_size=vocab, dtype=dtype, out=out, tokenizer=saved)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m fsdp_worker.train.prepare",
        description="Write the built-in trainer's token file (training.data.kind: tokenFile) "
        "from a text corpus, documents separated by blank lines.",
    )
    p.add_argument("--corpus", type=Path, required=True, help="UTF-8 text file")
    p.add_argument("--out", type=Path, required=True, help="token file to write (tokens.bin)")
    p.add_argument(
        "--tokenizer",
        type=TokenizerKind,
        choices=list(TokenizerKind),
        default=TokenizerKind.BPE,
        help="bpe: byte-level BPE trained on the corpus, saved as tokenizer.json beside --out "
        "(needs the prep extra); bytes: one token per byte (vocabSize 256)",
    )
    p.add_argument("--vocab-size", type=int, default=32000, help="BPE vocabulary, at most")
    return p


def main(argv: list[str] | None = None) -> int:
    """Exit 0 with the spec fields to set; 2 with the reason when the input cannot work."""
    args = _parser().parse_args(argv)
    try:
        done = prepare(
            corpus=args.corpus, out=args.out, kind=args.tokenizer, vocab_size=args.vocab_size
        )
    except (ValueError, MissingExtraError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(done.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
