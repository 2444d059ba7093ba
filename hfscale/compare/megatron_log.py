"""What a Megatron-LM / Megatron-DeepSpeed training log says, read line by line (`hfscale import-logs` makes results
of it: compare/megatron.py).

A log's iteration lines look like
    iteration      200/  292968 | ... | elapsed time per iteration (ms): 61236.4 | ... | global batch size:   512 |
    lm loss: 6.527E+00 | ...
Its header is Megatron's "using world size: 64, data-parallel-size: 1, tensor-model-parallel size: 4,
pipeline-model-parallel size: 16" line and its "arguments" block (`parse_header`); BigScience-style file names carry
sizes too (`parse_name`). Launchers' line prefixes (srun --label, torchrun --tee, timestamps) are read past, a log
several launches appended to is read launch by launch (`split_launches`), and the loss and validation lines become
curves in the form of an hfscale run's (`histories`). Pure text in, dicts out: no file is read here.
"""

import re

from ..errors import HfscaleError
from ..run.outcome import OOM_MARKERS

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
# "using world size: 16, data-parallel-size: 1, tensor-model-parallel size: 1, pipeline-model-parallel size: 16"
# (newer Megatron: "data-parallel size", and a context-parallel size)
HEADER_SIZES = re.compile(r"(world|data-parallel|context-parallel|tensor-model-parallel|pipeline-model-parallel)"
                          r"[- ]size:\s*(\d+)")
HEADER_KEYS = {"world": "world", "data-parallel": "dp", "context-parallel": "cp", "tensor-model-parallel": "tp",
               "pipeline-model-parallel": "pp"}
ARGUMENT = re.compile(r"^\s*([a-z_][a-z0-9_]*) \.{2,} (.*?)\s*$")  # "  seq_length ....... 2048" in the arguments block
ARGUMENT_KEYS = {"world_size": "world", "data_parallel_size": "dp", "context_parallel_size": "cp",
                 "tensor_model_parallel_size": "tp",
                 "pipeline_model_parallel_size": "pp", "seq_length": "seq_len", "global_batch_size": "gbs",
                 "micro_batch_size": "mbs", "num_layers": "n_layer", "hidden_size": "hidden",
                 "num_attention_heads": "n_head", "ffn_hidden_size": "ffn", "max_position_embeddings": "positions",
                 "padded_vocab_size": "vocab", "log_interval": "log_interval", "num_query_groups": "query_groups",
                 # the interleaved schedule: Megatron prints both once either is given (None otherwise)
                 "virtual_pipeline_model_parallel_size": "vp",
                 "num_layers_per_virtual_pipeline_stage": "layers_per_virtual_stage",
                 "kv_channels": "head_dim"}  # a head's width (Megatron sets it to hidden / heads unless given)
# the arguments that make a Megatron model Llama-shaped (hfscale's llama family) when all are on; with add_qkv_bias
# too (Megatron's Qwen2 recipes), the qwen2 family's shape; with qk_layernorm (its Qwen3 recipes), the qwen3 family's
LLAMA_ARGUMENTS = {"swiglu": "swiglu", "group_query_attention": "gqa",
                   "untie_embeddings_and_output_weights": "untied", "disable_bias_linear": "no_bias",
                   "add_qkv_bias": "qkv_bias", "qk_layernorm": "qk_norm"}
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


def _fraction(value: str) -> float | None:
    """A dropout probability as the arguments block prints it (None where it prints none)."""
    try:
        return float(value)
    except ValueError:
        return None


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
        elif key == "use_distributed_optimizer" and _truthy(value):
            found["distributed_optimizer"] = True
        elif key == "use_flash_attn" and _truthy(value):
            found["flash_attention"] = True
        elif key == "attention_backend":  # Megatron-Core's: AttnBackend.auto/flash/fused pick a fused kernel
            found["flash_attention"] = not any(word in value.lower() for word in ("local", "unfused"))
        elif key in ("hidden_dropout", "attention_dropout") and _fraction(value) is not None:
            found["dropout"] = max(found.get("dropout", 0.0), _fraction(value))  # masks kept where either is on
        elif key == "position_embedding_type" and "alibi" in value.lower():
            found["alibi"] = True  # BLOOM's positions: no learned table
        elif key == "position_embedding_type" and "rope" in value.lower():
            found["rope"] = True
        elif key in LLAMA_ARGUMENTS and _truthy(value):
            found[LLAMA_ARGUMENTS[key]] = True
        elif key == "normalization" and "rms" in value.lower():
            found["rmsnorm"] = True
        elif key == "num_experts" and _truthy(value):
            found["other_architecture"] = True  # mixture of experts: not a model the formulas know
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
