"""hfscale's one training script: `accelerate launch hfscale/train.py --strategy zero1`.

Reads top to bottom like transformers' run_clm.py: args -> logging -> seed -> data -> model -> Trainer ->
train -> results. Every TrainingArguments flag works; `--strategy` and `--optim` choose the two axes.
"""

import os
import sys

if __package__ in (None, ""):  # run as a file (accelerate launch hfscale/train.py): make the package importable,
    # and take hfscale/ itself off the path, so its modules and subpackages never shadow top-level ones
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [os.path.dirname(_here), *(p for p in sys.path if os.path.abspath(p or ".") != _here)]
    __package__ = "hfscale"

import contextlib  # noqa: E402
import logging  # noqa: E402
import platform  # noqa: E402
import socket  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from hfscale.errors import HfscaleError, exit_on_user_error  # noqa: E402

logger = logging.getLogger("hfscale")


# Library output that says nothing about the run, each matched precisely (every other warning stays visible):
WARNING_NOISE = [
    # torch 2.13 deprecates the *_tensor collectives that DeepSpeed 0.19 and FSDP2 still call, on every step
    (FutureWarning, r"`torch\.distributed\.\w+` is deprecated"),
]
LOG_NOISE = {
    # bitsandbytes' optional CPU 4-bit kernels (the `kernels` package); hfscale uses no 4-bit layers
    "bitsandbytes.backends.cpu.ops": "kernels-community",
    # torchao's optional compiled kernels (MX-FP8, CUTLASS) that do not load into a torch without them; AdamW8bit
    # (fsdp* x adamw_8bit) is torch.compile'd and uses none of them
    "torchao": "Failed to load",
    # torchao registers two Enums with torch.compile the pre-2.13 way, once per process
    "torch.utils._pytree": "is an Enum subclass and is now natively supported by torch.compile",
}


class _DropMessage(logging.Filter):
    def __init__(self, fragment: str):
        super().__init__()
        self.fragment = fragment

    def filter(self, record: logging.LogRecord) -> bool:
        return self.fragment not in record.getMessage()


def quiet_libraries() -> None:
    """Drop the library noise above, before the libraries are imported."""
    import warnings

    for category, pattern in WARNING_NOISE:
        warnings.filterwarnings("ignore", message=pattern, category=category)
    for name, fragment in LOG_NOISE.items():
        logging.getLogger(name).addFilter(_DropMessage(fragment))


def setup_logging(args) -> None:
    """hfscale's lines at INFO on rank 0; the libraries at WARNING (transformers' INFO is a config dump per model and
    per save), errors only on the other ranks."""
    import datasets
    import transformers

    level = logging.INFO if args.process_index == 0 else logging.WARNING
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=level, stream=sys.stdout)
    transformers.utils.logging.set_verbosity(logging.WARNING if args.process_index == 0 else logging.ERROR)
    datasets.utils.logging.set_verbosity(logging.WARNING)
    datasets.disable_progress_bars()


def precision(args) -> str:
    """The precision the run really computes in (parallel/distributed.run_precision): recorded, named in the run,
    and the peak MFU divides by."""
    from hfscale.parallel.distributed import run_precision, tf32_matmuls

    return run_precision(args.bf16, args.fp16, getattr(args, "mixed_precision", None), args.tf32,
                         tf32_matmuls(args.device.type == "cuda"))


def run_name(model_args, args, state) -> str:
    ckpt = "-ac" if activation_checkpointing(args) else ""
    return (f"{state.strategy.name}-{state.optim}-{model_args.name}-dp{args.world_size}-"
            f"mbs{args.per_device_train_batch_size}-gas{args.gradient_accumulation_steps}-seq{state.seq_len}{ckpt}-"
            f"{precision(args)}")


def activation_checkpointing(args) -> bool:
    """Recompute activations in the backward pass (--activation_checkpointing, or the deprecated gradient_ alias)."""
    return bool(getattr(args, "activation_checkpointing", None) or getattr(args, "gradient_checkpointing", None))


