"""`hfscale import-logs FILES...`: Megatron-LM / Megatron-DeepSpeed training logs as rows of hfscale's report.

A log's iteration lines look like
    iteration      200/  292968 | ... | elapsed time per iteration (ms): 61236.4 | ... | global batch size:   512 |
    lm loss: 6.527E+00 | ...
The run's shape comes from the log's own header first - Megatron's "using world size: 64, data-parallel-size: 1,
tensor-model-parallel size: 4, pipeline-model-parallel size: 16" line and its "arguments" block (seq_length,
global/micro batch size, checkpoint_activations or recompute_*, rampup_batch_size, deepspeed) - then from
BigScience-style file names (`61B-megatron-mbs-2-pp16-dp-1-gas-512-200977.out`: model size, MBS, PP, DP, GAS, job
id; TP as `tp-4`) where the log is silent, then from flags; a file name that contradicts the log is warned about.
With a batch-size ramp-up only the iterations at the final global batch size are averaged (after the first
`--skip_first` of them: start-up and compilation). TFLOPs per GPU use the BigScience formula, the only one a log
allows. A log with no iteration line becomes a `fail` row (`OOM` when the log says it ran out of memory).
The loss curve carries tokens (consumed samples x seq_len) and training seconds, and validation lines become the eval
curve, so an imported run sits in the report's loss plots and convergence.md as a run does (`histories`).
Launchers' line prefixes (srun --label, torchrun --tee, timestamps) are read past, and a log several launches appended
to is read launch by launch (`split_launches`).
"""

import math
import re
import sys
from pathlib import Path

from ..errors import ArgumentParser, HfscaleError
from ..files import check_writable_dir
from ..flags import at_most_gpus, positive
from ..launch import OOM_MARKERS
from ..formulas.metrics import bigscience_tflops_per_gpu, days_to_train, size_label
from ..formulas.parallel3d import padded_vocab
from ..run.results import ConfigRecord, ModelRecord, PerfRecord, Results, write_results
from .report import collect, markdown_table

# a logged value is the token after its label, whatever it is: one that is not a number (a damaged or hand-edited
# line) is named when it is read (`_float`), rather than the line skipped or the number cut short
NUMBER = r"([^\s|]+)"
ITERATION_TIME = re.compile(r"elapsed time per iteration \(ms\):\s*" + NUMBER)
ITERATION = re.compile(r"iteration\s+(\d+)\s*/")
GLOBAL_BATCH = re.compile(r"global batch size:\s*(\d+)")
LM_LOSS = re.compile(r"lm loss:\s*" + NUMBER)
CONSUMED = re.compile(r"consumed samples:\s*(\d+)")
LEARNING_RATE = re.compile(r"learning rate:\s*" + NUMBER)
GRAD_NORM = re.compile(r"grad norm:\s*" + NUMBER)
# " validation loss at iteration 1000 | lm loss value: 2.7E+00 | lm loss PPL: 1.5E+01 |" (newer: "... 1000 on
# validation set | ..."; the test set's lines are left out)
VALIDATION = re.compile(r"validation loss at iteration\s+(\d+)[^|]*\|\s*lm loss value:\s*" + NUMBER)
PERPLEXITY = re.compile(r"lm loss PPL:\s*" + NUMBER)
# the log's own TFLOPs per GPU, by its own formula: Megatron-LM's "throughput per GPU (TFLOP/s/GPU): 412.3",
# Megatron-DeepSpeed's "TFLOPs: 123.45"
REPORTED_TFLOPS = re.compile(r"(?:throughput per GPU \(TFLOP/s/GPU\)|TFLOPs):\s*" + NUMBER)
NAME_FIELDS = {key: re.compile(rf"(?:^|[-_]){key}[-_]?(\d+)(?=[-_.]|$)", re.IGNORECASE)
               for key in ("mbs", "gas", "pp", "dp", "tp", "cp")}
NAME_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([MBT])(\d*)", re.IGNORECASE)
UNITS = {"M": 1e6, "B": 1e9, "T": 1e12}
GPT2_VOCAB = 50257  # Megatron's GPT2BPETokenizer, the BigScience logs' "> building GPT2BPETokenizer tokenizer"
# "using world size: 16, data-parallel-size: 1, tensor-model-parallel size: 1, pipeline-model-parallel size: 16"
# (newer Megatron: "data-parallel size", and a context-parallel size)
HEADER_SIZES = re.compile(r"(world|data-parallel|context-parallel|tensor-model-parallel|pipeline-model-parallel)[- ]size:"
                          r"\s*(\d+)")
