"""The per-run results file (results.json): its typed schema, shared by every writer and reader, written atomically so a
crash never leaves half a file.

Writers: a training run (train.py through RunRecord), a sweep's row for a run that never started
(compare/sweep.py), an imported Megatron log (compare/megatron.py). Readers: report, parity, project, tune, the run
summary. All of them go through `Results`; the JSON is documented key by key in docs/results.md. Keys a reader does
not know (a newer writer's) are kept in `extra` and written back unchanged.
"""

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import get_args

from ..errors import HfscaleError
from ..files import atomic_write_text
from ..formulas.metrics import GB, ModelShape

SCHEMA_VERSION = 2
# Schema 1 named the batch and recomputation as hfscale 0.1 did; schema 2 as the Trainer's flags do. A schema-1 file
# (an earlier run's) is read with its keys renamed, and written back (report, sweep) as schema 2.
SCHEMA_1_CONFIG = {"micro_batch_size": "per_device_train_batch_size", "grad_accum": "gradient_accumulation_steps",
                   "checkpointing": "activation_checkpointing"}
RESULTS_FILE = "results.json"


class _Section:
    """A dataclass read from / written to one JSON object; keys it does not declare go to `extra`, and back."""

    POSITIVE: tuple[str, ...] = ()  # declared numbers that are sizes or measured rates: > 0 and finite where given

    @classmethod
    def from_dict(cls, data: dict | None):
        """Raises TypeError naming the key when a declared key holds the wrong kind of JSON value (a reader would
        fail on it later, with a traceback)."""
        data = dict(data or {})
        known = {f.name for f in fields(cls)} - {"extra"}
        values = {k: data.pop(k) for k in list(data) if k in known}
        for f in fields(cls):
            if f.name not in values:
                continue
            nested = isinstance(f.default_factory, type) and issubclass(f.default_factory, _Section)
            if nested and isinstance(values[f.name], (dict, type(None))):
                try:
                    values[f.name] = f.default_factory.from_dict(values[f.name])
                except TypeError as err:
                    raise TypeError(f"{f.name}.{err}") from None
            elif nested or not _json_fits(values[f.name], f.type):
                raise TypeError(f"{f.name} is {json.dumps(values[f.name])[:40]}, not {_json_kind(f.type)}")
        for name in cls.POSITIVE:  # a negative speed or a zero world size: a report would plot or divide by it
            value = values.get(name)
            if isinstance(value, _NUMBER) and not 0 < value < math.inf:
                raise TypeError(f"{name} is {json.dumps(value)}, not a positive number")
        return cls(**values, extra=data)

    def to_dict(self) -> dict:
        out = {}
        for f in fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if isinstance(value, _Section) else value
        return {**out, **self.extra}


_NUMBER = (int, float)


def _json_fits(value, annotation) -> bool:
    """Whether a JSON value fits a declared type: null where None is allowed, a number (not a boolean) for int and
    float, the container or string itself otherwise; `object` takes anything."""
    allowed = get_args(annotation) or (annotation,)
    if annotation is object or (value is None and type(None) in allowed):
        return True
    if isinstance(value, bool):
        return bool in allowed
    if isinstance(value, _NUMBER) and (int in allowed or float in allowed):
        return True
    return any(isinstance(value, t) for t in allowed if t in (str, dict, list))


def _json_kind(annotation) -> str:
    names = {int: "a number", float: "a number", str: "a string", dict: "an object", list: "a list", bool: "a boolean",
             type(None): "null"}
    return " or ".join(dict.fromkeys(names.get(t, "an object") for t in (get_args(annotation) or (annotation,))))