def prepare_output_dir(args, state, name: str) -> None:
    """Default run directory runs/<run name>; a finished run's results are not overwritten unless asked."""
    from hfscale.run.results import RESULTS_FILE, read_results

    if state.auto_output_dir:
        args.output_dir = str(Path("runs") / name)
    if args.run_name is None:
        args.run_name = name
    existing = Path(args.output_dir) / RESULTS_FILE
    if existing.is_file() and read_results(existing).get("status") == "ok" and not args.overwrite_output_dir:
        raise HfscaleError(f"{args.output_dir} already holds the results of a finished run; "
                           "choose another --output_dir or pass --overwrite_output_dir")
    target = Path(args.output_dir).resolve()
    parent = target if target.is_dir() else target.parent
    while not parent.exists():
        parent = parent.parent
    try:  # os.access says yes to root everywhere; only creating something proves it (removed at once)
        os.rmdir(tempfile.mkdtemp(dir=parent, prefix=".hfscale-write-check-"))
    except OSError as err:
        raise HfscaleError(f"--output_dir {args.output_dir} is not writable ({err.strerror})") from None


def resume_checkpoint(args, state) -> str | None:
    """The complete checkpoint to resume from (or None); interrupted saves are set aside by rank 0 first."""
    from hfscale.run.checkpoints import identity, resolve_resume, set_aside_incomplete

    state.checkpoint_identity = identity(state.strategy.name, state.optim, args.world_size, state.shape)
    state.resume_from = resolve_resume(args.resume_from_checkpoint, Path(args.output_dir), state.checkpoint_identity)
    if args.process_index == 0 and Path(args.output_dir).is_dir():
        set_aside_incomplete(Path(args.output_dir))
    return state.resume_from