HEADER_KEYS = {"world": "world", "data-parallel": "dp", "context-parallel": "cp", "tensor-model-parallel": "tp",
               "pipeline-model-parallel": "pp"}
ARGUMENT = re.compile(r"^\s*([a-z_][a-z0-9_]*) \.{2,} (.*?)\s*$")  # "  seq_length ....... 2048" in the arguments block
ARGUMENT_KEYS = {"world_size": "world", "data_parallel_size": "dp", "context_parallel_size": "cp",
                 "tensor_model_parallel_size": "tp",
                 "pipeline_model_parallel_size": "pp", "seq_length": "seq_len", "global_batch_size": "gbs",
                 "micro_batch_size": "mbs", "num_layers": "n_layer", "hidden_size": "hidden",
                 "num_attention_heads": "n_head", "ffn_hidden_size": "ffn", "max_position_embeddings": "positions",
                 "padded_vocab_size": "vocab", "log_interval": "log_interval"}
# what launchers write before each line: srun --label's "12: ", torchrun --tee's "[default3]:" or "[rank3]:",
# a "[2024-05-01 10:00:00]" timestamp, or several of them ("3: [default3]:")
LAUNCHER_PREFIX = re.compile(r"^(?:\s*(?:\d+:|\[[^\]]*\]:?))+ ?")
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # a colouring logger's or terminal's escape codes
PARAMS_DTYPE = re.compile(r"using torch\.(float16|bfloat16|float32) for parameters")
# "> padded vocab (size: 50257) with 431 dummy tokens (new size: 50688)": the vocabulary the model really has
PADDED_VOCAB = re.compile(r"padded vocab \(size: \d+\) with \d+ dummy tokens \(new size: (\d+)\)")


def parse_name(name: str) -> dict:
    """Sizes in a BigScience log name: '61B-megatron-mbs-2-pp16-dp-1-gas-512-200977.out' -> params 61e9, mbs 2, ..."""
    fields = {key: int(m.group(1)) for key, rx in NAME_FIELDS.items() if (m := rx.search(name))}
    size = NAME_SIZE.match(name)
    if size:  # "61B", "1.3B", and BigScience's "1B3" (= 1.3B)
        whole, unit, decimals = size.groups()
        fields["params"] = int(float(f"{whole}.{decimals}" if decimals else whole) * UNITS[unit.upper()])
        fields["size"] = size.group(0)
    return fields


def _truthy(value: str) -> bool:
    return value.strip().lower() not in ("false", "none", "0", "", "[]")


def parse_header(text: str) -> dict:
    """What the log says about its own run: world/dp/tp/pp, seq_len, gbs, mbs, checkpointing, rampup, deepspeed."""
    found = {}
    for line in text.splitlines():
        if "iteration" in line and "elapsed time" in line:
            break  # the header is over
        line = LAUNCHER_PREFIX.sub("", line)
        if line.lstrip().startswith("using world size"):
            for key, value in HEADER_SIZES.findall(line):
                found.setdefault(HEADER_KEYS[key], int(value))
        dtype = PARAMS_DTYPE.search(line)
        if dtype:
            found.setdefault("precision", {"float16": "fp16", "bfloat16": "bf16"}.get(dtype.group(1), "fp32"))
        vocab = PADDED_VOCAB.search(line)
        if vocab:
            found.setdefault("vocab", int(vocab.group(1)))
        arg = ARGUMENT.match(line)
        if not arg:
            continue
        key, value = arg.groups()
        if key in ARGUMENT_KEYS and value.strip().isdigit():
            found.setdefault(ARGUMENT_KEYS[key], int(value))
        elif key in ("checkpoint_activations", "recompute_activations"):
            found["checkpointing"] = found.get("checkpointing", False) or _truthy(value)
        elif key == "recompute_granularity" and _truthy(value):
            found["checkpointing"] = True
            found["recompute"] = value.strip()  # full | selective
        elif key == "recompute_granularity":  # None: no recomputation, unless checkpoint_activations said so
            found.setdefault("checkpointing", False)
        elif key in ("bf16", "fp16") and _truthy(value):  # the arguments' precision, where no dtype line says it
            found.setdefault("precision", key)
        elif key == "sequence_parallel" and _truthy(value):
            found["sequence_parallel"] = True
        elif key == "position_embedding_type" and "alibi" in value.lower():
            found["alibi"] = True  # BLOOM's positions: no learned table
        elif key == "position_embedding_type" and "rope" in value.lower() or key in ("swiglu", "num_query_groups",
                                                                                    "num_experts") and _truthy(value):
            found["other_architecture"] = True  # a Llama-style or MoE model: not the GPT-2/BLOOM the formulas know
        elif key == "rampup_batch_size" and _truthy(value):
            found["rampup"] = value.strip()
        elif key == "deepspeed" and _truthy(value):
            found["deepspeed"] = True
    return found


