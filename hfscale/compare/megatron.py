"""`hfscale import-logs FILES...`: Megatron-LM / Megatron-DeepSpeed training logs as rows of hfscale's report.

What a log says is read by compare/megatron_log.py. The run's shape comes from the log's own header first (sizes,
seq_length, global/micro batch size, checkpoint_activations or recompute_*, rampup_batch_size, deepspeed), then from
BigScience-style file names (`61B-megatron-mbs-2-pp16-dp-1-gas-512-200977.out`: model size, MBS, PP, DP, GAS, job
id; TP as `tp-4`) where the log is silent, then from flags; a file name that contradicts the log is warned about.
With a batch-size ramp-up only the iterations at the final global batch size are averaged (after the first
`--skip_first` of them: start-up and compilation). TFLOPs per GPU use the BigScience formula, the only one a log
allows. A log with no iteration line becomes a `fail` row (`OOM` when the log says it ran out of memory).
The loss curve carries tokens (consumed samples x seq_len) and training seconds, and validation lines become the eval
curve, so an imported run sits in the report's loss plots and convergence.md as a run does.
"""

import math
import sys
from pathlib import Path

from ..errors import ArgumentParser, HfscaleError
from ..files import check_writable_dir
from ..flags import at_most_gpus, positive
from ..formulas.metrics import bigscience_tflops_per_gpu, global_batch_size, size_label, throughput
from ..formulas.parallel3d import padded_vocab
from ..run.results import ConfigRecord, ModelRecord, PerfRecord, Results, write_results
from .megatron_log import ANSI_ESCAPE, histories, parse_log, parse_name
from .report import collect, markdown_table

GPT2_VOCAB = 50257  # Megatron's GPT2BPETokenizer, the BigScience logs' "> building GPT2BPETokenizer tokenizer"


# what a launch's header may change and the run's figures depend on
LAUNCH_SIZES = ("world", "dp", "tp", "pp", "cp", "seq_len", "mbs", "gbs", "n_layer", "hidden", "n_head")


def measured_launches(log: dict, path: Path, warnings: list[str]) -> tuple[dict, list[dict]]:
    """The header the run is described by and the launches its speed is measured from: all of them, unless a later
    launch's header states other sizes (a restart on fewer nodes, a new batch size): then that launch and those after
    it, with a warning. A launch that prints no header runs as the one before it."""
    launches, start = log["launches"], 0
    for i, launch in enumerate(launches[1:], 1):
        before, now = launches[start]["header"], launch["header"]
        changed = [k for k in LAUNCH_SIZES if now.get(k) is not None and now.get(k) != before.get(k)]
        if changed:
            warnings.append(f"{path.name}: launch {i + 1} of {len(launches)} changed "
                            + ", ".join(f"{k} {before.get(k)} -> {now[k]}" for k in changed)
                            + "; only its iterations and those of the launches after it are measured")
            start = i
    return launches[start]["header"], launches[start:]


def check_logged_values(path: Path, header: dict, launches: list[dict]) -> None:
    """A size of 0 in the header or a global batch of 0, and an iteration time that is not a positive, finite number
    of milliseconds, are a damaged or hand-edited log: named, where they would give a division by zero or a row from
    a default the log seemed to override."""
    zero = next((k for k in (*LAUNCH_SIZES, "log_interval") if header.get(k) == 0), None)
    if zero:
        raise HfscaleError(f"{path.name}: the log's header says {zero} 0; a size must be at least 1")
    for e in (e for launch in launches for e in launch["iterations"]):
        if not (math.isfinite(e["s"]) and e["s"] > 0):
            raise HfscaleError(f"{path.name}: iteration {e['step']}: elapsed time per iteration {e['s'] * 1000:g} ms, "
                               "not a time; cut or fix that line")
        if e["gbs"] == 0:
            raise HfscaleError(f"{path.name}: iteration {e['step']}: global batch size 0; cut or fix that line")


def _pick(key: str, header: dict, name: dict, flag, path: Path, warnings: list[str]):
    """The log's value, else the flag's, else the file name's; disagreements become warnings."""
    value = header.get(key)
    for source, other in (("file name", name.get(key)), ("flag", flag)):
        if value is not None and other is not None and other != value:
            warnings.append(f"{path.name}: the {source} says {key} {other}, the log says {value}; using the log's")
    if value is None:
        value = flag if flag is not None else name.get(key)
    return value


