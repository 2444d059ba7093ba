"""`hfscale estimate`: memory per GPU before launch, for one configuration or a table over every choice.

    hfscale estimate --model bloom-7b1 --strategy all --optim adamw --gpus 32 --gpus_per_node 8 \\
        --device A100-80GB --bf16 --per_device_train_batch_size 2 --seq_len 2048 --activation_checkpointing

Each row: parameters, gradients, fp32 masters, optimizer states, activations (the step's peak), communication
buffers and the runtime allowance per GPU; host RAM per node (offloaded states, model construction); fits or not;
the largest micro-batch that fits. The formulas are hfscale/formulas/memory.py; docs/estimate.md says what each
term is, where its constants come from and how far it was checked.
"""

import json
from dataclasses import dataclass

from ..errors import ArgumentParser, HfscaleError, one_of
from ..formulas.memory import GB, max_micro_batch, rank_memory, construction_host_bytes
from ..formulas.metrics import ModelShape, param_count, size_label

ALL = "all"
ATTENTION = ("eager", "sdpa", "flash_attention_2")


@dataclass
class Row:
    strategy: str
    optim: str
    micro_batch: int
    refused: str | None = None
    memory: dict | None = None  # RankMemory.as_dict(), bytes
    host_per_node: int | None = None
    construction_per_node: int | None = None  # host RAM of the busiest node while the model is built and sharded
    construction_per_node_full_copies: int | None = None  # the same if every process built a whole fp32 copy
    fits: bool | None = None
    max_micro_batch: int | None = None


def _positive(name: str, value) -> None:
    if value is not None and not value > 0:
        raise HfscaleError(f"--{name} must be positive, got {value}")


MODEL_OVERRIDES = ("n_layer", "hidden_size", "n_head", "ffn_hidden_size", "vocab_size")


def add_model_flags(p: ArgumentParser) -> None:
    """The model flags of hfscale's planning commands, named as the training flags are."""
    from ..run.models import PRESETS

    p.add_argument("--model", default="tiny", help=f"preset: {', '.join(PRESETS)}")
    p.add_argument("--model_name_or_path", help="a local model directory (its config.json is read)")
    for flag in MODEL_OVERRIDES:
        p.add_argument(f"--{flag}", type=int, help="override the preset's")


def model_flags(opts) -> list[str]:
    """The same model as training flags (for the runs hfscale tune launches)."""
    if opts.model_name_or_path:
        return ["--model_name_or_path", opts.model_name_or_path]
    out = ["--model", opts.model]
    for flag in MODEL_OVERRIDES:
        if getattr(opts, flag) is not None:
            out += [f"--{flag}", str(getattr(opts, flag))]
    return out


def build_parser() -> ArgumentParser:
    from ..formulas.peaks import DEVICES

    p = ArgumentParser(prog="hfscale estimate", allow_abbrev=False,
                       description="Memory per GPU (and host RAM per node) before launch, per strategy x optimizer x "
                                   "micro-batch; `all` for any of the three gives a table.")
    add_model_flags(p)
    p.add_argument("--strategy", default=ALL, help="a strategy name or `all` (default)")
    p.add_argument("--optim", default="adamw", help="adamw, adafactor, adamw_8bit or `all`")
    p.add_argument("--per_device_train_batch_size", default="1", help="micro-batch per GPU, or `all` (1, 2, 4, ...)")
    p.add_argument("--seq_len", type=int, help="tokens per sample (default: the model's positions, at most 1024)")
    p.add_argument("--gradient_accumulation_steps", type=int, default=1,
                   help="micro-batches per step (default 1); above 1 fsdp* holds whole gradients between them")
    p.add_argument("--activation_checkpointing", action="store_true")
    p.add_argument("--attn_implementation", default="sdpa", help=f"{', '.join(ATTENTION)} (default sdpa)")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--gpus", type=int, default=8, help="GPUs in all (data-parallel degree), default 8")
    p.add_argument("--gpus_per_node", type=int, default=8)
    p.add_argument("--device", default="A100-80GB", help=f"{', '.join(DEVICES)} (memory per GPU)")
    p.add_argument("--device_memory_gb", type=float, help="memory per GPU in GB instead of a --device name")
    p.add_argument("--host_memory_gb", type=float, help="host RAM per node in GB: also judge offload/construction")
    p.add_argument("--json", action="store_true", help="JSON instead of the table")
    return p


