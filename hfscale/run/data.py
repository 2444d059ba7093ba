"""Text in, packed `seq_len` blocks out: Hub datasets, local files, or the embedded default corpus.

The embedded default is the Python standard library's own source files — real text on every machine, no network.
Tokenizing and packing happen once per machine (the local main process builds, the others load the cache).
"""

import hashlib
import json
import os
import sys
import sysconfig
from pathlib import Path

from ..errors import HfscaleError
from ..files import atomic_write_dir

EMBEDDED = "python-stdlib"
EOS = "<|endoftext|>"
PACKING_VERSION = 1  # part of the packed-data cache key: bump it whenever pack() changes what it produces
LOCAL_FORMATS = {".txt": "text", ".text": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def embedded_files() -> list[Path]:
    """The top-level modules of this interpreter's standard library, in a fixed order."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def check_local_files(files: list[str]) -> str:
    """The `datasets` builder for local files, after checking they exist and share one known format."""
    missing = [f for f in files if not Path(f).is_file()]
    if missing:
        raise HfscaleError(f"data file not found: {missing[0]}")
    empty = [f for f in files if Path(f).stat().st_size == 0]
    if empty:
        raise HfscaleError(f"data file is empty: {empty[0]}")
    kinds = {LOCAL_FORMATS.get(Path(f).suffix.lower()) for f in files}
    if None in kinds or len(kinds) != 1:
        raise HfscaleError(
            f"--train_files must all be one of {sorted(LOCAL_FORMATS)} (one format per run); got {files}"
        )
    return kinds.pop()


def source_fingerprint(data_args) -> dict:
    """What identifies the raw text, for the cache key."""
    if data_args.train_files:
        return {"files": [(str(Path(f).resolve()), os.path.getsize(f), os.path.getmtime(f))
                          for f in data_args.train_files]}
    if data_args.dataset != EMBEDDED:
        return {"hub": [data_args.dataset, data_args.dataset_config, data_args.dataset_split]}
    return {"embedded": sys.version, "files": [(p.name, p.stat().st_size) for p in embedded_files()]}


def load_raw_text(data_args):
    """A datasets.Dataset (or IterableDataset when streaming) with the text column."""
    import datasets

    if data_args.train_files:
        builder = check_local_files(data_args.train_files)
        ds = datasets.load_dataset(builder, data_files=list(data_args.train_files), split="train",
                                   streaming=data_args.streaming)
    elif data_args.dataset == EMBEDDED:
        texts = [p.read_text(encoding="utf-8", errors="replace") for p in embedded_files()]
        return datasets.Dataset.from_dict({data_args.text_column: texts})
    else:
        try:
            ds = datasets.load_dataset(data_args.dataset, data_args.dataset_config,
                                       split=data_args.dataset_split, streaming=data_args.streaming)
        except Exception as err:  # the Hub raises many types; the user needs the first line
            raise HfscaleError(f"cannot load dataset {data_args.dataset!r}: {str(err).splitlines()[0]}") from None
    columns = ds.column_names or []
    if data_args.text_column not in columns:
        raise HfscaleError(f"dataset has no text column {data_args.text_column!r}; its columns: {columns}")
    return ds


def train_default_tokenizer(texts, vocab_size: int, out_dir: Path):
    """A byte-level BPE (GPT-2 style) trained on the corpus itself: the offline default tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=EOS)
    atomic_write_dir(out_dir, fast.save_pretrained)
    return fast


def load_tokenizer(data_args, model_name_or_path, vocab_size: int, raw, trust_remote_code: bool):
    """The named tokenizer, the pretrained model's, or the default BPE trained on (and cached for) the corpus."""
    from transformers import AutoTokenizer

    name = data_args.tokenizer_name or model_name_or_path
    if name:
        try:
            return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
        except OSError as err:
            raise HfscaleError(f"cannot load tokenizer {name!r}: {str(err).splitlines()[0]}") from None
    if data_args.streaming:
        raise HfscaleError("a streamed dataset needs --tokenizer_name (the default tokenizer is trained on the corpus)")
    size = min(vocab_size, data_args.default_tokenizer_vocab)
    out = Path(data_args.cache_dir) / f"tokenizer-bpe{size}-{_digest(source_fingerprint(data_args))}"
    if out.is_dir():
        return AutoTokenizer.from_pretrained(str(out))
    return train_default_tokenizer(raw[data_args.text_column], size, out)


def pack(raw, tokenizer, text_column: str, seq_len: int):
    """Tokenize, join documents with EOS, and cut into full blocks of `seq_len` tokens (the remainder is dropped)."""
    eos = tokenizer.eos_token_id

    def tokenize_and_pack(batch):
        ids = []
        for doc in tokenizer(batch[text_column], add_special_tokens=False)["input_ids"]:
            ids.extend(doc)
            ids.append(eos)
        n = len(ids) // seq_len * seq_len
        blocks = [ids[i:i + seq_len] for i in range(0, n, seq_len)]
        return {"input_ids": blocks, "labels": blocks}

    columns = raw.column_names
    return raw.map(tokenize_and_pack, batched=True, batch_size=1000, remove_columns=columns)


def tokenizer_fingerprint(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return _digest(backend.to_str() if backend is not None else [tokenizer.name_or_path, len(tokenizer)])


def packed_dataset(data_args, tokenizer, raw, seq_len: int):
    """Packed blocks, from the cache when this machine already built them."""
    import datasets

    if data_args.streaming:
        return pack(raw, tokenizer, data_args.text_column, seq_len)
    key = _digest([source_fingerprint(data_args), data_args.text_column, tokenizer_fingerprint(tokenizer), seq_len,
                   PACKING_VERSION])
    out = Path(data_args.cache_dir) / f"packed-{key}"
    if not out.is_dir():
        atomic_write_dir(out, pack(raw, tokenizer, data_args.text_column, seq_len).save_to_disk)
    blocks = datasets.load_from_disk(str(out))
    if len(blocks) == 0:
        raise HfscaleError(f"the dataset yields no full block of seq_len {seq_len} tokens; use more text or a shorter --seq_len")
    return blocks.with_format("torch")