@dataclass
class ModelRecord(_Section):
    name: str | None = None
    family: str | None = None  # a registered family (models.FAMILIES): gpt2, bloom, llama, ...
    n_layer: int | None = None
    hidden: int | None = None
    n_head: int | None = None
    n_kv_head: int | None = None  # key/value heads (null in files of earlier runs: one per query head)
    tied: bool | None = None  # the LM head is the word embedding (null: the family's default)
    rope_theta: float | None = None
    head_dim: int | None = None  # a head's width where the model sets its own (Qwen3, Mistral-Nemo; null: h / heads)
    sliding_window: int | None = None  # its windowed layers' span where the model sets its own (null: the family's)
    vocab: int | None = None
    positions: int | None = None
    ffn: int | None = None
    ffn_size: int | None = None
    params_formula: int | None = None
    params_bigscience: int | None = None
    params_model: int | None = None  # sum of numel: the report's Size
    params_trainable: int | None = None
    dropout: float | None = None  # the model's largest dropout probability (null in files of earlier runs: 0)
    extra: dict = field(default_factory=dict)

    def shape(self) -> ModelShape:
        missing = [k for k in ("family", "n_layer", "hidden", "n_head", "vocab", "positions") if getattr(self, k) is None]
        if missing:
            raise HfscaleError(f"the results file does not describe the model's shape (no {', '.join(missing)})")
        return ModelShape(self.family, self.n_layer, self.hidden, self.n_head, self.vocab, self.positions, self.ffn,
                          self.n_kv_head, self.tied, self.rope_theta, self.head_dim, self.sliding_window)


@dataclass
class ConfigRecord(_Section):
    world_size: int | None = None
    per_device_train_batch_size: int | None = None  # MBS
    gradient_accumulation_steps: int | None = None  # GAS
    global_batch_size: int | None = None  # samples: MBS x GAS x DP
    seq_len: int | None = None
    activation_checkpointing: bool | None = None
    precision: str | None = None  # what the run computes in (bf16 outside the float8 matmuls of an --fp8 run)
    float8: str | None = None  # --fp8: the torchao recipe of the blocks' float8 matmuls (run/float8.py)
    max_steps: int | None = None
    seed: int | None = None
    learning_rate: float | None = None
    recipe: dict | None = None
    token_budget: float | None = None
    dataset: object = None
    validation: dict | None = None
    powersgd_rank: int | None = None
    powersgd_warmup_steps: int | None = None
    torch_compile: bool | None = None
    fused_linear_cross_entropy: bool | None = None
    sync_each_batch: bool | None = None  # accelerate's: gradients reduced every micro-batch (null before: no_sync)
    zero_optimization: dict | None = None  # a ZeRO run's DeepSpeed JSON block, as given ("auto" kept): its buckets
    dp: int | None = None  # Megatron logs and hfscale's TP runs: data-, tensor- and pipeline-parallel degrees
    tp: int | None = None
    pp: int | None = None
    extra: dict = field(default_factory=dict)
    POSITIVE = ("world_size", "per_device_train_batch_size", "gradient_accumulation_steps", "global_batch_size", "seq_len",
                "dp", "tp", "pp")


@dataclass
class EnvironmentRecord(_Section):
    versions: dict = field(default_factory=dict)
    hostname: str | None = None
    device_type: str | None = None  # cuda | cpu: the route the run took
    device_name: str | None = None
    device_count: int | None = None
    world_size: int | None = None
    processes_per_node: int | None = None
    nodes: int | None = None
    cpu_threads_per_process: int | None = None  # torch's intra-op threads (OMP_NUM_THREADS; run/launcher.py)
    extra: dict = field(default_factory=dict)


@dataclass
class PerfRecord(_Section):
    s_per_iter: float | None = None
    tokens_per_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    samples_per_s: float | None = None
    tflops_per_gpu_bigscience: float | None = None
    tflops_per_gpu_model: float | None = None
    tflops_per_gpu_hardware: float | None = None
    mfu: float | None = None
    hfu: float | None = None
    days_to_budget: float | None = None
    gpu_days_to_budget: float | None = None
    tokens_per_step: int | None = None
    measured_steps: int | None = None
    warmup_steps: int | None = None
    peak_tflops: float | None = None
    peak_source: str | None = None
    measured_peak_tflops: float | None = None
    peak_tflops_fp8: float | None = None  # an --fp8 run's GPU: its float8 peak, beside the bf16 one MFU is against
    gc: dict | None = None  # Python's garbage collector: run/callbacks.py's GarbageCollectionCallback
    extra: dict = field(default_factory=dict)
    POSITIVE = ("s_per_iter", "tokens_per_s", "tokens_per_s_per_gpu", "samples_per_s", "tflops_per_gpu_bigscience",
                "tflops_per_gpu_model", "tflops_per_gpu_hardware", "mfu", "hfu", "days_to_budget",
                "gpu_days_to_budget", "tokens_per_step", "peak_tflops", "measured_peak_tflops")


