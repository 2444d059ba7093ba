"""Command-line arguments: three dataclasses parsed together by HfArgumentParser (a whole run fits in one JSON/YAML).

Config flows one way: CLI/JSON -> dataclasses -> the strategy file fills defaults -> explicit flags win.
Every transformers TrainingArguments flag works; hfscale adds --strategy and gives --optim its own three names.
"""

import math
import os
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

from transformers import HfArgumentParser, TrainingArguments

from ..files import load_json, load_yaml
from .data import EMBEDDED
from ..parallel.distributed import (has_accelerator, launcher_deepspeed_config, launcher_world_size, prepare_processes,
                          resolve_strategy)
from ..errors import HfscaleError
from .models import PRESETS, resolve_shape
from ..parallel.strategies import (OPTIMIZERS, all_strategies, check_optimizer, check_pair, get_strategy, hf_optim_name,
                         load_deepspeed_config)

DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "hfscale")


def require_finite(args) -> None:
    """NaN and infinity are never a size, a rate or a step count (transformers would crash on some: OverflowError)."""
    for f in fields(args):
        value = getattr(args, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise HfscaleError(f"--{f.name} must be a finite number, got {value}")


@dataclass
class ModelArguments:
    model: str = field(default="tiny", metadata={"help": f"Model preset: {', '.join(PRESETS)}."})
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "A pretrained gpt2/bloom checkpoint (local directory or Hub name); overrides --model."})
    n_layer: int | None = field(default=None, metadata={"help": "Override the preset's number of layers."})
    hidden_size: int | None = field(default=None, metadata={"help": "Override the preset's hidden size."})
    n_head: int | None = field(default=None, metadata={"help": "Override the preset's attention heads."})
    ffn_hidden_size: int | None = field(default=None, metadata={"help": "Override the MLP inner size (GPT-2 only; default 4 x hidden)."})
    vocab_size: int | None = field(default=None, metadata={"help": "Override the vocabulary size."})
    attn_implementation: str | None = field(default=None, metadata={"help": "eager, sdpa or flash_attention_2 (default: transformers' choice)."})
    dropout: float = field(default=0.0, metadata={"help": "Dropout of a preset model (0, as in BLOOM pretraining)."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow code from a pretrained checkpoint to run."})

    def __post_init__(self):
        require_finite(self)
        if self.model_name_or_path is None:
            self.shape = resolve_shape(self.model, self.n_layer, self.hidden_size, self.n_head,
                                       self.ffn_hidden_size, self.vocab_size)
        else:
            self.shape = None  # known once the pretrained config is read
        self.name = Path(self.model_name_or_path).name if self.model_name_or_path else self.model


@dataclass
class DataArguments:
    dataset: str = field(default=EMBEDDED, metadata={"help": f"A Hub dataset name, or {EMBEDDED!r}: the Python standard library's sources (offline)."})
    dataset_config: str | None = field(default=None, metadata={"help": "The Hub dataset's configuration, e.g. wikitext-103-raw-v1."})
    dataset_split: str = field(default="train", metadata={"help": "Split to train on."})
    text_column: str = field(default="text", metadata={"help": "Column holding the text."})
    streaming: bool = field(default=False, metadata={"help": "Stream the Hub dataset instead of downloading it (needs --max_steps)."})
    train_files: list[str] | None = field(default=None, metadata={"help": "Local .txt/.jsonl/.json/.parquet files instead of a dataset."})
    seq_len: int | None = field(default=None, metadata={"help": "Tokens per sample (default: the model's positions, at most 1024)."})
    tokenizer_name: str | None = field(default=None, metadata={"help": "Any HF tokenizer; default: the model's, else a byte-level BPE trained on the corpus."})
    default_tokenizer_vocab: int = field(default=8192, metadata={"help": "Vocabulary of the default BPE tokenizer (capped by the model's)."})
    cache_dir: str = field(default=DEFAULT_CACHE, metadata={"help": "Where tokenizers and packed datasets are cached (once per machine)."})

    def __post_init__(self):
        require_finite(self)
        if self.seq_len is not None and self.seq_len <= 0:
            raise HfscaleError(f"--seq_len must be positive, got {self.seq_len}")
        if self.train_files:
            from .data import check_local_files

            check_local_files(self.train_files)


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
    perf_warmup_steps: int = field(default=2, metadata={"help": "Optimizer steps excluded from timing."})
    report_to: None | str | list[str] = field(default="tensorboard", metadata={"help": "Logging backends; tensorboard is written by hfscale into the run directory."})
    logging_steps: float = field(default=10, metadata={"help": "Log (and time) every N optimizer steps."})
    ddp_find_unused_parameters: bool | None = field(default=None, metadata={"help": "Default False (GPT-2/BLOOM use every parameter each step; True adds a graph traversal per step), except ddp_powersgd: True, which keeps DDP's gradient buckets in construction order (no rebuild after step 1) so PowerSGD's per-bucket state resumes exactly from a checkpoint."})
    overwrite_output_dir: bool = field(default=False, metadata={"help": "Allow reusing a run directory that already holds a finished run's results."})
    record_batches: bool = field(default=False, metadata={"help": "Record a digest of every micro-batch per rank in results.json (proves no sample is skipped or repeated across a resume; one sync per micro-batch)."})
    resume_from_checkpoint: str | None = field(default=None, metadata={"help": "A checkpoint directory, or `latest`: the newest complete checkpoint in --output_dir (a fresh start when there is none)."})
    fingerprint_weights: bool = field(default=False, metadata={"help": "Record a per-tensor (sum, L2) fingerprint of the final full weights (gathers them; for parity checks)."})

    def __post_init__(self):
        require_finite(self)
        check_optimizer(self.optim)
        self.strategy = resolve_strategy(self.strategy)
        strategy = get_strategy(self.strategy)
        check_pair(self.strategy, self.optim)
        self.hfscale_optim = self.optim
        self.optim = hf_optim_name(self.optim, has_accelerator())
        self._apply_strategy(strategy)
        self._apply_batch_sizes()
        self.hfscale_tensorboard, self.report_to = _split_tensorboard(self.report_to)
        self.hfscale_auto_output_dir = self.output_dir is None
        if self.fp16 and not has_accelerator():
            raise HfscaleError("--fp16 needs a GPU: on CPU accelerate silently trains in fp32 and DeepSpeed's CPU "
                               "accelerator has no fp16; use --bf16 (or no precision flag for fp32)")
        for key, value in prepare_processes(strategy).items():
            setattr(self, key, value)
        try:
            super().__post_init__()
        except ValueError as err:  # TrainingArguments' own checks are about what the user passed
            raise HfscaleError(" ".join(str(err).split())) from None
        mismatches = getattr(getattr(self, "hf_deepspeed_config", None), "mismatches", None)
        if mismatches:  # transformers collects these now and raises them only once training starts, on every rank
            raise HfscaleError(f"{self.deepspeed}: values that contradict the Trainer flags: "
                               + "; ".join(m.lstrip("- ") for m in mismatches) + ' (use "auto" or change the flags)')

    def _apply_strategy(self, strategy) -> None:
        if strategy.engine == "deepspeed":
            path = self.deepspeed or launcher_deepspeed_config() or strategy.deepspeed_config_path
            if not isinstance(path, dict):
                load_deepspeed_config(path, strategy)
                path = str(path)
            self.deepspeed = path
        elif self.deepspeed:
            raise HfscaleError(f"--deepspeed is for the zero* strategies; {strategy.name!r} is {strategy.engine}")
        if strategy.engine == "fsdp":
            self.fsdp = strategy.fsdp
            self.fsdp_config = {"version": 2, "reshard_after_forward": True, "state_dict_type": "SHARDED_STATE_DICT",
                                **(self.fsdp_config or {})}
        elif self.fsdp:
            raise HfscaleError(f"--fsdp is for the fsdp strategies; {strategy.name!r} is {strategy.engine}")
        if self.ddp_find_unused_parameters is None:
            self.ddp_find_unused_parameters = strategy.comm_hook == "powersgd"
        if strategy.comm_hook == "powersgd":
            self.powersgd_rank = self.powersgd_rank or strategy.powersgd["rank"]
            if self.powersgd_warmup_steps is None:
                self.powersgd_warmup_steps = strategy.powersgd["warmup_steps"]
            if self.powersgd_rank <= 0 or self.powersgd_warmup_steps < 0:
                raise HfscaleError("--powersgd_rank must be positive and --powersgd_warmup_steps non-negative")
            if launcher_world_size() < 2:
                raise HfscaleError("ddp_powersgd compresses the gradient all-reduce between ranks; launch 2 or more processes")

    def _apply_batch_sizes(self) -> None:
        world = launcher_world_size()
        for name in ("per_device_train_batch_size", "gradient_accumulation_steps"):
            if getattr(self, name) <= 0:
                raise HfscaleError(f"--{name} must be positive, got {getattr(self, name)}")
        if self.global_batch_size is not None:
            per_step = self.per_device_train_batch_size * world
            if self.global_batch_size <= 0 or self.global_batch_size % per_step:
                raise HfscaleError(
                    f"--global_batch_size {self.global_batch_size} is not a positive multiple of "
                    f"MBS x GPUs = {self.per_device_train_batch_size} x {world} = {per_step}")
            self.gradient_accumulation_steps = self.global_batch_size // per_step
        if self.token_budget <= 0:
            raise HfscaleError(f"--token_budget must be positive, got {self.token_budget}")


def _split_tensorboard(report_to) -> tuple[bool, list[str] | str]:
    """hfscale writes TensorBoard itself (clean scalar names, one event stream per run directory)."""
    backends = [report_to] if isinstance(report_to, str) else list(report_to or [])
    backends = [b for part in backends for b in part.split(",") if b]
    tensorboard = "tensorboard" in backends or "all" in backends
    others = [b for b in backends if b not in ("tensorboard", "none")]
    return tensorboard, others or "none"


class HfscaleArgumentParser(HfArgumentParser):
    """HfArgumentParser whose errors are one line (argparse would print the whole usage of ~150 flags first)."""

    def error(self, message):
        raise HfscaleError(message)


def parse_args(argv: list[str] | None = None):
    parser = HfscaleArgumentParser((ModelArguments, DataArguments, HfscaleTrainingArguments))
    parser.prog = "hfscale train"
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 1 and argv[0].endswith((".json", ".yaml", ".yml")):
        path = Path(argv[0])
        if not path.is_file():
            raise HfscaleError(f"{path}: file not found")
        data = load_json(path) if path.suffix == ".json" else load_yaml(path)
        try:
            return parser.parse_dict(data, allow_extra_keys=False)
        except (ValueError, TypeError) as err:
            raise HfscaleError(f"{path}: {' '.join(str(err).split())}") from None
    try:
        return parser.parse_args_into_dataclasses(args=argv)
    except ValueError as err:  # e.g. "Some specified arguments are not used by the HfArgumentParser: [...]"
        raise HfscaleError(" ".join(str(err).split())) from None