def logged_shape(header: dict) -> dict:
    """The model shape the log's arguments state (ModelRecord fields), for `hfscale project` to plan from: a GPT
    (learned positions up to max_position_embeddings, else seq_length), with ALiBi a BLOOM, or with rotary positions, a
    SwiGLU MLP, RMSNorm and no linear biases a Llama (its query groups the key/value heads when grouped-query attention
    is on, its head untied when the log says so), a Qwen2 where add_qkv_bias puts biases back on q, k and v, a Qwen3
    where qk_layernorm adds per-head norms on the queries and keys; a Llama's or Qwen3's head width is kv_channels. The
    vocabulary is the padded one Megatron reports, else the GPT-2 tokenizer's 50257 as Megatron pads it. Empty when the
    log does not state its layers, hidden size and heads, or states another architecture (experts, only some of
    Llama's parts, both of Qwen2's and Qwen3's, or a head width apart from hidden / heads on a GPT, BLOOM or Qwen2)."""
    if not all(header.get(k) for k in ("n_layer", "hidden", "n_head")) or header.get("other_architecture"):
        return {}
    llama_parts = [header.get(k, False) for k in ("rope", "swiglu", "rmsnorm", "no_bias")]
    if any(llama_parts) and not all(llama_parts):
        return {}
    own_head_dim = header.get("head_dim", header["hidden"] // header["n_head"]) != header["hidden"] // header["n_head"]
    qwen3 = all(llama_parts) and header.get("qk_norm")
    if (header.get("qkv_bias") and (qwen3 or own_head_dim)) or (own_head_dim and not all(llama_parts)):
        return {}
    vocab = header.get("vocab") or padded_vocab(GPT2_VOCAB, header.get("tp") or 1)
    positions = header.get("positions") or header.get("seq_len") or 2048
    # biases on q/k/v alone: disable_bias_linear + add_qkv_bias; per-head q/k norms: qk_layernorm
    llama = "qwen3" if qwen3 else "qwen2" if header.get("qkv_bias") else "llama"
    shape = {"family": llama if all(llama_parts) else "bloom" if header.get("alibi") else "gpt2",
             "n_layer": header["n_layer"], "hidden": header["hidden"], "n_head": header["n_head"], "vocab": vocab,
             "positions": positions, "ffn": header.get("ffn")}
    if all(llama_parts):
        shape.update(n_kv_head=header.get("query_groups") if header.get("gqa") else header["n_head"],
                     tied=not header.get("untied", False))
    if qwen3 or own_head_dim:  # Qwen3's shapes carry their head width always, as its configs do
        shape["head_dim"] = header.get("head_dim") or header["hidden"] // header["n_head"]
    return shape


def read_log(path: Path) -> tuple[dict, dict]:
    """(the sizes in its file name, the parsed log) of a log file; every fault named with the file."""
    if path.is_dir():
        raise HfscaleError(f"{path} is a directory, not a log file")
    if not path.is_file():
        raise HfscaleError(f"{path}: log file not found")
    text = ANSI_ESCAPE.sub("", path.read_text(errors="replace"))
    if not text.strip():
        raise HfscaleError(f"{path.name}: the log is empty")
    try:
        return parse_name(path.name), parse_log(text)
    except HfscaleError as err:  # a value that is not a number: named with its file
        raise HfscaleError(f"{path.name}: {err}") from None


def logged_layout(path: Path, header: dict, name: dict, gpus: int | None, warnings: list[str]) -> dict:
    """The run's parallel sizes {world, tp, pp, cp, dp, vp}: the log's, else the flag's or the file name's. DP is what
    the world leaves over one replica's TP x PP x CP GPUs (Megatron-LM's context parallelism splits each sequence); VP
    the model chunks a GPU holds under the interleaved schedule (1: plain 1F1B)."""
    tp, pp, cp = (_pick(key, header, name, None, path, warnings) or 1 for key in ("tp", "pp", "cp"))
    dp = _pick("dp", header, name, None, path, warnings)
    replica = tp * pp * cp  # the GPUs of one data-parallel replica
    world = _pick("world", header, {}, gpus, path, warnings) or (replica * dp if dp else None)
    if not world:
        raise HfscaleError(f"{path.name}: no world size in the log and no DP in the file name (like '-dp-4-'); "
                           "pass --gpus")
    if world % replica:
        raise HfscaleError(f"{path.name}: {world} GPUs is not a multiple of TP x PP"
                           + (f" x CP = {replica}" if cp > 1 else f" = {replica}"))
    vp = header.get("vp") or 1  # model chunks per GPU (the interleaved schedule); older logs state layers per chunk
    if "vp" not in header and header.get("layers_per_virtual_stage") and header.get("n_layer"):
        vp = header["n_layer"] // pp // header["layers_per_virtual_stage"]
    return {"world": world, "tp": tp, "pp": pp, "cp": cp, "dp": world // replica, "vp": vp}


def logged_batch(path: Path, header: dict, name: dict, launches: list[dict], dp: int,
                 warnings: list[str]) -> tuple[int | None, int | None, int | None]:
    """(micro-batch, accumulation steps, global batch): the global batch of the last iteration line that states one
    (after a ramp-up, the final one), else the header's, else MBS x GAS x DP from the file name."""
    mbs, gas = _pick("mbs", header, name, None, path, warnings), name.get("gas")
    final = next((e["gbs"] for launch in reversed(launches) for e in reversed(launch["iterations"]) if e["gbs"]), None)
    gbs = final or header.get("gbs") or (global_batch_size(mbs, gas, dp) if mbs and gas else None)
    if gbs and mbs and gas is None:
        gas = gbs // (mbs * dp) if gbs % (mbs * dp) == 0 else None
    return mbs, gas, gbs


def measured_iterations(launches: list[dict], gbs: int | None, skip_first: int) -> list[dict]:
    """The iterations the speed is averaged over: those at the final global batch (a ramp-up's earlier ones left out;
    per-line GBS when logged), past the first `skip_first` of each launch (its start-up) where any remain."""
    at_final = [[e for e in launch["iterations"] if e["gbs"] in (None, gbs)] for launch in launches]
    return [e for its in at_final for e in its[skip_first:]] or [e for its in at_final for e in its]


def import_log(path: Path, *, gpus: int | None, seq_len: int | None, params: float | None,
               checkpointing: bool | None, skip_first: int, token_budget: float = 1e11,
               warnings: list[str] | None = None) -> Results:
    """One results record (same schema as a training run's, `source: megatron-log`). seq_len/checkpointing None:
    from the log's header, else 2048 / on (the BigScience runs' settings). Warnings are appended to `warnings`."""
    path = Path(path)
    warnings = [] if warnings is None else warnings
    name, log = read_log(path)
    header, launches = measured_launches(log, path, warnings)
    check_logged_values(path, header, log["launches"])
    n_params = int(params) if params else name.get("params")
    if not n_params:
        raise HfscaleError(f"{path.name}: no model size in the file name (like '61B-...'); pass --params")
    sizes = logged_layout(path, header, name, gpus, warnings)
    seq = _pick("seq_len", header, {}, seq_len, path, warnings) or 2048
    ckpt = _pick("checkpointing", header, {}, checkpointing, path, warnings)
    ckpt = True if ckpt is None else ckpt  # the BigScience runs recomputed activations
    mbs, gas, gbs = logged_batch(path, header, name, launches, sizes["dp"], warnings)
    engine = "megatron-deepspeed" if header.get("deepspeed") else "megatron"
    record = Results(
        source="megatron-log", log_file=str(path.resolve()), run_name=path.stem,
        strategy=(f"{engine}-tp{sizes['tp']}-pp{sizes['pp']}" + (f"-vp{sizes['vp']}" if sizes["vp"] > 1 else "")
                  + (f"-cp{sizes['cp']}" if sizes["cp"] > 1 else "")),
        optim="?", model=ModelRecord(name=name.get("size") or size_label(n_params), params_model=n_params,
                                     **logged_shape(header)),
        config=ConfigRecord(world_size=sizes["world"], dp=sizes["dp"], tp=sizes["tp"], pp=sizes["pp"],
                            per_device_train_batch_size=mbs, gradient_accumulation_steps=gas, global_batch_size=gbs,
                            seq_len=seq, activation_checkpointing=ckpt, token_budget=token_budget, precision=header.get("precision"),
                            extra={"rampup_batch_size": header.get("rampup"), "from_header": sorted(header),
                                   "context_parallel": sizes["cp"], "virtual_pipeline": sizes["vp"],
                                   "flash_attention": bool(header.get("flash_attention")),
                                   "distributed_optimizer": bool(header.get("distributed_optimizer")),
                                   "recompute": header.get("recompute"), "dropout": header.get("dropout"),
                                   "sequence_parallel": bool(header.get("sequence_parallel"))}))
    record.loss_history, record.eval_history = histories(log["launches"], seq, header.get("log_interval"))
    measured = measured_iterations(launches, gbs, skip_first)
    if not measured:
        record.status, record.error = ("OOM", log["oom"][:300]) if log["oom"] else (
            "fail", "no 'elapsed time per iteration' line in the log")
        return record
    if not gbs:
        raise HfscaleError(f"{path.name}: no global batch size in the log or MBS/GAS in the name; rename or pass them")
    record.status = "ok"
    record.perf = logged_perf(measured, gbs, seq, sizes["world"], n_params, ckpt, token_budget)
    record.perf.extra.update(iterations_skipped=len(log["iteration_s"]) - len(measured), launches=len(log["launches"]))
    return record


def logged_perf(measured: list[dict], gbs: int, seq: int, world: int, n_params: int, checkpointing: bool,
                token_budget: float) -> PerfRecord:
    """Speed, throughput, BigScience TFLOPs and days to the budget over the measured iterations, with the log's own
    TFLOPs figure over the same iterations beside them (None: it prints none)."""
    s_per_iter = sum(e["s"] for e in measured) / len(measured)
    reported = [e["tflops"] for e in measured if e["tflops"] is not None]
    rates = throughput(s_per_iter=s_per_iter, global_batch_size=gbs, seq_len=seq, gpus=world,
                       token_budget=token_budget)
    return PerfRecord(s_per_iter=s_per_iter, **rates.__dict__,
                      tflops_per_gpu_bigscience=bigscience_tflops_per_gpu(n_params, seq, gbs, s_per_iter, world,
                                                                          checkpointing),
                      extra={"iterations_averaged": len(measured),
                             "tflops_per_gpu_reported": sum(reported) / len(reported) if reported else None})


def write_tensorboard(run_dir: Path, record: Results) -> None:
    """The log's curves as TensorBoard events in its folder, under a run's tags (train/loss, train_by_tokens/loss,
    eval/loss, ...): `tensorboard --logdir runs/` overlays it on hfscale's runs by step, tokens and time."""
    from ..run.measure import TensorBoardWriter

    for old in run_dir.glob("events.out.tfevents.*"):  # an earlier import of the same log: replaced, not doubled
        old.unlink()
    if not record.loss_history and not record.eval_history:
        return
    cfg = record.config
    tb = TensorBoardWriter(str(run_dir), {"source": "megatron-log", "strategy": record.strategy,
                                          "model": record.model.name, "world_size": cfg.world_size, "tp": cfg.tp,
                                          "pp": cfg.pp, "dp": cfg.dp, "global_batch_size": cfg.global_batch_size,
                                          "seq_len": cfg.seq_len})
    tb.histories(thinned(record.loss_history), thinned(record.eval_history))
    tb.close()


TENSORBOARD_POINTS = 5000  # per curve: TensorBoard shows 1,000 of a series (its reservoir), so more are never drawn


def thinned(points: list, limit: int = TENSORBOARD_POINTS) -> list:
    """Every k-th point, the last one kept, at most about `limit`: a 200k-iteration log's five curves took 50 s to
    write point by point (torch's writer spends ~50 us per scalar) for a 50 MB file TensorBoard samples anyway.
    results.json keeps every point."""
    if len(points) <= limit:
        return points
    step = -(-len(points) // limit)
    return points[::step] + ([points[-1]] if (len(points) - 1) % step else [])


def main(argv: list[str]) -> None:
    parser = ArgumentParser(prog="hfscale import-logs", description="Turn Megatron-LM/Megatron-DeepSpeed logs into "
                            "report rows: one results.json and TensorBoard events per log under --out (launchers' line prefixes and "
                            "logs several launches appended to are read as such).")
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("runs/megatron"), help="default runs/megatron")
    parser.add_argument("--gpus", type=int, help="total GPUs (default TP x PP x DP from the file name)")
    parser.add_argument("--seq_len", type=int, help="sequence length (default: the log's seq_length, else 2048)")
    parser.add_argument("--params", type=float, help="model parameters (default: the size in the file name)")
    parser.add_argument("--no_checkpointing", action="store_true",
                        help="the runs did not recompute activations (F = 3 instead of 4 in the TFLOPs formula); "
                             "default: what the log's arguments say, else on")
    parser.add_argument("--skip_first", type=int, default=1,
                        help="logged iterations of each launch left out of the average (default 1: its start-up)")
    opts = parser.parse_args(argv)
    positive(opts, "gpus", "seq_len", "params")
    at_most_gpus("--gpus", opts.gpus)
    if opts.skip_first < 0:
        raise HfscaleError(f"--skip_first must be >= 0, got {opts.skip_first}")
    warnings: list[str] = []
    records = [import_log(f, gpus=opts.gpus, seq_len=opts.seq_len, params=opts.params,
                          checkpointing=False if opts.no_checkpointing else None, skip_first=opts.skip_first,
                          warnings=warnings) for f in opts.files]
    check_writable_dir(opts.out, "--out")
    for line in warnings:
        print(f"hfscale: warning: {line}", file=sys.stderr)
    dirs = []
    for record in records:  # all parsed before anything is written: a bad file leaves nothing half-imported
        run_dir = opts.out / record.run_name
        write_results(run_dir, record)
        write_tensorboard(run_dir, record)
        dirs.append(run_dir)
    print(markdown_table(collect(dirs)))
    print(f"imported {len(records)} log(s) into {opts.out}; `hfscale report {opts.out} runs/...` puts them beside hfscale runs")
