"""Command-line arguments: three dataclasses parsed together by HfArgumentParser (a whole run fits in one JSON/YAML).

Config flows one way: CLI/JSON -> dataclasses -> the strategy file fills defaults -> explicit flags win. Every
transformers TrainingArguments flag works; hfscale adds --strategy and gives --optim its own three names.

Parsing is pure: `parse_args` reads the flags into the dataclasses and checks each value on its own (its kind, its
range); run/planning.py's `plan_training` then checks the choices together and decides the run's RunPlan
(hfscale/runplan.py) and hfscale's defaults for the TrainingArguments keywords. Building the TrainingArguments
(`build_training_arguments`) creates accelerate's device state and process group, so `train.run()` does it
explicitly, after `parallel.distributed.setup_processes`.
"""

import argparse
import json
import math
import os
import sys
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import get_type_hints

from transformers import HfArgumentParser, TrainingArguments

from ..errors import HfscaleError, unknown_names
from ..files import check_writable_dir, is_run_file, read_run_file
from ..formulas.metrics import ModelShape, param_count
from ..models import (PRESETS, check_attention, families_where, missing_local_path, model_dropout, model_shape,
                      resolve_seq_len, resolve_shape, served_model_types)
from ..parallel.optimizers import OPTIMIZERS
from ..parallel.strategies import all_strategies
from ..runplan import RunPlan
from .checks import check_hyperparameters, check_scheduler_kwargs, json_object_flag
from .data import (DEFAULT_TOKENIZER_MIN_VOCAB, EMBEDDED, check_file_content, check_local_files,
                   expand_file_patterns)
from .garbage import DEFAULT_GC_FREQ
from .recipes import apply_defaults, document_recipe
from .results import refuse_finished_run