def environment(args) -> dict:
    import accelerate
    import datasets
    import torch
    import transformers

    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__, "accelerate": accelerate.__version__,
                "datasets": datasets.__version__}
    for optional in ("deepspeed", "bitsandbytes", "torchao"):
        try:
            versions[optional] = __import__(optional).__version__
        except Exception:  # an absent or broken optional library is reported, not fatal
            versions[optional] = None
    on_cuda = args.device.type == "cuda"  # the route the run took (--use_cpu on a GPU host is a CPU run)
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", args.world_size)) or 1
    return {
        "versions": versions,
        "hostname": socket.gethostname(),
        "device_type": "cuda" if on_cuda else "cpu",
        "device_name": torch.cuda.get_device_name() if on_cuda else f"CPU ({platform.machine()}, {torch.get_num_threads()} threads/process)",
        "device_count": torch.cuda.device_count() if on_cuda else os.cpu_count(),
        "world_size": args.world_size,
        # the launcher's view of the nodes (torchrun/accelerate set LOCAL_WORLD_SIZE: processes on this node)
        "processes_per_node": per_node,
        "nodes": max(1, args.world_size // per_node),
    }


def peak_tflops(args, env: dict) -> tuple[float | None, str, float | None]:
    """(peak used for MFU, where it came from, measured peak or None). Never a GPU peak on a CPU."""
    from hfscale.formulas.peaks import measure_peak_tflops, table_peak

    on_cuda = env["device_type"] == "cuda"
    measured = None
    if args.measure_peak or not on_cuda:
        device = f"cuda:{args.local_process_index}" if on_cuda else "cpu"
        measured = measure_peak_tflops(device, precision(args), seconds=0.5)
    if args.peak_tflops:
        return args.peak_tflops, "--peak_tflops", measured
    table = table_peak(env["device_name"], precision(args)) if on_cuda else None
    if table:
        return table, f"datasheet {env['device_name']} {precision(args)}", measured
    if measured is None:  # a GPU the table does not know, and nothing measured: no MFU rather than a wrong one
        return None, f"unknown device {env['device_name']!r}: pass --peak_tflops or --measure_peak", None
    return measured, "measured matmul peak on this device", measured


def load_data(model_args, data_args, args, vocab_size: int, seq_len: int, validation: dict | None):
    """(tokenizer, training blocks, validation blocks or None). The default tokenizer learns from all the text."""
    from hfscale.run import data

    with args.main_process_first(local=True, desc="tokenize and pack"):
        raw = data.load_raw_text(data_args)
        tokenizer = data.load_tokenizer(data_args, model_args.model_name_or_path, vocab_size, raw,
                                        model_args.trust_remote_code)
        if len(tokenizer) > vocab_size:
            raise HfscaleError(f"the tokenizer has {len(tokenizer)} tokens but the model's vocabulary is {vocab_size}; "
                               "pass --vocab_size or another --tokenizer_name")
        train_raw, val_raw = data.split_raw_text(raw, data_args, validation)
        held_out = validation is not None and "percentage" in validation
        blocks = data.packed_dataset(data_args, tokenizer, train_raw, seq_len, {"train": validation} if held_out else None)
        eval_blocks = None if val_raw is None else data.packed_dataset(
            data_args, tokenizer, val_raw, seq_len, {"validation": validation}, what="the validation text")
    return tokenizer, blocks, eval_blocks


def zero3_init(args, strategy) -> bool:
    """ZeRO-3 partitions the model as it is built (deepspeed.zero.Init), unless the accelerate config's
    `zero3_init_flag` (or `accelerate launch --zero3_init_flag false`) turns that off."""
    plugin = getattr(args, "deepspeed_plugin", None)
    return strategy is not None and strategy.zero_stage == 3 and plugin is not None and plugin.is_zero3_init_enabled()


def rank0_builds(args, strategy) -> bool:
    """Only rank 0 builds the whole model; the engine shards it out from there and the other ranks build theirs
    without weights: FSDP with cpu_ram_efficient_loading (hfscale's default; fsdp2_prepare_model broadcasts rank 0's
    weights), and ZeRO-3 with zero3_init_flag for models hfscale initialises (models.partition_zero3)."""
    if strategy is None or not strategy.rank0_builds:
        return False
    if strategy.engine == "fsdp":
        return str((args.fsdp_config or {}).get("cpu_ram_efficient_loading")).lower() == "true"
    return zero3_init(args, strategy)


@contextlib.contextmanager
def plain_construction(args, strategy):
    """transformers builds under zero.Init whenever the Trainer's DeepSpeed config is ZeRO-3 (from_pretrained,
    from_config); with zero3_init_flag off, hide that config while the model is built."""
    if strategy is None or strategy.zero_stage != 3 or zero3_init(args, strategy):
        yield
        return
    from transformers.integrations.deepspeed import set_hf_deepspeed_config, unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        set_hf_deepspeed_config(args.hf_deepspeed_config)  # TrainingArguments set it (--deepspeed)


def build(model_args, args, shape, tokenizer, strategy=None):
    """The model, on every rank: whole, or (rank0_builds, ranks other than 0) without weights until the engine
    shards rank 0's; under ZeRO-3 with zero3_init_flag, partitioned before it returns. strategy None: whole
    everywhere (benchmarks/plain_trainer.py)."""
    import torch

    from hfscale.run.models import build_model, load_pretrained, partition_zero3, pretrained_on_meta

    if model_args.model_name_or_path and strategy is not None and strategy.zero_stage == 3:
        # transformers' own ZeRO-3 loading: every rank builds under zero.Init and streams the checkpoint's tensors
        # into its partitions (rank 0's values broadcast); no RNG involved, so the weights are the checkpoint's
        with plain_construction(args, strategy):
            return load_pretrained(model_args.model_name_or_path, model_args.trust_remote_code,
                                   model_args.attn_implementation)[0]
    without_weights = rank0_builds(args, strategy) and args.process_index != 0
    if model_args.model_name_or_path:
        if without_weights:
            model = pretrained_on_meta(model_args.model_name_or_path, model_args.trust_remote_code,
                                       model_args.attn_implementation)
        else:
            model, _ = load_pretrained(model_args.model_name_or_path, model_args.trust_remote_code,
                                       model_args.attn_implementation)
    else:
        with torch.device("meta" if without_weights else "cpu"):
            model = build_model(shape, args.seed, model_args.attn_implementation, model_args.dropout)
        model.config.eos_token_id = model.config.bos_token_id = tokenizer.eos_token_id
    if without_weights:
        # Uninitialised host tensors, not meta ones: their pages are never touched (no resident memory), but each
        # parameter gets an address of its own. accelerate maps the optimizer's parameters to the sharded ones by
        # data_ptr, and on the meta device every data_ptr is 0: rank 1's optimizer stepped one parameter for all
        # (seen: fsdp's losses left ddp's after the first update). to_empty unties shared weights; tie them again.
        model = model.to_empty(device="cpu")
        model.tie_weights()
    if zero3_init(args, strategy):
        from transformers.integrations.deepspeed import deepspeed_config

        model = partition_zero3(model, deepspeed_config())
    return model


def model_shape(model_args):
    if model_args.shape is not None:
        return model_args.shape
    from hfscale.run.models import pretrained_shape

    return pretrained_shape(model_args.model_name_or_path, model_args.trust_remote_code)


def base_record(model_args, data_args, args, state, model, env: dict) -> dict:
    from hfscale.formulas.metrics import param_count, param_count_bigscience
    from hfscale.run.models import parameter_count

    shape = state.shape
    return {
        "run_name": args.run_name, "output_dir": args.output_dir, "strategy": state.strategy.name, "optim": state.optim,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": {"name": model_args.name, **shape.__dict__, "ffn_size": shape.ffn_size,
                  "params_formula": param_count(shape),
                  # the BigScience size formula; BLOOM (ALiBi) has no position table, so no s x h term for it
                  "params_bigscience": param_count_bigscience(shape.n_layer, shape.hidden,
                                                              shape.positions if shape.family == "gpt2" else 0,
                                                              shape.vocab),
                  "params_model": parameter_count(model),
                  "params_trainable": parameter_count(model, trainable_only=True)},
        "config": {"world_size": args.world_size, "micro_batch_size": args.per_device_train_batch_size,
                   "grad_accum": args.gradient_accumulation_steps,
                   "global_batch_size": args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size,
                   "seq_len": state.seq_len, "checkpointing": activation_checkpointing(args), "precision": precision(args),
                   "max_steps": args.max_steps, "seed": args.seed, "learning_rate": args.learning_rate,
                   "recipe": state.recipe,
                   "token_budget": args.token_budget, "dataset": data_args.train_files or data_args.dataset,
                   "validation": state.validation,
                   "powersgd_rank": args.powersgd_rank, "powersgd_warmup_steps": args.powersgd_warmup_steps},
        "environment": env,
        "estimate": memory_estimate(args, state, model),
    }