def model_shape(opts) -> ModelShape:
    from ..run.models import pretrained_shape, resolve_shape

    if opts.model_name_or_path:
        return pretrained_shape(opts.model_name_or_path)
    return resolve_shape(opts.model, opts.n_layer, opts.hidden_size, opts.n_head, opts.ffn_hidden_size, opts.vocab_size)


def choices(value: str, valid, kind: str) -> list[str]:
    if value == ALL:
        return list(valid)
    names = [v.strip() for v in value.split(",") if v.strip()]
    for name in names:
        if name not in valid:
            raise one_of(kind, name, [*valid, ALL])
    return names


def micro_batches(value: str) -> list[int] | None:
    """None means `all`: every power of two up to the largest that fits."""
    if value == ALL:
        return None
    try:
        sizes = [int(v) for v in value.split(",")]
    except ValueError:
        raise HfscaleError(f"--per_device_train_batch_size must be integers or `all`, got {value!r}") from None
    if any(s <= 0 for s in sizes):
        raise HfscaleError(f"--per_device_train_batch_size must be positive, got {value}")
    return sizes


def device_memory_bytes(device: str, device_memory_gb: float | None) -> float:
    """Memory per GPU: --device_memory_gb, else the --device name's."""
    from ..formulas.peaks import DEVICES, device_memory_gb as memory_of

    _positive("device_memory_gb", device_memory_gb)
    if device_memory_gb is not None:
        return device_memory_gb * GB
    try:
        return memory_of(device) * GB
    except KeyError:
        raise one_of("device", device, DEVICES) from None


def check_attention(attention: str) -> None:
    if attention not in ATTENTION:
        raise one_of("attention implementation", attention, ATTENTION)


def check(opts, shape: ModelShape) -> tuple[int, float]:
    """(seq_len, device memory in bytes) after every check of the numbers."""
    from ..run.models import resolve_seq_len
    from .project import check_whole_nodes

    for name in ("gpus", "gpus_per_node", "seq_len", "host_memory_gb", "gradient_accumulation_steps"):
        _positive(name, getattr(opts, name))
    check_whole_nodes([opts.gpus], opts.gpus_per_node)
    check_attention(opts.attn_implementation)
    if opts.bf16 and opts.fp16:
        raise HfscaleError("--bf16 and --fp16 are exclusive")
    return resolve_seq_len(shape, opts.seq_len), device_memory_bytes(opts.device, opts.device_memory_gb)


def estimate_rows(opts) -> tuple[ModelShape, int, float, list[Row]]:
    from ..parallel.strategies import OPTIMIZERS, all_strategies, incompatibility, layout_refusal, memory_layout

    shape = model_shape(opts)
    seq, device_bytes = check(opts, shape)
    strategies = choices(opts.strategy, all_strategies(), "strategy")
    optims = choices(opts.optim, OPTIMIZERS, "optimizer")
    sizes = micro_batches(opts.per_device_train_batch_size)
    precision = "bf16" if opts.bf16 else "fp16" if opts.fp16 else "fp32"
    per_node = min(opts.gpus, opts.gpus_per_node)
    rows = []
    for name in strategies:
        strategy = all_strategies()[name]
        layout = memory_layout(strategy, shape.hidden)
        for optim in optims:
            reason = incompatibility(name, optim) or layout_refusal(strategy, opts.gpus, per_node)
            if reason:
                rows.append(Row(name, optim, 0, refused=reason))
                continue

            shard_ranks = strategy.shard_ranks(opts.gpus, per_node)
            build = construction_host_bytes(shape, per_node, strategy.rank0_builds, shard_ranks)

            def memory(b: int):
                return rank_memory(shape, layout, optim=optim, precision=precision, ranks=shard_ranks, micro_batch=b,
                                   seq=seq, checkpointing=opts.activation_checkpointing,
                                   attention=opts.attn_implementation, grad_accum=opts.gradient_accumulation_steps)

            def host(mem) -> int:
                return per_node * mem.host_offload + build

            def fits(b: int) -> bool:
                mem = memory(b)
                host_ok = opts.host_memory_gb is None or host(mem) <= opts.host_memory_gb * GB
                return mem.device_total <= device_bytes and host_ok

            best = max_micro_batch(fits)
            for b in sizes or [2 ** k for k in range(max(best.bit_length(), 1))]:
                mem = memory(b)
                rows.append(Row(name, optim, b, memory=mem.as_dict(), host_per_node=host(mem), fits=fits(b),
                                max_micro_batch=best, construction_per_node=build,
                                construction_per_node_full_copies=construction_host_bytes(shape, per_node, False, 1)))
    return shape, seq, device_bytes, rows


