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

from ..errors import ArgumentParser
from ..flags import ALL, comma_list, positive, refuse_renamed
from ..formulas.activations import window_caveat
from ..formulas.memory import FRAGMENTATION, RUNTIME_ALLOWANCE_BYTES, construction_host_bytes, max_micro_batch
from ..formulas.metrics import GB, ModelShape, param_count, size_label
from ..formulas.peaks import DEVICES
from ..models import resolve_seq_len
from .options import (ATTENTION, SYNC_EACH_BATCH_HELP, add_grid_flags, add_model_flags, add_precision_flags, base_plan,
                      check_attention, check_grid_flags, check_whole_nodes, device_memory_bytes, dropout_of, fit,
                      grid_plan, optimizers_option, float8_of, grid_options, precision_from_options, shape_from_options,
                      strategies_and_families)


@dataclass
class Row:
    strategy: str
    optim: str
    per_device_train_batch_size: int
    refused: str | None = None
    memory: dict | None = None  # RankMemory.as_dict(), bytes
    host_per_node: int | None = None
    construction_per_node: int | None = None  # host RAM of the busiest node while the model is built and sharded
    construction_per_node_full_copies: int | None = None  # the same if every process built a whole fp32 copy
    fits: bool | None = None
    max_per_device_train_batch_size: int | None = None


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="hfscale estimate", allow_abbrev=False,
                       description="Memory per GPU (and host RAM per node) before launch, per strategy x optimizer x "
                                   "micro-batch; `all` (or a comma-separated list) for any of the three gives a table.")
    add_model_flags(p)
    p.add_argument("--strategy", default=ALL, help="strategy names, comma-separated, or `all` (default); megatron and "
                   "megatron-deepspeed (ZeRO-1 over DP) are the 3D layouts --tp/--pp describe (`all` includes them "
                   "when --tp or --pp is given)")
    p.add_argument("--optim", default="adamw", help="adamw, adafactor, adamw_8bit (comma-separated) or `all`")
    p.add_argument("--per_device_train_batch_size", default="1", help="micro-batch per GPU: comma-separated, or `all` "
                   "(1, 2, 4, ... up to the largest that fits)")
    p.add_argument("--seq_len", type=int, help="tokens per sample (default: the model's positions, at most 1024)")
    p.add_argument("--gradient_accumulation_steps", type=int, default=1,
                   help="micro-batches per step (default 1); above 1 fsdp* holds whole gradients between them "
                        "(unless --sync_each_batch)")
    p.add_argument("--sync_each_batch", action="store_true", help=SYNC_EACH_BATCH_HELP)
    p.add_argument("--activation_checkpointing", action="store_true")
    p.add_argument("--attn_implementation", default="sdpa", help=f"{', '.join(ATTENTION)} (default sdpa)")
    add_precision_flags(p)
    add_grid_flags(p)
    p.add_argument("--gpus", type=int, default=8, help="GPUs in all (TP x PP x DP), default 8")
    p.add_argument("--gpus_per_node", type=int, default=8)
    p.add_argument("--device", default="A100-80GB", help=f"{', '.join(DEVICES)} (memory per GPU)")
    p.add_argument("--device_memory_gb", type=float, help="memory per GPU in GB instead of a --device name")
    p.add_argument("--host_memory_gb", type=float, help="host RAM per node in GB: also judge offload/construction")
    p.add_argument("--json", action="store_true", help="JSON instead of the table")
    return p


def micro_batches(value: str) -> list[int] | None:
    """None means `all`: every power of two up to the largest that fits."""
    return None if value == ALL else comma_list(value, "--per_device_train_batch_size", int)