DEFAULT_CACHE = os.environ.get("HFSCALE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "hfscale")


def require_finite(values: dict) -> None:
    """NaN and infinity are never a size, a rate or a step count (transformers would crash on some: OverflowError)."""
    for name, value in values.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise HfscaleError(f"--{name} must be a finite number, got {value}")


@dataclass
class ModelArguments:
    model: str = field(default="tiny", metadata={"help": f"Model preset: {', '.join(PRESETS)}."})
    model_name_or_path: str | None = field(
        default=None, metadata={"help": f"A pretrained {', '.join(served_model_types()[:-1])} or "
                                        f"{served_model_types()[-1]} checkpoint (local directory or Hub name); "
                                        f"overrides --model."})
    n_layer: int | None = field(default=None, metadata={"help": "Override the preset's number of layers."})
    hidden_size: int | None = field(default=None, metadata={"help": "Override the preset's hidden size."})
    n_head: int | None = field(default=None, metadata={"help": "Override the preset's attention heads."})
    num_key_value_heads: int | None = field(default=None, metadata={
        "help": "Override a Llama-shaped preset's key/value heads (grouped-query attention; must divide the heads)."})
    head_dim: int | None = field(default=None, metadata={
        "help": f"Override a {families_where('own_head_width')} preset's head width (its queries are heads x head_dim "
                f"wide; the other families' heads are hidden / heads)."})
    sliding_window: int | None = field(default=None, metadata={
        "help": f"Override a {families_where('window_in_config')} preset's sliding window: the tokens its windowed "
                f"layers attend over (default: the preset's; Gemma 3 1B's 512, Gemma3TextConfig's and Olmo3Config's "
                f"4,096 on their windowed layers, Phi-3-mini's 2,047 on every layer, none on Phi-4)."})
    ffn_hidden_size: int | None = field(default=None, metadata={
        "help": "Override the MLP inner size (GPT-2: default 4 x hidden; Llama, Qwen: its intermediate size; not BLOOM)."})
    vocab_size: int | None = field(default=None, metadata={"help": "Override the vocabulary size."})
    attn_implementation: str | None = field(default=None, metadata={"help": "eager, sdpa or flash_attention_2 (default: transformers' choice)."})
    dropout: float | None = field(default=None, metadata={"help": "The model's hidden and attention dropout (default: a preset's 0, as in BLOOM pretraining; a checkpoint's own config's - transformers' GPT-2 sets 0.1)."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow code from a pretrained checkpoint to run."})
    fused_linear_cross_entropy: bool = field(default=False, metadata={"help": (
        "Compute the LM head and its loss a chunk of tokens at a time, gradients included, never holding the b x s x "
        "vocab logits (Liger-Kernel's method in torch ops): the same loss, less activation memory (docs/estimate.md). "
        "Not with tp/fsdp_tp.")})

    def __post_init__(self):
        require_finite(vars(self))
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise HfscaleError(f"--dropout must be in [0, 1), got {self.dropout}")
        if self.model_name_or_path is None:  # a preset's mistakes are found before anything else is read
            resolve_shape(self.model, self.n_layer, self.hidden_size, self.n_head, self.ffn_hidden_size,
                          self.vocab_size, n_kv_head=self.num_key_value_heads, head_dim=self.head_dim,
                          sliding_window=self.sliding_window)
        self.name = Path(self.model_name_or_path).name if self.model_name_or_path else self.model

    def dropout_probability(self) -> float:
        """The model's dropout: --dropout, else a checkpoint's own config's, else a preset's 0."""
        return model_dropout(self.dropout, self.model_name_or_path, self.trust_remote_code)

    def shape(self) -> ModelShape:
        """The model's shape (a pretrained checkpoint's config is read here, not its weights)."""
        return model_shape(self.model, self.model_name_or_path, self.trust_remote_code, self.n_layer,
                           self.hidden_size, self.n_head, self.ffn_hidden_size, self.vocab_size,
                           self.num_key_value_heads, head_dim=self.head_dim, sliding_window=self.sliding_window)


def has_tokenizer_files(path: str) -> bool:
    return Path(path).is_dir() and any(Path(path).glob("tokenizer*"))


def check_model_tokenizer(model_args, data_args) -> None:
    """A local model directory without tokenizer files needs --tokenizer_name: transformers would build an empty GPT-2
    tokenizer from the config alone, and every text would encode to nothing (call after the model's own checks). A
    preset trained with the default tokenizer needs room for its byte-level alphabet."""
    path = model_args.model_name_or_path
    if path and Path(path).is_dir() and not data_args.tokenizer_name and not has_tokenizer_files(path):
        raise HfscaleError(f"--model_name_or_path {path} has no tokenizer files (tokenizer.json or "
                           "tokenizer_config.json): pass --tokenizer_name")
    vocab = None if path or data_args.tokenizer_name else model_args.shape().vocab  # a preset, the default tokenizer
    if vocab is not None and vocab < DEFAULT_TOKENIZER_MIN_VOCAB:
        raise HfscaleError(f"--vocab_size {vocab} is below the default tokenizer's {DEFAULT_TOKENIZER_MIN_VOCAB} tokens "
                           "(a byte-level BPE: 256 bytes and the end-of-text token); give at least "
                           f"{DEFAULT_TOKENIZER_MIN_VOCAB}, or a --tokenizer_name that fits the model")


@dataclass
class DataArguments:
    dataset: str = field(default=EMBEDDED, metadata={"help": f"A Hub dataset name, or {EMBEDDED!r}: the Python standard library's sources (offline)."})
    dataset_config: str | None = field(default=None, metadata={"help": "The Hub dataset's configuration, e.g. wikitext-103-raw-v1."})
    dataset_split: str = field(default="train", metadata={"help": "Split to train on."})
    text_column: str = field(default="text", metadata={"help": "Column holding the text."})
    streaming: bool = field(default=False, metadata={"help": "Stream the Hub dataset instead of downloading it (needs --max_steps)."})
    train_files: list[str] | None = field(default=None, metadata={"help": "Local .txt/.jsonl/.json/.parquet files (or glob patterns, e.g. 'data/*.jsonl') instead of a dataset."})
    seq_len: int | None = field(default=None, metadata={"help": "Tokens per sample (default: the model's positions, at most 1024)."})
    validation_files: list[str] | None = field(default=None, metadata={"help": "Local files (or glob patterns) of validation text (same format as the training files)."})
    validation_split: str | None = field(default=None, metadata={"help": "The Hub dataset's validation split, e.g. validation."})
    validation_split_percentage: float | None = field(default=None, metadata={"help": "Hold out this share of the training documents for evaluation (default 5 when evaluating without --validation_files/--validation_split; 0 < p < 100)."})
    tokenizer_name: str | None = field(default=None, metadata={"help": "Any HF tokenizer; default: the model's, else a byte-level BPE trained on the corpus."})
    default_tokenizer_vocab: int = field(default=8192, metadata={"help": "Vocabulary of the default BPE tokenizer (capped by the model's)."})
    cache_dir: str = field(default=DEFAULT_CACHE, metadata={"help": "Where tokenizers and packed datasets are cached (once per machine; default $HFSCALE_CACHE_DIR, else ~/.cache/hfscale)."})

    def __post_init__(self):
        require_finite(vars(self))
        if self.seq_len is not None and self.seq_len <= 0:
            raise HfscaleError(f"--seq_len must be positive, got {self.seq_len}")
        if self.seq_len == 1:  # the labels are the inputs shifted by one: a loss over no tokens, NaN at every step
            raise HfscaleError("--seq_len 1 leaves nothing to predict (each token is learnt from the ones before it in "
                               "its sample): give at least 2")
        if self.default_tokenizer_vocab <= 0:
            raise HfscaleError(f"--default_tokenizer_vocab must be positive, got {self.default_tokenizer_vocab}")
        check_writable_dir(self.cache_dir, "--cache_dir")
        self._check_source()
        if self.tokenizer_name and missing_local_path(self.tokenizer_name):
            raise HfscaleError(f"--tokenizer_name {self.tokenizer_name}: no such directory")
        if self.tokenizer_name and Path(self.tokenizer_name).exists() and not has_tokenizer_files(self.tokenizer_name):
            raise HfscaleError(f"--tokenizer_name {self.tokenizer_name} is not a tokenizer directory (no tokenizer.json "
                               "or tokenizer_config.json)")

        self.train_files = expand_file_patterns(self.train_files, "--train_files")
        self.validation_files = expand_file_patterns(self.validation_files, "--validation_files")
        for files in (self.train_files, self.validation_files):
            if files:
                check_local_files(files)
                for path in files:
                    check_file_content(path, self.text_column)

    def _check_source(self) -> None:
        """One source of training text, and no flag of another source's (each was silently ignored: the run trained
        on other text than the command line says)."""
        if self.train_files and self.dataset != EMBEDDED:
            raise HfscaleError(f"give --dataset {self.dataset} or --train_files, not both")
        hub_only = {"--dataset_config": self.dataset_config, "--dataset_split": self.dataset_split != "train" or None}
        unread = next((flag for flag, given in hub_only.items() if given), None)
        if unread and (self.train_files or self.dataset == EMBEDDED):
            source = "--train_files" if self.train_files else f"the embedded {EMBEDDED} corpus"
            raise HfscaleError(f"{unread} is read only for a Hub --dataset; {source} has none")
        if self.streaming and not self.train_files and self.dataset == EMBEDDED:
            raise HfscaleError(f"--streaming streams a Hub --dataset or --train_files; the embedded {EMBEDDED} "
                               "corpus is read whole")


@dataclass
class HfscaleTrainingArguments(TrainingArguments):
    strategy: str | None = field(
        default=None,
        metadata={"help": f"One of {', '.join(all_strategies())} (default: the launcher config's, else ddp)."})
    optim: str = field(default="adamw", metadata={"help": f"Optimizer: {', '.join(OPTIMIZERS)}."})
    powersgd_rank: int | None = field(default=None, metadata={"help": "ddp_powersgd: rank of the low-rank factors (default: strategy file)."})
    powersgd_warmup_steps: int | None = field(default=None, metadata={"help": "ddp_powersgd: uncompressed steps first (default: strategy file)."})
    global_batch_size: int | None = field(default=None, metadata={"help": "Samples per optimizer step; sets gradient_accumulation_steps = GBS / (MBS x GPUs)."})
    token_budget: float = field(default=1e11, metadata={"help": "Tokens to price in days (default 100B)."})
    peak_tflops: float | None = field(default=None, metadata={"help": "Peak TFLOPs per device for MFU (default: the known-device table; on CPU a measured peak)."})
    measure_peak: bool = field(default=False, metadata={"help": "Also measure the device's matmul peak at start-up and report MFU against it."})
    measure: bool = field(default=True, metadata={"help": "Live perf/* figures (one clock read per logging step); false only to benchmark that overhead (benchmarks/measure_overhead.py)."})
    perf_warmup_steps: int = field(default=2, metadata={"help": "Optimizer steps excluded from timing (default 2; on a GPU 5, or half the steps of a run of under 10; under ddp_powersgd at least its uncompressed warm-up steps); the whole-run figures are timed from the first logging step at or after them (the steady state: docs/metrics.md). 0: every step timed."})
    report_to: None | str | list[str] = field(default="tensorboard", metadata={"help": "Logging backends; tensorboard is written by hfscale into the run directory."})
    logging_steps: float = field(default=10, metadata={"help": "Log (and time) every N optimizer steps."})
    ddp_find_unused_parameters: bool | None = field(default=None, metadata={"help": "Default False (GPT-2, BLOOM and Llama use every parameter each step; True adds a graph traversal per step), except ddp_powersgd: True, which keeps DDP's gradient buckets in construction order (no rebuild after step 1) so PowerSGD's per-bucket state resumes exactly from a checkpoint."})
    overwrite_output_dir: bool = field(default=False, metadata={"help": "Allow reusing a run directory that already holds a finished run's results."})
    record_batches: bool = field(default=False, metadata={"help": "Record a digest of every micro-batch per rank in results.json (proves no sample is skipped or repeated across a resume; one sync per micro-batch)."})
    count_collectives: int = field(default=0, metadata={"help": "Record every collective of optimizer step N (>= 2; one whole loop period, torch's profiler) per rank in results.json: kind, dtype, message size, count - what hfscale's communication model is checked against (0: off)."})
    logging_nan_inf_filter: bool = field(default=False, metadata={"help": "Replace a NaN/inf micro-batch loss by the window's average when logging (the Trainer's default: true). hfscale's default false logs the loss as it is - a run that diverged says so - and spares a host sync per micro-batch (docs/metrics.md)."})
    accelerator_config: dict | str | None = field(default=None, metadata={"help": "accelerate's settings as JSON (a dict or a file); hfscale's default on a GPU: {\"non_blocking\": true} - each batch copied to the GPU from pinned memory without a stream synchronize (docs/metrics.md); on a CPU the Trainer's. Yours is taken as it is."})
    profile_step: int = field(default=0, metadata={"help": "Profile optimizer step N (>= 2; one whole loop period) with torch's profiler: a Chrome/Perfetto trace per rank in output_dir/profile/ and, in results.json profile, the host's and the device's busiest ops and the device's idle share (0: off)."})
    count_host_syncs: bool = field(default=False, metadata={"help": "Record, per optimizer step, every read of a tensor's values by Python (.item(), bool(t), .tolist(), .cpu() ...: each one waits for a GPU) and where it came from, in results.json host_syncs (rank 0's; a diagnostic: reads inside compiled regions are not seen)."})
    resume_from_checkpoint: str | None = field(default=None, metadata={"help": "A checkpoint directory (a run's folder: its newest complete checkpoint), or `latest`: the newest complete, intact checkpoint in --output_dir (a fresh start when there is none). It must be of the same strategy, optimizer, world size, model and place in the data (batch shape, seq_len, data seed, text, tokenizer; --ignore_data_skip starts the data over)."})
    gc_freq: int = field(default=DEFAULT_GC_FREQ, metadata={"help": "Python's garbage collector: automatic collection off, a young-generation collection at the end of every Nth optimizer step on every rank (no rank stalls its partners at a random moment; torchtitan's gc_freq) and a full one after each evaluation; 0: Python's automatic collection. Start-up runs without collections either way (hfscale/run/garbage.py)."})
    fingerprint_weights: bool = field(default=False, metadata={"help": "Record a per-tensor (sum, L2) fingerprint of the final full weights (gathers them; for parity checks)."})
    fp8: bool = field(default=False, metadata={"help": "Train the decoder blocks' linear layers with float8 matmuls (torchao's float8 through accelerate; GPUs with float8 tensor cores: Ada, Hopper and later). Everything else computes in bf16 (--fp8 implies --bf16); the head and the embeddings stay in high precision. ddp, the fsdp strategies (which then gather the converted weights in float8) and tp/fsdp_tp; not zero* (docs/strategies.md)."})
    fp8_recipe: str = field(default="tensorwise", metadata={"help": "torchao's float8 recipe: tensorwise (dynamic scales per tensor, the fastest), rowwise, rowwise_with_gw_hp."})
    fp8_emulate: bool = field(default=False, metadata={"help": "With --fp8: emulate the float8 casts in high precision (torchao's emulate) - no float8 tensor cores needed, no speedup; runs the --fp8 code path on a CPU, for tests."})

    def __post_init__(self):
        try:
            super().__post_init__()
        except ValueError as err:  # TrainingArguments' own checks are about what the user passed
            raise HfscaleError(" ".join(str(err).split())) from None
        if self.fp8:  # accelerate's fp8 mode: bf16 autocast, and the recipe handler converts the model at prepare
            self.mixed_precision = "fp8"
        mismatches = getattr(getattr(self, "hf_deepspeed_config", None), "mismatches", None)
        if mismatches:  # transformers collects these now and raises them only once training starts, on every rank
            raise HfscaleError(f"{self.deepspeed}: values that contradict the Trainer flags: "
                               + "; ".join(m.lstrip("- ") for m in mismatches) + ' (use "auto" or change the flags)')


@dataclass
class RunState:
    """hfscale's own facts about one run, decided from the arguments and passed explicitly to whatever needs them
    (nothing of hfscale's is stored on the Trainer's args): the RunPlan, and what only a launched run has."""

    plan: RunPlan
    tensorboard: bool  # hfscale writes the TensorBoard events itself
    auto_output_dir: bool  # no --output_dir: runs/<run name>
    explicit: set = field(default_factory=set)  # the training flags the user set
    recipe: dict = field(default_factory=dict)  # {name: [value, "flag" | "default" | "trainer"]}: recipes.apply_defaults
    checkpoint_identity: dict | None = None  # set once the run knows its world size (train.resume_checkpoint)
    resume_from: str | None = None  # the complete checkpoint this run resumes from
    validation: dict | None = None  # where validation text comes from (run/data.validation_plan), None: no evaluation


def training_flag_defaults() -> dict:
    """Every training flag's default as hfscale's TrainingArguments set it (hfscale's own among them)."""
    return {f.name: f.default if f.default is not MISSING else f.default_factory()
            if f.default_factory is not MISSING else None for f in fields(HfscaleTrainingArguments)}


def build_training_arguments(training: dict, overrides: dict | None = None) -> HfscaleTrainingArguments:
    """Build the TrainingArguments. Not pure: transformers creates accelerate's device state (and, when launched,
    the process group) here, so it comes after `setup_processes`."""
    return HfscaleTrainingArguments(**{**training, **(overrides or {})})


class HfscaleArgumentParser(HfArgumentParser):
    """HfArgumentParser whose errors are one line (argparse would print the whole usage of ~150 flags first)."""

    def error(self, message):
        raise HfscaleError(message)


DATACLASSES = (ModelArguments, DataArguments, HfscaleTrainingArguments)
TRAIN_FLAGS_LISTED = "`hfscale train --help` lists every flag"


def _split_by_dataclass(values: dict, where: str) -> list[dict]:
    """{flag: value} -> one {field: value} per dataclass; a key no dataclass has is refused (as parse_dict does)."""
    groups = []
    for dtype in DATACLASSES:
        keys = {f.name for f in fields(dtype) if f.init}
        groups.append({k: v for k, v in values.items() if k in keys})
    unused = sorted(set(values) - {k for g in groups for k in g})
    if unused:
        known = [f.name for dtype in DATACLASSES for f in fields(dtype) if f.init]
        raise HfscaleError(f"{where}{unknown_names('key', unused, known, TRAIN_FLAGS_LISTED)} (a key is a flag without "
                           "its --)")
    return groups


def _refuse_leftovers(parser, remaining: list[str]) -> None:
    """What argparse could not place: unknown flags (with any value after them) or stray words."""
    flags = [arg.split("=", 1)[0] for arg in remaining if arg.startswith("-")]
    if flags:
        known = [option for option in parser._option_string_actions  # --a_b, not its twin --a-b
                 if option.startswith("--") and "-" not in option[2:]]
        raise unknown_names("flag", flags, known, TRAIN_FLAGS_LISTED)
    raise HfscaleError(f"unexpected argument{'s' if len(remaining) > 1 else ''} {' '.join(remaining)}: hfscale train "
                       "takes --flags, or one run file (.json, .yaml, .yml) alone")


def _coerce_file_values(parser, data: dict, where: str) -> dict:
    """A run file's values read as the command line reads its flags: each through its flag's own type and choices,
    so a value of the wrong kind is one line naming the key, as argparse names a flag, never a traceback later.
    Lists and mappings go where the field takes them (train_files, report_to, lr_scheduler_kwargs, ...)."""
    # the classes' own annotations: HfArgumentParser narrows each field's `type` in place (dict | str -> str)
    annotations = {name: str(hint) for dtype in DATACLASSES for name, hint in get_type_hints(dtype).items()}
    out = {}
    for key, value in data.items():
        action = parser._option_string_actions.get(f"--{key}")
        if action is None or value is None:  # an unknown key is refused by _split_by_dataclass; null: the default
            out[key] = value
            continue
        takes_many = action.nargs in ("+", "*") or "list" in annotations.get(key, "")
        if isinstance(value, dict) and "dict" in annotations.get(key, ""):
            out[key] = value
            continue
        if isinstance(value, dict) or (isinstance(value, list) and not takes_many):
            raise HfscaleError(f"{where}{key} takes one value, got {json.dumps(value)[:60]}")
        items = [_coerce_one(action, item, f"{where}{key}") for item in (value if isinstance(value, list) else [value])]
        out[key] = items if isinstance(value, list) or action.nargs in ("+", "*") else items[0]
    return out


def _coerce_one(action, item, where: str):
    kind = action.type or str
    numeric = kind in (int, float)
    wanted = {int: "an integer", float: "a number"}.get(kind, "true or false" if action.nargs == "?" else "a value")
    bad = HfscaleError(f"{where} takes {wanted}, got {json.dumps(item)[:60]}")
    if isinstance(item, (list, dict)) or (numeric and isinstance(item, bool)) or (
            kind is int and isinstance(item, float) and not item.is_integer()):
        raise bad
    try:
        converted = kind(item if numeric or isinstance(item, bool) else str(item))
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        raise bad from None
    if action.choices is not None and converted not in action.choices:
        raise HfscaleError(f"{where}: unknown value {json.dumps(item)[:60]}; choose one of: "
                           f"{', '.join(str(getattr(c, 'value', c)) for c in action.choices)}")
    return converted


def _read_values(argv: list[str]) -> tuple[list[dict], set[str]]:
    """(one {field: value} per dataclass, the fields the user set): explicit values win over hfscale's recipes."""
    # no abbreviations: `--strat zero3` after a sweep's `--` would slip past its axis check and train zero3 in a run
    # named ddp; a misspelt or shortened flag is named with its full spellings instead
    parser = HfscaleArgumentParser(DATACLASSES, allow_abbrev=False)
    parser.prog = "hfscale train"
    document_recipe(parser)
    if is_run_file(argv):
        path = Path(argv[0])
        data = read_run_file(path)
        groups = _split_by_dataclass(_coerce_file_values(parser, data, f"{path}: "), f"{path}: ")
        defaults = _split_by_dataclass(vars(parser.parse_args([])), "")
        return [{**d, **g} for d, g in zip(defaults, groups)], set(data)
    namespace, remaining = parser.parse_known_args(args=argv)
    if remaining:
        _refuse_leftovers(parser, remaining)
    given = {a[2:].split("=", 1)[0] for a in argv if a.startswith("--")}
    values = vars(namespace)
    explicit = {name for name in given if name in values} | {name[3:] for name in given if name.startswith("no_")}
    return _split_by_dataclass(values, ""), explicit


def check_training_flags(train_args: list[str], here: bool = True) -> None:
    """The training flags a command hands on - to the runs it launches (`hfscale launch`, sweep, tune, parity) or
    into a job script (`hfscale slurm`) - checked before it writes or starts anything, so that a typo is one line
    rather than a failed run per configuration: every flag exists, each value is of its kind, the model (a preset, or
    a checkpoint on this machine) takes the attention and sequence length asked, the hyperparameters are in range,
    and, `here` (the runs start on this machine), the files they name exist. What depends on the launched world (its
    processes and devices, a sweep's strategy x optimizer) each run checks as it starts."""
    (model_kw, data_kw, training), explicit = _read_values(train_args)
    model_args = _built(ModelArguments, model_kw)
    data_args = _built(DataArguments, data_kw) if here else None
    path = model_args.model_name_or_path
    if path is None or (here and Path(path).is_dir()):  # no Hub lookup for a check
        shape, _ = check_model(model_args, data_kw.get("seq_len"))
        # the schedule the runs will build, hfscale's recipe filled in (its values depend on the model's size)
        recipe = apply_defaults(training, explicit, param_count(shape), training["optim"])[0]
        check_scheduler_kwargs(str(recipe["lr_scheduler_type"]), json_object_flag(recipe, "lr_scheduler_kwargs"))
    if data_args is not None:
        check_model_tokenizer(model_args, data_args)
    check_hyperparameters(training)
    if here:
        check_output_dir(training)


def check_output_dir(training: dict) -> None:
    """The --output_dir a user named can be written and holds no finished run (unless --overwrite_output_dir), said
    before any process starts; each run's rank 0 checks it again once it holds the folder's lock."""
    if training.get("output_dir") is None:  # runs/<run name>, named once the plan is known
        return
    check_writable_dir(training["output_dir"], "--output_dir")
    refuse_finished_run(training["output_dir"], training.get("overwrite_output_dir"),
                        bool(training.get("resume_from_checkpoint")))


def check_model(model_args: ModelArguments, seq_len: int | None) -> tuple[ModelShape, int]:
    """(the model's shape, tokens per sample): the attention asked is one the model has, the sequence fits its
    positions."""
    shape = model_args.shape()
    check_attention(shape.family, model_args.attn_implementation)
    return shape, resolve_seq_len(shape, seq_len)


def _built(dataclass_type, kw: dict):
    """One of the argument dataclasses, its __post_init__'s checks passed; a library's error becomes one line."""
    try:
        return dataclass_type(**kw)
    except (ValueError, TypeError) as err:
        raise HfscaleError(" ".join(str(err).split())) from None


def parse_args(argv: list[str] | None = None) -> tuple[ModelArguments, DataArguments, dict, set[str]]:
    """(model args, data args, TrainingArguments keywords, the training flags the user set): the flags read into the
    dataclasses, each checked by its own __post_init__. Pure; raises HfscaleError (and only that)."""
    argv = sys.argv[1:] if argv is None else argv
    (model_kw, data_kw, training), explicit = _read_values(argv)
    return _built(ModelArguments, model_kw), _built(DataArguments, data_kw), training, explicit