# a launch's header begins with one of these (Megatron prints the sizes, then its arguments block)
LAUNCH_HEADER = re.compile(r"^using world size:|^-{3,} arguments -{3,}")


def split_launches(text: str) -> list[str]:
    """A log that several launches of one job appended to (a SLURM requeue with --open-mode=append, a restart from
    the last checkpoint) holds each launch's header and iterations in turn. A new launch begins where a header line
    follows an iteration line, or where the iteration count goes back (a launch whose header is not in the file)."""
    launches, current, last_step = [], [], None
    for line in text.splitlines():
        step = ITERATION.search(line) if ITERATION_TIME.search(line) else None
        again = step is not None and last_step is not None and int(step.group(1)) <= last_step
        if current and last_step is not None and (again or LAUNCH_HEADER.search(LAUNCHER_PREFIX.sub("", line))):
            launches.append("\n".join(current))
            current, last_step = [], None
        if step:
            last_step = int(step.group(1))
        current.append(line)
    return launches + ["\n".join(current)]


def _float(token: str, what: str, where: str) -> float:
    try:
        return float(token)
    except ValueError:
        raise HfscaleError(f"{where}: {what} {token!r} is not a number; cut or fix that line") from None


def _number(rx: re.Pattern, line: str, where: str) -> float | None:
    """The value `rx` captures in `line` (its last group), None where the line has none; named where it is no number."""
    match = rx.search(line)
    if not match:
        return None
    label = line[match.start():match.start(match.lastindex)].split("|")[-1].rstrip(": ")  # "lm loss", "grad norm"
    return _float(match.group(match.lastindex), label.strip(), where)


def parse_launch(text: str) -> dict:
    """One launch: its header, and its iteration and validation lines in log order (`events`)."""
    events = []
    for line in text.splitlines():
        if ITERATION_TIME.search(line):
            step, batch, consumed = ITERATION.search(line), GLOBAL_BATCH.search(line), CONSUMED.search(line)
            where = f"iteration {step.group(1)}" if step else "an iteration line"
            events.append(("iteration", {"step": int(step.group(1)) if step else None,
                                         "s": _number(ITERATION_TIME, line, where) / 1000,
                                         "gbs": int(batch.group(1)) if batch else None,
                                         "loss": _number(LM_LOSS, line, where),
                                         "grad_norm": _number(GRAD_NORM, line, where),
                                         "lr": _number(LEARNING_RATE, line, where),
                                         "samples": int(consumed.group(1)) if consumed else None,
                                         "tflops": _number(REPORTED_TFLOPS, line, where)}))
        elif (validation := VALIDATION.search(line)) and not re.search(r"\btest (?:set|data)\b", line):
            where = f"validation at iteration {validation.group(1)}"
            events.append(("eval", {"step": int(validation.group(1)), "loss": _number(VALIDATION, line, where),
                                    "perplexity": _number(PERPLEXITY, line, where)}))
    return {"iterations": [e for kind, e in events if kind == "iteration"], "events": events,
            "header": parse_header(text)}


def parse_log(text: str) -> dict:
    """Every launch in the log (`launches`, each its header and iterations), the whole log's iteration times in order,
    the first launch's header, and its out-of-memory line if any."""
    launches = [parse_launch(part) for part in split_launches(text)]
    oom = next((line.strip() for line in text.splitlines() if any(m in line for m in OOM_MARKERS)), None)
    return {"iteration_s": [e["s"] for launch in launches for e in launch["iterations"]], "launches": launches,
            "oom": oom, "header": launches[0]["header"]}