def estimate_rows(opts) -> tuple[ModelShape, int, float, list[Row]]:
    shape = shape_from_options(opts)
    positive(opts, "gpus", "gpus_per_node", "seq_len", "host_memory_gb", "gradient_accumulation_steps")
    check_whole_nodes([opts.gpus], opts.gpus_per_node)
    check_attention(opts.attn_implementation)
    device_bytes = device_memory_bytes(opts.device, opts.device_memory_gb)
    host_bytes = opts.host_memory_gb * GB if opts.host_memory_gb else None
    strategies, families = strategies_and_families(opts.strategy, with_3d=bool(opts.tp or opts.pp or opts.cp))
    check_grid_flags(opts, families, opts.activation_checkpointing)
    optimizers = optimizers_option(opts.optim)
    sizes = micro_batches(opts.per_device_train_batch_size)
    per_node = min(opts.gpus, opts.gpus_per_node)
    rows, seq = [], None
    if families:
        rows += grid_rows(opts, shape, families, optimizers, sizes, device_bytes)
        seq = resolve_seq_len(shape, opts.seq_len)
    for strategy in strategies:
        for optimizer in optimizers:
            plan = base_plan(opts, strategy, optimizer, world_size=opts.gpus, processes_per_node=per_node,
                             gradient_accumulation_steps=opts.gradient_accumulation_steps, shape=shape)
            seq = plan.seq_len
            reason = plan.refusal()
            if reason:
                rows.append(Row(strategy.name, optimizer.name, 0, refused=reason))
                continue
            best = max_micro_batch(lambda b: fit(plan.but(per_device_train_batch_size=b), device_bytes, host_bytes).fits)
            for b in sizes or [2 ** k for k in range(max(best.bit_length(), 1))]:
                sized = plan.but(per_device_train_batch_size=b)
                mem = sized.memory()
                verdict = fit(sized, device_bytes, host_bytes, mem)
                rows.append(Row(strategy.name, optimizer.name, b, memory=mem.as_dict(),
                                host_per_node=verdict.host_per_node, fits=verdict.fits, max_per_device_train_batch_size=best,
                                construction_per_node=plan.construction_per_node,
                                construction_per_node_full_copies=construction_host_bytes(shape, per_node, False, 1)))
    return shape, seq, device_bytes, rows


def grid_rows(opts, shape: ModelShape, families: list[str], optimizers: list, sizes: list[int] | None,
              device_bytes: float) -> list[Row]:
    """The rows of the 3D layouts: every family x optimizer x (TP, PP, CP) x micro-batch."""
    tps = comma_list(opts.tp or "1", "--tp", int)
    pps = comma_list(opts.pp or "1", "--pp", int)
    cps = comma_list(opts.cp or "1", "--cp", int)
    rows = []
    for family in families:
        for optimizer in optimizers:
            for tp, pp, cp in ((t, p, c) for t in tps for p in pps for c in cps):
                plan = grid_plan(opts, family, optimizer.name, tp=tp, pp=pp, gpus=opts.gpus,
                                 gpus_per_node=opts.gpus_per_node, per_device_train_batch_size=1,
                                 gradient_accumulation_steps=opts.gradient_accumulation_steps, shape=shape, cp=cp)
                product = " x ".join(["TP", "PP"] + (["CP"] if cp > 1 else []))
                reason = (f"{product} = {tp * pp * cp} does not divide --gpus {opts.gpus}"
                          if opts.gpus % (tp * pp * cp) else plan.refusal())
                if reason:
                    rows.append(Row(plan.name, optimizer.name, 0, refused=reason))
                    continue
                best = max_micro_batch(lambda b: fit(plan.but(per_device_train_batch_size=b), device_bytes).fits)
                for b in sizes or [2 ** k for k in range(max(best.bit_length(), 1))]:
                    sized = plan.but(per_device_train_batch_size=b)
                    mem = sized.memory()
                    verdict = fit(sized, device_bytes, None, mem)
                    rows.append(Row(plan.name, optimizer.name, b, memory=mem.as_dict(), host_per_node=0,
                                    fits=verdict.fits, max_per_device_train_batch_size=best, construction_per_node=0,
                                    construction_per_node_full_copies=0))
    return rows


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
            r.strategy, r.optim, str(r.per_device_train_batch_size), _gb(m["parameters"]), _gb(m["gradients"]), _gb(m["master_weights"]),
            _gb(m["optimizer_states"]), _gb(m["activation_peak"]), _gb(m["comm_buffers"]), _gb(m["device_total"]),
            _gb(r.host_per_node), "yes" if r.fits else "**no**", str(r.max_per_device_train_batch_size)]) + " |")
    return "\n".join(lines) + "\n"


def heads_label(shape: ModelShape) -> str:
    """The attention's heads as a model card states them: 32 heads (8 key/value), and their width where it is not
    hidden / heads - the query projection's then too (Mistral-Nemo: 32 heads of 128, queries 4096 wide on 5120)."""
    apart = shape.q_hidden != shape.hidden
    notes = [*([f"{shape.kv_heads} key/value"] if shape.kv_heads != shape.n_head else []),
             *([f"queries {shape.q_hidden} wide"] if apart else [])]
    label = f"{shape.n_head} heads" + (f" of {shape.head_size}" if apart else "")
    return label + (" (" + "; ".join(notes) + ")" if notes else "")


