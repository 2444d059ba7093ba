"""Text in, packed `seq_len` blocks out: Hub datasets, local files, or the embedded default corpus.

The embedded default is the Python standard library's own source files — real text on every machine, no network.
Tokenizing and packing happen once per machine (the local main process builds, the others load the cache).

Validation text (for eval loss and perplexity) comes from `--validation_files`, the Hub dataset's
`--validation_split`, or `--validation_split_percentage` of the training documents held out before packing (whole
documents, a seeded choice: no block straddles train and validation). Evaluating without naming one holds out
DEFAULT_VALIDATION_PERCENTAGE.
"""

import glob
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
DEFAULT_TOKENIZER_MIN_VOCAB = 257  # the default BPE's byte-level alphabet and EOS, before any merge
PACKING_VERSION = 1  # part of the packed-data cache key: bump it whenever pack() changes what it produces
DEFAULT_VALIDATION_PERCENTAGE = 5.0  # as transformers' run_clm.py holds out when a dataset has no validation split
VALIDATION_SEED = 0  # which documents are held out does not depend on the training seed
LOCAL_FORMATS = {".txt": "text", ".text": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def embedded_files() -> list[Path]:
    """The top-level modules of this interpreter's standard library, in a fixed order."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def expand_file_patterns(files: list[str] | None, flag: str) -> list[str] | None:
    """Glob patterns among local data files ('data/*.jsonl', as datasets takes them; a run file or a quoted argument
    reaches here unexpanded by a shell) replaced by the files they match, sorted. A pattern that matches no file is
    refused, naming it."""
    if not files:
        return files
    out = []
    for item in files:
        if glob.has_magic(item):
            matches = sorted(p for p in glob.glob(os.path.expanduser(item), recursive=True) if Path(p).is_file())
            if not matches:
                raise HfscaleError(f"{flag} {item!r} matches no file")
            out += matches
        else:
            out.append(item)
    return out


def check_local_files(files: list[str]) -> str:
    """The `datasets` builder for local files, after checking they exist and share one known format."""
    missing = [f for f in files if not Path(f).is_file()]
    if missing and Path(missing[0]).is_dir():
        folder = missing[0].rstrip("/")
        raise HfscaleError(f"{folder} is a directory, not a data file: name its files (or a glob: {folder}/*.txt)")
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


CONTENT_SAMPLE_BYTES = 1 << 20  # what a content check reads of each file (the libraries read the rest)


def check_file_content(path: str, text_column: str) -> None:
    """The start of a local data file is what its suffix says, holds text in `text_column`, and is not all blank:
    checked by every rank before anything is launched or written (the libraries would fail deep inside a run)."""
    kind = LOCAL_FORMATS.get(Path(path).suffix.lower())
    with open(path, "rb") as f:
        head = f.read(CONTENT_SAMPLE_BYTES)
    whole = len(head) < CONTENT_SAMPLE_BYTES
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            schema = pq.read_schema(path)
        except Exception as err:  # pyarrow raises several types for a file that is not parquet
            raise HfscaleError(f"data file {path} is not a parquet file ({str(err).splitlines()[0]})") from None
        if text_column not in schema.names:
            raise HfscaleError(f"data file {path} has no text column {text_column!r}; its columns: {schema.names}")
        column_type = str(schema.field(text_column).type)
        if column_type not in ("string", "large_string"):
            raise HfscaleError(f"data file {path}: column {text_column!r} holds {column_type}, not text")
        return
    if not whole:  # a multi-byte character may straddle the sample's end
        head = head[: len(head) - 4] + head[len(head) - 4:].decode("utf-8", errors="ignore").encode()
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as err:
        raise HfscaleError(f"data file {path} is not UTF-8 text (byte 0x{head[err.start]:02x} at offset "
                           f"{err.start})") from None
    if kind == "text":
        if whole and not text.strip():
            raise HfscaleError(f"data file {path} holds no text (only blank lines)")
        return
    if not whole and (text.lstrip().startswith("[") or "\n" not in text):
        return  # a large JSON array, or a first record longer than the sample: datasets reads it (errors in one line)
    records = _json_records(path, text, whole)
    if not records:
        raise HfscaleError(f"data file {path} holds no JSON records")
    for i, record in enumerate(records):
        if not isinstance(record, dict) or text_column not in record:
            found = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise HfscaleError(f"data file {path}: record {i + 1} has no text column {text_column!r} ({found})")
        if not isinstance(record[text_column], str):
            raise HfscaleError(f"data file {path}: record {i + 1}'s {text_column!r} is "
                               f"{type(record[text_column]).__name__}, not text")
    if whole and not any(r[text_column].strip() for r in records):
        raise HfscaleError(f"data file {path} holds no text (every {text_column!r} is blank)")


def _json_records(path: str, text: str, whole: bool) -> list:
    """The records at the start of a JSON-lines file, or of a JSON array (read whole when it is small)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not whole and lines:
        lines = lines[:-1]  # the sample may end mid-line
    try:
        return [json.loads(line) for line in lines]
    except json.JSONDecodeError as line_err:
        if whole:
            try:
                data = json.loads(text)
            except json.JSONDecodeError as err:
                raise HfscaleError(f"data file {path} is not JSON lines or JSON (line {err.lineno}: {err.msg})") from None
            data = data.get("data", data) if isinstance(data, dict) else data  # datasets' {"data": [...]} form
            return data if isinstance(data, list) else [data]
        raise HfscaleError(f"data file {path} is not JSON lines (line {line_err.lineno}: {line_err.msg})") from None


def files_fingerprint(files: list[str]) -> list:
    """What identifies local files for a cache key: where they are, their size and modification time."""
    return [(str(Path(f).resolve()), os.path.getsize(f), os.path.getmtime(f)) for f in files]


def source_fingerprint(data_args) -> dict:
    """What identifies the raw text, for the cache key."""
    if data_args.train_files:
        return {"files": files_fingerprint(data_args.train_files)}
    if data_args.dataset != EMBEDDED:
        return {"hub": [data_args.dataset, data_args.dataset_config, data_args.dataset_split]}
    return {"embedded": sys.version, "files": [(p.name, p.stat().st_size) for p in embedded_files()]}


def position_identity(data_args, model_name_or_path: str | None, validation: dict | None) -> dict:
    """What decides which training samples come in which order, beyond the batch shape and seed: the text (its files'
    names and sizes, the Hub dataset, or the embedded corpus), its column, the tokenizer, the held-out share. A resumed
    run must share it to resume its place in the data (run/checkpoints.py). Moving the files keeps it."""
    if data_args.train_files:
        source = {"files": [[Path(f).name, os.path.getsize(f)] for f in data_args.train_files]}
    elif data_args.dataset != EMBEDDED:
        source = {"hub": [data_args.dataset, data_args.dataset_config, data_args.dataset_split]}
    else:
        source = {"embedded": len(embedded_files())}
    name = data_args.tokenizer_name or model_name_or_path
    return {"text": {**source, "column": data_args.text_column},
            "tokenizer": name or f"hfscale's BPE, {data_args.default_tokenizer_vocab} tokens, trained on the text",
            "held_out_percentage": (validation or {}).get("percentage")}


def validation_plan(data_args, evaluating: bool) -> dict | None:
    """Where validation text comes from: {"files": [...]}, {"split": name} or {"percentage": p}; None for none.
    Pure: checks the choice against the training source before anything is loaded or written."""
    given = {k: v for k, v in (("files", data_args.validation_files), ("split", data_args.validation_split),
                                ("percentage", data_args.validation_split_percentage)) if v not in (None, "", [])}
    if len(given) > 1:
        raise HfscaleError("give one of --validation_files, --validation_split, --validation_split_percentage")
    if "percentage" in given and not 0 < given["percentage"] < 100:
        raise HfscaleError(f"--validation_split_percentage must be between 0 and 100, got {given['percentage']}")
    if "split" in given and (data_args.train_files or data_args.dataset == EMBEDDED):
        raise HfscaleError("--validation_split names a split of a Hub --dataset; for local or embedded text use "
                           "--validation_files or --validation_split_percentage")
    if "files" in given:
        kind = check_local_files(given["files"])
        if data_args.train_files and kind != check_local_files(data_args.train_files):
            raise HfscaleError("--validation_files must have the same format as --train_files")
    if not given and evaluating:
        given = {"percentage": DEFAULT_VALIDATION_PERCENTAGE}
    if "percentage" in given and data_args.streaming:
        raise HfscaleError("a streamed dataset cannot hold out a percentage; pass --validation_split or "
                           "--validation_files")
    return given or None


def _load_local(files: list[str], streaming: bool):
    import datasets

    builder = check_local_files(files)
    try:
        return datasets.load_dataset(builder, data_files=list(files), split="train", streaming=streaming)
    except Exception as err:  # past the content checks (they read each file's start): a fault further in
        cause = err.__cause__ or err
        raise HfscaleError(f"cannot read {', '.join(files)} as {builder}: {type(cause).__name__}: "
                           f"{str(cause).splitlines()[0] if str(cause) else ''}") from None


def load_raw_text(data_args, split: str | None = None):
    """A datasets.Dataset (or IterableDataset when streaming) with the text column. `split`: the Hub dataset's split
    (default --dataset_split)."""
    import datasets

    if data_args.train_files:
        ds = _load_local(data_args.train_files, data_args.streaming)
    elif data_args.dataset == EMBEDDED:
        texts = [p.read_text(encoding="utf-8", errors="replace") for p in embedded_files()]
        return datasets.Dataset.from_dict({data_args.text_column: texts})
    else:
        try:
            ds = datasets.load_dataset(data_args.dataset, data_args.dataset_config,
                                       split=split or data_args.dataset_split, streaming=data_args.streaming)
        except Exception as err:  # the Hub raises many types; the user needs the first line
            raise HfscaleError(f"cannot load dataset {data_args.dataset!r}: {str(err).splitlines()[0]}") from None
    check_text_column(ds, data_args.text_column, "dataset")
    return ds


def check_text_column(ds, column: str, what: str) -> None:
    columns = ds.column_names or []
    if column not in columns:
        raise HfscaleError(f"{what} has no text column {column!r}; its columns: {columns}")


def split_raw_text(raw, data_args, plan: dict | None):
    """(training text, validation text or None) as the validation plan says."""
    if not plan:
        return raw, None
    if "percentage" in plan:
        if len(raw) < 2:
            raise HfscaleError(f"--validation_split_percentage needs at least 2 documents; the data has {len(raw)}")
        held = max(1, round(len(raw) * plan["percentage"] / 100))
        parts = raw.train_test_split(test_size=min(held, len(raw) - 1), seed=VALIDATION_SEED, shuffle=True)
        return parts["train"], parts["test"]
    if "files" in plan:
        val = _load_local(plan["files"], data_args.streaming)
    else:
        val = load_raw_text(data_args, split=plan["split"])
    check_text_column(val, data_args.text_column, "the validation data")
    return raw, val


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
        except (OSError, ValueError) as err:  # missing/unreachable, or a directory without tokenizer files
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


def packed_dataset(data_args, tokenizer, raw, seq_len: int, part: dict | None = None, what: str = "the dataset"):
    """Packed blocks, from the cache when this machine already built them. `part`: which share of the source these
    documents are ({"train": plan} / {"validation": plan}); part of the cache key (absent for all of it)."""
    import datasets

    if data_args.streaming:
        return pack(raw, tokenizer, data_args.text_column, seq_len)
    identity = [source_fingerprint(data_args), data_args.text_column, tokenizer_fingerprint(tokenizer), seq_len,
                PACKING_VERSION]
    if part:
        identity.append({**part, "validation_seed": VALIDATION_SEED,
                         "files": files_fingerprint((part.get("validation") or {}).get("files", []))})
    out = Path(data_args.cache_dir) / f"packed-{_digest(identity)}"
    if not out.is_dir():
        packed = pack(raw, tokenizer, data_args.text_column, seq_len)
        if len(packed) == 0:  # checked before caching: datasets cannot load a saved dataset of no rows
            raise HfscaleError(f"{what} yields no full block of seq_len {seq_len} tokens; use more text or a shorter "
                               "--seq_len" + (" (or a larger validation share)" if what != "the dataset" else ""))
        atomic_write_dir(out, packed.save_to_disk)
    return datasets.load_from_disk(str(out)).with_format("torch")