@dataclass
class MemoryRecord(_Section):
    peak_rss_gb: float | None = None
    peak_allocated_gb: float | None = None  # CUDA only
    peak_reserved_gb: float | None = None
    model_states_per_rank: list | None = None
    gradients_accumulating_per_rank: list | None = None
    step_per_rank: list | None = None
    build_peak_bytes_per_rank: list | None = None
    construction_peak_bytes_per_rank: list | None = None
    extra: dict = field(default_factory=dict)

    @property
    def peak_gb(self) -> float | None:
        """The peak a report shows: device memory where the run had a GPU, else the host process's."""
        return self.peak_allocated_gb if self.peak_allocated_gb is not None else self.peak_rss_gb


@dataclass
class Results(_Section):
    status: str = "running"  # running | ok | stopped | fail | refused | OOM | timeout
    error: str | None = None
    run_name: str | None = None
    output_dir: str | None = None
    strategy: str | None = None
    optim: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    model: ModelRecord = field(default_factory=ModelRecord)
    config: ConfigRecord = field(default_factory=ConfigRecord)
    environment: EnvironmentRecord = field(default_factory=EnvironmentRecord)
    strategy_check: dict = field(default_factory=dict)
    perf: PerfRecord = field(default_factory=PerfRecord)
    memory: MemoryRecord = field(default_factory=MemoryRecord)
    estimate: dict = field(default_factory=dict)
    loss_history: list = field(default_factory=list)
    eval_history: list = field(default_factory=list)
    perf_history: list = field(default_factory=list)
    checkpoints: list = field(default_factory=list)
    resumed_from: str | None = None
    stopped: dict | None = None  # status "stopped": {"signal", "step", "checkpoint"} (run/stopping.py)
    steps: int | None = None
    epoch: float | None = None
    samples_seen: int | None = None
    tokens_fed: dict | None = None  # {"steps", "per_rank": input tokens each rank's loader handed it, "tp_rank"}
    trainer_metrics: dict = field(default_factory=dict)
    final_weights: dict | None = None
    probe_logits: list | None = None
    batch_digests: list | None = None
    profile: dict | None = None  # --profile_step: {"step", "trace", "wall_s", "host_top", [device_busy_s, device_idle_share, device_top]} (rank 0's)
    host_syncs: dict | None = None  # --count_host_syncs: {"steps": [{"step", "reads", "sites": {site: reads}}]} (rank 0's)
    communication: dict | None = None  # --count_collectives: {"step", "per_rank": [[{kind, dtype, elements, bytes, count}]]}
    source: str | None = None  # "megatron-log" for an imported log
    log_file: str | None = None
    log_tail: str | None = None  # a sweep's failed run: the end of its log
    sweep: dict | None = None  # a sweep's {wall_s, nproc, repeat (--repeats: the k-th run of its configuration)}
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def states_and_step(self) -> "StatesAndStep":
        """Model states and the step's peak above them, estimated and measured, on the rank that holds the most: the
        like-for-like pair (a process's RSS or the allocator's peak also counts the runtime, the interpreter and the
        libraries, which the estimate's states and step leave out)."""
        est, ranks = self.estimate or {}, [r for r in self.memory.model_states_per_rank or [] if r]
        steps = [r for r in self.memory.step_per_rank or [] if r]
        return StatesAndStep(
            estimated_states=est.get("model_states", 0) + est.get("host_offload", 0) if est else None,
            measured_states=max((sum(v or 0 for v in r.values()) for r in ranks), default=None),
            estimated_step=est.get("step_peak", est.get("activation_peak")) if est else None,
            measured_step=max((r["step_delta_gb"] * GB for r in steps), default=None),
            first_step_only=bool(steps) and all(r.get("first_steps_only") for r in steps),
            follows_tensors=all(r.get("follows_tensors", True) for r in steps))

    def to_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, **super().to_dict()}

    @classmethod
    def from_dict(cls, data: dict):
        data = dict(data)
        version = data.pop("schema_version", SCHEMA_VERSION)
        if version == 1 and isinstance(data.get("config"), dict):
            data["config"] = {SCHEMA_1_CONFIG.get(k, k): v for k, v in data["config"].items()}
        elif version != SCHEMA_VERSION:
            raise HfscaleError(f"results schema version {version}; this hfscale reads versions 1 and {SCHEMA_VERSION}")
        results = super().from_dict(data)
        for name in HISTORIES:
            for entry in getattr(results, name):
                if not isinstance(entry, dict):
                    raise TypeError(f"{name} holds {json.dumps(entry)[:40]}, not an object")
                bad = next((k for k in HISTORY_NUMBERS if not _json_fits(entry.get(k), float | None)), None)
                if bad:
                    raise TypeError(f"{name} entry's {bad} is {json.dumps(entry[bad])[:40]}, not a number")
        return results