def histories(launches: list[dict], seq_len: int, log_interval: int | None) -> tuple[list[dict], list[dict]]:
    """The loss and eval curves in the form of an hfscale run's (docs/results.md): `tokens` from Megatron's consumed
    samples x seq_len, `elapsed_s` the training seconds up to the point - each logged iteration time times the steps
    of its interval (since the launch's line before; a launch's first line: the log interval, else the steps between
    its first two lines). A step trained again after a restart keeps its later values."""
    elapsed, losses, evals = 0.0, {}, {}
    for launch in launches:
        steps = [e["step"] for kind, e in launch["events"] if kind == "iteration" and e["step"] is not None]
        first = log_interval or (steps[1] - steps[0] if len(steps) > 1 and steps[1] > steps[0] else None)
        previous, tokens = None, None
        for kind, e in launch["events"]:
            if kind == "eval":
                evals[e["step"]] = {**e, "tokens": tokens, "elapsed_s": elapsed if previous is not None else None}
                continue
            if e["step"] is None:
                continue
            interval = e["step"] - previous if previous is not None else (first or e["step"])
            elapsed, previous = elapsed + interval * e["s"], e["step"]
            tokens = e["samples"] * seq_len if e["samples"] is not None else None
            if e["loss"] is not None:
                losses[e["step"]] = {"step": e["step"], "loss": e["loss"], "grad_norm": e["grad_norm"], "lr": e["lr"],
                                     "tokens": tokens, "elapsed_s": elapsed}
    return [losses[k] for k in sorted(losses)], [evals[k] for k in sorted(evals)]


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
    (learned positions up to max_position_embeddings, else seq_length) or, with ALiBi, a BLOOM. The vocabulary is
    the padded one Megatron reports, else the GPT-2 tokenizer's 50257 as Megatron pads it. Empty when the log does
    not state its layers, hidden size and heads, or states another architecture (RoPE, SwiGLU, grouped-query
    attention, experts)."""
    if not all(header.get(k) for k in ("n_layer", "hidden", "n_head")) or header.get("other_architecture"):
        return {}
    vocab = header.get("vocab") or padded_vocab(GPT2_VOCAB, header.get("tp") or 1)
    positions = header.get("positions") or header.get("seq_len") or 2048
    return {"family": "bloom" if header.get("alibi") else "gpt2", "n_layer": header["n_layer"],
            "hidden": header["hidden"], "n_head": header["n_head"], "vocab": vocab, "positions": positions,
            "ffn": header.get("ffn")}


def import_log(path: Path, *, gpus: int | None, seq_len: int | None, params: float | None,
               checkpointing: bool | None, skip_first: int, token_budget: float = 1e11,
               warnings: list[str] | None = None) -> Results:
    """One results record (same schema as a training run's, `source: megatron-log`). seq_len/checkpointing None:
    from the log's header, else 2048 / on (the BigScience runs' settings). Warnings are appended to `warnings`."""
    path = Path(path)
    warnings = [] if warnings is None else warnings
    if path.is_dir():
        raise HfscaleError(f"{path} is a directory, not a log file")
    if not path.is_file():
        raise HfscaleError(f"{path}: log file not found")
    name = parse_name(path.name)
    text = ANSI_ESCAPE.sub("", path.read_text(errors="replace"))
    if not text.strip():
        raise HfscaleError(f"{path.name}: the log is empty")
    try:
        log = parse_log(text)
    except HfscaleError as err:  # a value that is not a number: named with its file
        raise HfscaleError(f"{path.name}: {err}") from None
    header, launches = measured_launches(log, path, warnings)
    check_logged_values(path, header, log["launches"])
    n_params = int(params) if params else name.get("params")
    if not n_params:
        raise HfscaleError(f"{path.name}: no model size in the file name (like '61B-...'); pass --params")
    tp = _pick("tp", header, name, None, path, warnings) or 1
    pp = _pick("pp", header, name, None, path, warnings) or 1
    cp = _pick("cp", header, name, None, path, warnings) or 1  # context parallelism: each sequence over CP GPUs
    dp = _pick("dp", header, name, None, path, warnings)
    model_parallel = tp * pp * cp  # the GPUs of one data-parallel replica
    world = _pick("world", header, {}, gpus, path, warnings) or (model_parallel * dp if dp else None)
    if not world:
        raise HfscaleError(f"{path.name}: no world size in the log and no DP in the file name (like '-dp-4-'); "
                           "pass --gpus")
    if world % model_parallel:
        raise HfscaleError(f"{path.name}: {world} GPUs is not a multiple of TP x PP"
                           + (f" x CP = {model_parallel}" if cp > 1 else f" = {model_parallel}"))
    if dp is None or dp * model_parallel != world:
        dp = world // model_parallel
    seq = _pick("seq_len", header, {}, seq_len, path, warnings) or 2048
    ckpt = _pick("checkpointing", header, {}, checkpointing, path, warnings)
    ckpt = True if ckpt is None else ckpt  # the BigScience runs recomputed activations
    mbs = _pick("mbs", header, name, None, path, warnings)
    gas = name.get("gas")
    final = next((e["gbs"] for launch in reversed(launches) for e in reversed(launch["iterations"]) if e["gbs"]), None)
    gbs = final or header.get("gbs") or (mbs * gas * dp if mbs and gas else None)
    if gbs and mbs and gas is None:
        gas = gbs // (mbs * dp) if gbs % (mbs * dp) == 0 else None
    engine = "megatron-deepspeed" if header.get("deepspeed") else "megatron"
    record = Results(
        source="megatron-log", log_file=str(path.resolve()), run_name=path.stem,
        strategy=f"{engine}-tp{tp}-pp{pp}" + (f"-cp{cp}" if cp > 1 else ""),
        optim="?", model=ModelRecord(name=name.get("size") or size_label(n_params), params_model=n_params,
                          **logged_shape(header)),
        config=ConfigRecord(world_size=world, dp=dp, tp=tp, pp=pp, micro_batch_size=mbs, grad_accum=gas,
                            global_batch_size=gbs, seq_len=seq, checkpointing=ckpt, token_budget=token_budget,
                            precision=header.get("precision"),
                            extra={"rampup_batch_size": header.get("rampup"), "from_header": sorted(header),
                                   "context_parallel": cp,
                                   "recompute": header.get("recompute"),
                                   "sequence_parallel": bool(header.get("sequence_parallel"))}))
    record.loss_history, record.eval_history = histories(log["launches"], seq, header.get("log_interval"))
    # a ramp-up: only iterations at the final global batch size are the run's speed (per-line GBS when logged); the
    # first of each launch carry its start-up
    at_final = [[e for e in launch["iterations"] if e["gbs"] in (None, gbs)] for launch in launches]
    measured = [e for its in at_final for e in its[skip_first:]] or [e for its in at_final for e in its]
    if not measured:
        record.status, record.error = ("OOM", log["oom"][:300]) if log["oom"] else (
            "fail", "no 'elapsed time per iteration' line in the log")
        return record
    if not gbs:
        raise HfscaleError(f"{path.name}: no global batch size in the log or MBS/GAS in the name; rename or pass them")
    s_per_iter = sum(e["s"] for e in measured) / len(measured)
    reported = [e["tflops"] for e in measured if e["tflops"] is not None]
    tokens_per_s = gbs * seq / s_per_iter
    days, gpu_days = days_to_train(token_budget, tokens_per_s, world)
    record.status = "ok"
    record.perf = PerfRecord(s_per_iter=s_per_iter, tokens_per_s=tokens_per_s, tokens_per_s_per_gpu=tokens_per_s / world,
                             samples_per_s=gbs / s_per_iter,
                             tflops_per_gpu_bigscience=bigscience_tflops_per_gpu(n_params, seq, gbs, s_per_iter, world,
                                                                                 ckpt),
                             days_to_budget=days, gpu_days_to_budget=gpu_days,
                             extra={"iterations_averaged": len(measured),
                                    "iterations_skipped": len(log["iteration_s"]) - len(measured),
                                    "launches": len(log["launches"]),
                                    # the log's own figure over the same iterations (None: it prints none)
                                    "tflops_per_gpu_reported": sum(reported) / len(reported) if reported else None})
    return record


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