def assumptions(opts, shape: ModelShape, seq: int, device_bytes: float) -> list[str]:
    precision = precision_from_options(opts)
    recipe = float8_of(opts)
    precision = f"fp8 ({recipe}: the blocks' linear layers; bf16 elsewhere)" if recipe else precision
    return [
        f"model {opts.model_name_or_path or opts.model}: {size_label(param_count(shape))} parameters "
        f"({param_count(shape):,}), {shape.n_layer} layers, hidden {shape.hidden}, {heads_label(shape)}, "
        f"vocab {shape.vocab}",
        f"{opts.gpus} GPUs ({min(opts.gpus, opts.gpus_per_node)} per node) of {device_bytes / GB:g} GB, seq {seq}, "
        f"{precision}{', compiled' if opts.torch_compile else ''}"
        f"{', fused linear cross-entropy' if opts.fused_linear_cross_entropy else ''}, {opts.attn_implementation} "
        f"attention, activation "
        f"checkpointing {'on' if opts.activation_checkpointing else 'off'}"
        f"{', dropout: its masks kept' if dropout_of(opts) else ''}"
        + (f", {opts.gradient_accumulation_steps} micro-batches a step: fsdp* "
           + ("reduce each (sync_each_batch), holding their gradient shards between them"
              if opts.sync_each_batch else "hold whole gradients between them (no_sync; --sync_each_batch keeps shards)")
           if opts.gradient_accumulation_steps > 1 else ""),
        f"total/GPU = (model states + activation peak + comm buffers) x {1 + FRAGMENTATION:g} (allocator "
        f"fragmentation) + {RUNTIME_ALLOWANCE_BYTES / GB:g} GB (CUDA context, workspaces); GB = 1e9 bytes",
        "host/node = offloaded states of every GPU on the node + building the model: one full fp32 copy per process, "
        "except fsdp*, zero3* (rank 0 builds it and shards it out: one copy + a shard per other process) and tp, "
        "fsdp_tp (each node's first process builds it, its TP group takes its slices; docs/estimate.md)",
        "not modelled: CUDA-graph pools, evaluation, dataloader workers (docs/estimate.md)",
        *filter(None, [window_caveat(shape, seq, opts.attn_implementation)]),
    ] + ([f"megatron* rows: TP x PP x CP x DP = --gpus, the busiest pipeline stage with "
          f"{opts.gradient_accumulation_steps} micro-batch(es) per step ("
          + ("1F1B keeps min(PP, GAS) in flight on the first stage" if opts.vp == 1 else
             f"interleaved over {opts.vp} chunks: 1 + (PP - 1)/(PP x {opts.vp}) of 1F1B's on the first stage")
          + "), 16-bit weights, fp32 gradients, masters and Adam (megatron-deepspeed"
          + (", and megatron with its distributed optimizer" if opts.use_distributed_optimizer else "")
          + ": ZeRO-1 over DP x CP), activations per "
          f"Korthikanti et al. 2022 at the model's widths (recompute "
          f"{grid_options(opts, opts.activation_checkpointing).recompute}, sequence parallel "
          f"{'on' if opts.sequence_parallel else 'off'}, dropout {'on' if dropout_of(opts) else 'off'}, attention "
          "scores "
          f"{'kept (eager)' if opts.attn_implementation == 'eager' else 'not kept (a fused kernel)'}; "
          "CP: a GPU's 1/CP of each sequence); "
          "Megatron builds each rank's slice on its GPU: no host copy (docs/project.md)"]
         if opts.tp or opts.pp or opts.cp else [])


def calibration_notes(rows: list[Row]) -> list[str]:
    """Which measurements each row's activations come from: the device's own fit, or the CPU fit where no GPU has
    measured that mode yet (formulas/activations.activations says which) - one note per calibration, naming its strategies."""
    by_calibration: dict[str, list[str]] = {}
    for r in rows:
        calibration = (r.memory or {}).get("activation_calibration")
        if calibration and not r.refused and r.strategy not in by_calibration.setdefault(calibration, []):
            by_calibration[calibration].append(r.strategy)
    return [f"activations of {', '.join(strategies)}: "
            + (f"fitted on CUDA measurements{calibration[4:]} (benchmarks/results/h*_*/cuda_activations.jsonl)"
               if calibration.startswith("cuda") else
               f"{calibration} - the CPU fit, not yet checked on a GPU (benchmarks/gpu_suite.py --only grid)"
               if calibration.startswith("cpu") else calibration)
            for calibration, strategies in by_calibration.items()]


def main(argv: list[str]) -> None:
    refuse_renamed(argv)
    opts = build_parser().parse_args(argv)
    shape, seq, device_bytes, rows = estimate_rows(opts)
    notes = assumptions(opts, shape, seq, device_bytes) + calibration_notes(rows)
    if opts.json:
        print(json.dumps({"assumptions": notes, "device_memory_bytes": device_bytes,
                          "rows": [r.__dict__ for r in rows]}, indent=2))
        return
    print(table(rows))
    refused = sorted({f"{r.strategy} x {r.optim}: {r.refused}" for r in rows if r.refused})
    for line in notes + [f"refused {x}" for x in refused]:
        print(f"- {line}")