def memory_estimate(args, state, model) -> dict:
    """What hfscale.formulas.memory predicts for this very run, per rank, recorded beside what it measures."""
    from hfscale.files import load_json
    from hfscale.formulas.memory import rank_memory
    from hfscale.parallel.strategies import memory_layout

    ds_json = None
    if state.strategy.engine == "deepspeed":
        ds_json = args.deepspeed if isinstance(args.deepspeed, dict) else load_json(args.deepspeed)
    attention = getattr(model.config, "_attn_implementation", None)
    per_node = state.mesh[1] if state.mesh else args.world_size  # HSDP's mesh: (nodes, processes per node)
    mem = rank_memory(state.shape, memory_layout(state.strategy, state.shape.hidden, ds_json), optim=state.optim,
                      precision="fp32" if precision(args) == "tf32" else precision(args),
                      ranks=state.strategy.shard_ranks(args.world_size, per_node),
                      micro_batch=args.per_device_train_batch_size, seq=state.seq_len,
                      checkpointing=activation_checkpointing(args), attention=attention,
                      grad_accum=args.gradient_accumulation_steps)
    return {**mem.as_dict(), "attention": attention}


def reentrant_checkpointing(args) -> bool:
    """--gradient_checkpointing_kwargs '{"use_reentrant": true}': the whole block is recomputed (formulas/metrics.py)."""
    kwargs = getattr(args, "gradient_checkpointing_kwargs", None) or {}
    return bool(kwargs.get("use_reentrant", False))


def evaluating(eval_strategy) -> bool:
    """An evaluation schedule is set (--eval_strategy steps|epoch)."""
    return str(getattr(eval_strategy, "value", eval_strategy)) != "no"


