"""The data-prep command writes a token file the built-in trainer reads: every id inside the
vocabulary the job declares, documents ended, the tokenizer saved beside it, and a clear error
naming the extra or the flag when it cannot."""

from __future__ import annotations

import builtins
import importlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fsdp_worker.train import data, prepare

CORPUS = "\n\n".join(
    f"Document {i}: the gang trains on shards of text, step after step, and seals checkpoint {i}."
    for i in range(40)
)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "text.txt"
    path.write_text(CORPUS + "\n", encoding="utf-8")
    return path


def test_bpe_tokens_are_read_back_by_the_trainer_within_the_vocabulary(
    corpus: Path, tmp_path: Path
) -> None:
    importlib.import_module("tokenizers")  # the prep extra (in dev: never skipped)
    out = tmp_path / "tokens.bin"
    done = prepare.prepare(corpus=corpus, out=out, vocab_size=300)
    assert 257 <= done.vocab_size <= 300 and done.dtype == "uint16"
    source = data.TokenFileSource(path=str(out), dtype=done.dtype, vocab_size=300, seq_len=16)
    raw = np.fromfile(out, dtype=np.uint16)
    assert len(raw) == done.tokens and raw.max() < done.vocab_size  # nothing wraps in `% vocab`
    for i in range(source.n_samples):
        window = source.sample(i)
        assert window.shape == (17,)
        assert window.tolist() == raw[i * 16 : i * 16 + 17].tolist()


def test_the_saved_tokenizer_decodes_the_file_back_to_the_corpus(
    corpus: Path, tmp_path: Path
) -> None:
    tokenizers = importlib.import_module("tokenizers")  # the prep extra (in dev)
    done = prepare.prepare(corpus=corpus, out=tmp_path / "tokens.bin", vocab_size=300)
    assert done.tokenizer == tmp_path / "tokenizer.json"
    tokenizer = tokenizers.Tokenizer.from_file(str(done.tokenizer))
    end = tokenizer.token_to_id(prepare.END_OF_TEXT)
    ids = np.fromfile(done.out, dtype=np.uint16).tolist()
    assert ids.count(end) == 40 and ids[-1] == end  # one per document
    text = tokenizer.decode(ids, skip_special_tokens=True)
    assert "seals checkpoint 39." in text and "Document 0:" in text
    assert json.loads(done.tokenizer.read_text())["model"]["type"] == "BPE"


def test_bytes_needs_no_extra_and_fits_a_vocabulary_of_256(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "tokens.bin"
    done = prepare.prepare(corpus=corpus, out=out, kind=prepare.TokenizerKind.BYTES)
    assert (done.vocab_size, done.tokenizer) == (256, None)
    raw = np.fromfile(out, dtype=np.uint16)
    assert bytes(raw[:10].tolist()) == b"Document 0"
    data.TokenFileSource(path=str(out), dtype="uint16", vocab_size=256, seq_len=32)


def test_bpe_without_the_extra_names_it(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def no_tokenizers(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("tokenizers"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tokenizers)
    with pytest.raises(prepare.MissingExtraError, match=r"fsdp-operator\[prep\]"):
        prepare.prepare(corpus=corpus, out=tmp_path / "tokens.bin")


@pytest.mark.parametrize(
    ("text", "argv", "words"),
    [
        ("\n\n\n", ["--tokenizer", "bytes"], "holds no text"),
        ("some text", ["--vocab-size", "100"], "--vocab-size 100"),
    ],
)
def test_the_command_refuses_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, argv: list[str], words: str
) -> None:
    corpus = tmp_path / "text.txt"
    corpus.write_text(text)
    code = prepare.main(["--corpus", str(corpus), "--out", str(tmp_path / "t.bin"), *argv])
    assert code == 2 and words in capsys.readouterr().err


def test_the_command_prints_the_fields_to_set(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    importlib.import_module("tokenizers")  # the prep extra (in dev: never skipped)
    argv = ["--corpus", str(corpus), "--out", str(tmp_path / "tokens.bin"), "--vocab-size", "280"]
    assert prepare.main(argv) == 0
    printed = capsys.readouterr().out
    assert "dtype: uint16" in printed and "vocabSize >= 2" in printed


def test_documents_split_at_blank_lines() -> None:
    lines = ["a\n", "b\n", "\n", "  \n", "c\n"]
    assert list(prepare.documents(lines)) == ["a\nb\n", "c\n"]
    assert prepare.dtype_for(65536) == "uint16" and prepare.dtype_for(65537) == "uint32"