COLUMNS = ["strategy", "optim", "MBS", "params", "grads", "master", "optim states", "activations", "comm buf",
           "total/GPU", "host/node", "fits", "max MBS"]


def _gb(x) -> str:
    return f"{x / GB:.2f}"


def table(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        if r.refused:
            lines.append(f"| {r.strategy} | {r.optim} | | | | | | | | | | refused | |")
            continue
        m = r.memory
        lines.append("| " + " | ".join([
            r.strategy, r.optim, str(r.micro_batch), _gb(m["parameters"]), _gb(m["gradients"]), _gb(m["master_weights"]),
            _gb(m["optimizer_states"]), _gb(m["activation_peak"]), _gb(m["comm_buffers"]), _gb(m["device_total"]),
            _gb(r.host_per_node), "yes" if r.fits else "**no**", str(r.max_micro_batch)]) + " |")
    return "\n".join(lines) + "\n"


def assumptions(opts, shape: ModelShape, seq: int, device_bytes: float) -> list[str]:
    from ..formulas.memory import FRAGMENTATION, RUNTIME_ALLOWANCE_BYTES

    precision = "bf16" if opts.bf16 else "fp16" if opts.fp16 else "fp32"
    return [
        f"model {opts.model_name_or_path or opts.model}: {size_label(param_count(shape))} parameters "
        f"({param_count(shape):,}), {shape.n_layer} layers, hidden {shape.hidden}, vocab {shape.vocab}",
        f"{opts.gpus} GPUs ({min(opts.gpus, opts.gpus_per_node)} per node) of {device_bytes / GB:g} GB, seq {seq}, "
        f"{precision}, {opts.attn_implementation} attention, activation checkpointing "
        f"{'on' if opts.activation_checkpointing else 'off'}",
        f"total/GPU = (model states + activation peak + comm buffers) x {1 + FRAGMENTATION:g} (allocator "
        f"fragmentation) + {RUNTIME_ALLOWANCE_BYTES / GB:g} GB (CUDA context, workspaces); GB = 1e9 bytes",
        "host/node = offloaded states of every GPU on the node + building the model: one full fp32 copy per process, "
        "except fsdp* (rank 0 builds it and shards it out: one copy + a shard per other process; docs/estimate.md)",
        "not modelled: tensor/pipeline parallelism, CUDA-graph pools, evaluation, dataloader workers (docs/estimate.md)",
    ]


def main(argv: list[str]) -> None:
    opts = build_parser().parse_args(argv)
    shape, seq, device_bytes, rows = estimate_rows(opts)
    notes = assumptions(opts, shape, seq, device_bytes)
    if opts.json:
        print(json.dumps({"assumptions": notes, "device_memory_bytes": device_bytes,
                          "rows": [r.__dict__ for r in rows]}, indent=2))
        return
    print(table(rows))
    refused = sorted({f"{r.strategy} x {r.optim}: {r.refused}" for r in rows if r.refused})
    for line in notes + [f"refused {x}" for x in refused]:
        print(f"- {line}")