@dataclass(frozen=True)
class StatesAndStep:
    """Bytes per rank (Results.states_and_step); None where the run did not record it."""
    estimated_states: float | None
    measured_states: float | None
    estimated_step: float | None
    measured_step: float | None
    first_step_only: bool  # the run's only step created the gradients and optimizer states: its step is not one
    follows_tensors: bool = True  # False: a CPU process's resident set with glibc's heap reuse in it

    @property
    def estimated(self) -> float | None:
        return None if None in (self.estimated_states, self.estimated_step) else self.estimated_states + self.estimated_step

    @property
    def measured(self) -> float | None:
        if self.first_step_only or None in (self.measured_states, self.measured_step):
            return None
        return self.measured_states + self.measured_step


HISTORIES = ("loss_history", "eval_history", "perf_history", "checkpoints")
HISTORY_NUMBERS = ("step", "loss", "grad_norm", "lr", "tokens", "elapsed_s", "perplexity", "save_s", "size_gb")


def write_results(output_dir: Path, results: Results) -> Path:
    path = Path(output_dir) / RESULTS_FILE
    atomic_write_text(path, json.dumps(results.to_dict(), indent=2, default=str) + "\n")
    return path


def refuse_finished_run(output_dir, overwrite: bool, resuming: bool) -> None:
    """A finished run's results are not overwritten unless asked (--overwrite_output_dir)."""
    existing = Path(output_dir) / RESULTS_FILE
    if existing.is_file() and read_results(existing).status == "ok" and not overwrite:
        further = (" (with --resume_from_checkpoint: to train on from its last checkpoint, e.g. to a larger "
                   "--max_steps)") if resuming else ""
        raise HfscaleError(f"{output_dir} already holds the results of a finished run; choose another "
                           f"--output_dir or pass --overwrite_output_dir{further}")


def read_results(path: Path) -> Results:
    """A results file (or a run directory holding one), typed. Malformed JSON or not an object: HfscaleError."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    if not path.is_file():
        raise HfscaleError(f"{path}: file not found")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise HfscaleError(f"{path}: not a results file (malformed JSON: {err})") from None
    if not isinstance(data, dict) or "status" not in data:
        raise HfscaleError(f"{path}: not a results file (no status)")
    try:
        return Results.from_dict(data)
    except TypeError as err:  # a section that is not an object
        raise HfscaleError(f"{path}: not a results file ({err})") from None
    except HfscaleError as err:  # another schema version
        raise HfscaleError(f"{path}: {err}") from None


class RunRecord:
    """The results of one run, kept in memory and flushed atomically (main process only) at each milestone."""

    def __init__(self, output_dir: Path, results: Results, is_main: bool):
        self.output_dir, self.is_main = Path(output_dir), is_main
        self.results = results

    def add_loss(self, step: int, logs: dict) -> None:
        self.results.loss_history.append(
            {"step": step, "loss": logs.get("loss"), "grad_norm": logs.get("grad_norm"), "lr": logs.get("learning_rate"),
             "tokens": logs.get("tokens"), "elapsed_s": logs.get("elapsed_s"),
             **({"tokens_counted": logs["num_input_tokens_seen"]} if "num_input_tokens_seen" in logs else {})}
        )

    def add_eval(self, step: int, logs: dict) -> None:
        self.results.eval_history.append(
            {"step": step, "loss": logs["eval_loss"], "perplexity": logs.get("eval_perplexity"),
             "tokens": logs.get("tokens"), "elapsed_s": logs.get("elapsed_s")})

    def note_checkpoint(self, step: int, save_s: float | None = None, size_gb: float | None = None) -> None:
        self.results.checkpoints.append({"step": step, "save_s": save_s, "size_gb": size_gb})
        self.flush()

    def update(self, **values) -> None:
        """Set top-level fields of the results (a key the schema does not declare is kept in `extra`)."""
        declared = {f.name for f in fields(Results)}
        for name, value in values.items():
            if name in declared:
                setattr(self.results, name, value)
            else:
                self.results.extra[name] = value

    def flush(self) -> None:
        if self.is_main:
            write_results(self.output_dir, self.results)