def make_trainer(model_args, args, state, model, blocks, eval_blocks, env, record, construction=None):
    from transformers import default_data_collator

    from hfscale.run.measure import Meter, MeasureCallback, StepMemory, TensorBoardWriter
    from hfscale.parallel.hooks import PowerSGDConfig
    from hfscale.formulas.metrics import tokens_per_step
    from hfscale.run.trainer import HfscaleTrainer, StrategyCallback

    strategy = state.strategy
    peak, peak_source, measured = peak_tflops(args, env)
    record.update(perf={"peak_tflops": peak, "peak_source": peak_source, "measured_peak_tflops": measured})
    meter = Meter(state.shape, micro_batch=args.per_device_train_batch_size, grad_accum=args.gradient_accumulation_steps,
                  gpus=args.world_size, seq=state.seq_len, checkpointing=activation_checkpointing(args),
                  token_budget=args.token_budget,
                  peak_tflops=peak, warmup_steps=args.perf_warmup_steps, on_cuda=env["device_type"] == "cuda",
                  full_recompute=reentrant_checkpointing(args)) \
        if args.measure else None
    is_main = args.process_index == 0
    tensorboard = None
    if state.tensorboard and is_main:
        tensorboard = TensorBoardWriter(args.output_dir, {**record.data["config"], "strategy": strategy.name,
                                                          "optim": state.optim, "model": model_args.name})
    step_memory = StepMemory(env["device_type"] == "cuda")
    trainer = HfscaleTrainer(model=model, args=args, train_dataset=blocks, eval_dataset=eval_blocks,
                             data_collator=default_data_collator,
                             strategy=strategy, mesh=state.mesh, meter=meter, step_memory=step_memory,
                             tokens_per_step=tokens_per_step(args.per_device_train_batch_size,
                                                             args.gradient_accumulation_steps, args.world_size,
                                                             state.seq_len),
                             checkpoint_identity=state.checkpoint_identity,
                             on_checkpoint=lambda info: record.note_checkpoint(**info))
    powersgd = PowerSGDConfig(args.powersgd_rank, args.powersgd_warmup_steps) if strategy.comm_hook == "powersgd" else None
    trainer.add_callback(StrategyCallback(trainer, optim=state.optim, total_params=record.data["model"]["params_model"],
                                          powersgd=powersgd, launcher_world_size=state.launcher_world_size,
                                          on_accelerator=env["device_type"] == "cuda", record=record,
                                          resume_from=state.resume_from, construction=construction))
    trainer.add_callback(MeasureCallback(meter, record, tensorboard, is_main, step_memory))
    return trainer, meter


def finish(trainer, meter, record, args, env, trainer_metrics: dict) -> None:
    """Whole-run figures, peak memory over all ranks, final weights fingerprint; then the results file."""
    import torch

    from hfscale.run.measure import figures_dict, memory_now
    from hfscale.formulas.metrics import tokens_per_step
    from hfscale.parallel.verify import probe_logits, weights_fingerprint

    figures, steps = meter.whole_run() if meter else (None, 0)
    memory = memory_now(env["device_type"] == "cuda")
    my_steps = trainer.step_memory.summary()
    per_rank = [my_steps]
    if torch.distributed.is_initialized():
        names = sorted(memory)
        peak = torch.tensor([memory[n] for n in names], dtype=torch.float64, device=args.device)
        torch.distributed.all_reduce(peak, op=torch.distributed.ReduceOp.MAX)
        memory = {n: v for n, v in zip(names, peak.tolist())}
        per_rank = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(per_rank, my_steps)
    memory = {**record.data.get("memory", {}), **memory, "step_per_rank": per_rank}
    cfg = record.data["config"]
    record.update(perf={**record.data["perf"], **figures_dict(figures), "measured_steps": steps,
                        "warmup_steps": args.perf_warmup_steps,
                        "tokens_per_step": tokens_per_step(cfg["micro_batch_size"], cfg["grad_accum"], cfg["world_size"], cfg["seq_len"])},
                  memory=memory, steps=trainer.state.global_step, trainer_metrics=trainer_metrics,
                  epoch=trainer.state.epoch, samples_seen=trainer.state.global_step * cfg["global_batch_size"])
    if args.fingerprint_weights:
        record.update(final_weights=weights_fingerprint(trainer.model, trainer.strategy.engine),
                      probe_logits=probe_logits(trainer.model, record.data["model"]["vocab"], args.device))
    if args.record_batches:
        digests = [trainer.batch_digests]
        if torch.distributed.is_initialized():
            digests = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(digests, trainer.batch_digests)
        record.update(batch_digests=digests)


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    from hfscale.parallel.distributed import shutdown

    quiet_libraries()
    try:
        run(argv)
    except BaseException:
        shutdown(wait_for_all=False)
        raise
    if shutdown() and __name__ == "__main__":
        exit_now()


def exit_now() -> None:
    """A finished rank of a launched job leaves without interpreter finalization.

    Even after destroy_process_group, gloo can still hold AsyncWork objects with tensors that Python references;
    finalizing the interpreter then destroys them without the GIL and aborts the rank (exit -6, "terminate called
    without an active exception") after its results were written - seen in ~3% of 2-process CPU runs here, and
    described in pytorch/pytorch#179291. Everything hfscale writes is flushed and closed by now."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def check_args(argv: list[str] | None):
    """Every check of the command line that needs no data, model weights or output directory: the flags parse, the
    names exist, the choices fit together, the sizes are possible. Pure; raises HfscaleError (and only that).
    Returns (model args, data args, TrainingArguments keywords, RunState)."""
    from hfscale.formulas.metrics import param_count
    from hfscale.run.args import RunState, check_hyperparameters, check_model_tokenizer, parse_args
    from hfscale.run.models import resolve_seq_len
    from hfscale.run.recipes import apply_defaults

    from hfscale.run.data import validation_plan

    model_args, data_args, training, decided = parse_args(argv)
    shape = model_shape(model_args)
    check_model_tokenizer(model_args, data_args)
    training, recipe = apply_defaults(training, decided["explicit"], param_count(shape), decided["optim"])
    check_hyperparameters(training)
    state = RunState(shape=shape, seq_len=resolve_seq_len(shape, data_args.seq_len), recipe=recipe,
                     validation=validation_plan(data_args, evaluating(training["eval_strategy"])), **decided)
    return model_args, data_args, training, state


def run(argv: list[str] | None) -> None:
    """One training run, start to results file."""
    from hfscale.parallel.distributed import setup_processes
    from hfscale.run.args import build_training_arguments

    model_args, data_args, training, state = check_args(argv)
    args = build_training_arguments(training, setup_processes(state.strategy, training["use_cpu"]))  # group starts
    setup_logging(args)
    logger.info("training recipe (flag = yours, default = hfscale's pretraining recipe, docs/compare.md): %s",
                ", ".join(f"{k}={v} ({src})" for k, (v, src) in state.recipe.items()))
    name = run_name(model_args, args, state)
    prepare_output_dir(args, state, name)

    from transformers import set_seed

    from hfscale.run.measure import ConstructionMemory, print_summary
    from hfscale.run.results import RunRecord

    resume = resume_checkpoint(args, state)
    set_seed(args.seed)
    tokenizer, blocks, eval_blocks = load_data(model_args, data_args, args, state.shape.vocab, state.seq_len,
                                               state.validation)
    construction = ConstructionMemory()
    construction.start()
    model = build(model_args, args, state.shape, tokenizer, state.strategy)
    construction.read(built=True)  # before StepMemory resets the high-water mark; read again once the engine has sharded
    env = environment(args)
    record = RunRecord(args.output_dir, base_record(model_args, data_args, args, state, model, env),
                       args.process_index == 0)
    trainer, meter = make_trainer(model_args, args, state, model, blocks, eval_blocks, env, record, construction)
    record.update(resumed_from=resume)
    try:
        output = trainer.train(resume_from_checkpoint=resume)
        if eval_blocks is not None and not evaluating(args.eval_strategy):
            trainer.evaluate()  # validation text given, no evaluation schedule: the final model's eval loss
    except HfscaleError as err:
        record.update(status="refused", error=str(err))
        record.flush()
        raise
    except BaseException as err:
        record.update(status="fail", error=f"{type(err).__name__}: {err}")
        record.flush()
        raise
    finish(trainer, meter, record, args, env, output.metrics)
    record.update(status="ok", finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    record.flush()
    measure_callback(trainer).close()  # the TensorBoard events are complete
    if args.process_index == 0:
        print_summary(record.data)
    if args.push_to_hub:  # every rank: the Trainer's final save is collective under ZeRO-3/FSDP
        trainer.push_to_hub(commit_message=f"hfscale {args.run_name}: model, results.json, TensorBoard events")


def measure_callback(trainer):
    from hfscale.run.measure import MeasureCallback

    return next(c for c in trainer.callback_handler.callbacks if isinstance(c, MeasureCallback))


if __name__ == "__main__":
    main()
