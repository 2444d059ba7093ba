"""hfscale's one training script: `accelerate launch hfscale/train.py --strategy zero1`.

Reads top to bottom like transformers' run_clm.py: args -> logging -> seed -> data -> model -> Trainer ->
train -> results. Every TrainingArguments flag works; `--strategy` and `--optim` choose the two axes.
"""

import gc
import os
import sys

if __name__ == "__main__":  # a launched rank: no collections through start-up's imports (hfscale/run/garbage.py)
    gc.disable()
if __package__ in (None, ""):  # run as a file (accelerate launch hfscale/train.py): make the package importable,
    # and take hfscale/ itself off the path, so its modules and subpackages never shadow top-level ones
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [os.path.dirname(_here), *(p for p in sys.path if os.path.abspath(p or ".") != _here)]
    __package__ = "hfscale"

import logging  # noqa: E402
import time  # noqa: E402
from contextlib import contextmanager, nullcontext  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from transformers import default_data_collator, set_seed  # noqa: E402

from hfscale.errors import HfscaleError, exit_on_user_error  # noqa: E402
from hfscale.files import check_writable_dir, exclusive_dir  # noqa: E402
from hfscale.formulas.metrics import param_count  # noqa: E402
from hfscale.parallel.distributed import (  # noqa: E402
    restate_matmul_precision, setup_processes, shutdown, tensor_parallel_config, tf32_matmuls)
from hfscale.parallel.tensor_parallel import apply_tensor_parallel  # noqa: E402
from hfscale.run.args import (RunState, build_training_arguments, check_model, check_model_tokenizer,  # noqa: E402
                              check_output_dir, parse_args, training_flag_defaults)
from hfscale.run.checks import (OPTIMIZER_FLAGS, check_hyperparameters, check_trainer_combinations,  # noqa: E402
                                ignored_optimizer_flags)
from hfscale.run.planning import plan_training  # noqa: E402
from hfscale.parallel.hooks import PowerSGDConfig  # noqa: E402
from hfscale.parallel.fingerprint import probe_logits, weights_fingerprint  # noqa: E402
from hfscale.run.checkpoints import LATEST, data_position, identity, resolve_resume, set_aside_unusable  # noqa: E402
from hfscale.run.collectives import CollectiveCounter  # noqa: E402
from hfscale.run.host_syncs import HostSyncCallback  # noqa: E402
from hfscale.run.profile import StepProfiler  # noqa: E402
from hfscale.run.construction import build, load_data  # noqa: E402
from hfscale.run.data import position_identity, validation_plan  # noqa: E402
from hfscale.run.float8 import convert as convert_to_float8  # noqa: E402
from hfscale.run import garbage  # noqa: E402
from hfscale.run.logs import quiet_libraries, setup_logging  # noqa: E402
from hfscale.run.measure import MeasureCallback, Meter, TensorBoardWriter  # noqa: E402
from hfscale.run.memory import ConstructionMemory, StepMemory, memory_now  # noqa: E402
from hfscale.run.summary import print_summary  # noqa: E402
from hfscale.run.forward import use_training_forward  # noqa: E402
from hfscale.run.recipes import apply_defaults  # noqa: E402
from hfscale.run.stopping import SIGNAL, StopOnSignal  # noqa: E402
from hfscale.run.record import base_results, environment, peak_tflops  # noqa: E402
from hfscale.run.results import RunRecord, refuse_finished_run  # noqa: E402
from hfscale.runplan import compute_precision  # noqa: E402
# Lazy, in make_trainer: hfscale.run.trainer, i.e. transformers' Trainer, whose import pulls in torchao and
# bitsandbytes - their import-time noise is filtered only once main() has called quiet_libraries().

logger = logging.getLogger("hfscale")


def run_name(model_args, plan) -> str:
    ckpt = "-ac" if plan.activation_checkpointing else ""
    tp = f"-tp{plan.tp}" if plan.tp > 1 else ""
    fused = "-flce" if plan.fused_linear_cross_entropy else ""
    return (f"{plan.strategy.name}-{plan.optimizer.name}-{model_args.name}-dp{plan.data_parallel_size}{tp}-"
            f"mbs{plan.per_device_train_batch_size}-gas{plan.gradient_accumulation_steps}-seq{plan.seq_len}{ckpt}-"
            f"{'fp8' if plan.float8 else plan.precision}{fused}")


@contextmanager
def output_dir_for(args, state, name: str):
    """The run's folder (default runs/<run name>), held by rank 0 for the run (files.exclusive_dir: a second run into
    it is refused while this one lives); a finished run's results are not overwritten unless asked."""
    if state.auto_output_dir:
        args.output_dir = str(Path("runs") / name)
    if args.run_name is None:
        args.run_name = name
    check_writable_dir(args.output_dir, "--output_dir")
    with exclusive_dir(args.output_dir, "--output_dir") if args.process_index == 0 else nullcontext():
        # read under the lock: a run ending now has written it
        refuse_finished_run(args.output_dir, args.overwrite_output_dir, bool(args.resume_from_checkpoint))
        yield


def resume_checkpoint(args, state) -> str | None:
    """The complete, intact checkpoint to resume from (or None); rank 0 sets interrupted saves and damaged checkpoints
    aside first."""
    state.resume_from = resolve_resume(args.resume_from_checkpoint, Path(args.output_dir), state.checkpoint_identity,
                                       not args.ignore_data_skip)
    if args.process_index == 0 and Path(args.output_dir).is_dir():
        set_aside_unusable(Path(args.output_dir))
    return state.resume_from


def reentrant_checkpointing(args) -> bool:
    """--gradient_checkpointing_kwargs '{"use_reentrant": true}': the whole block is recomputed (formulas/metrics.py)."""
    kwargs = getattr(args, "gradient_checkpointing_kwargs", None) or {}
    return bool(kwargs.get("use_reentrant", False))


def evaluating(eval_strategy) -> bool:
    """An evaluation schedule is set (--eval_strategy steps|epoch)."""
    return str(getattr(eval_strategy, "value", eval_strategy)) != "no"


def make_trainer(model_args, args, state, model, blocks, eval_blocks, record, construction=None, parallelism=None):
    from hfscale.run.callbacks import GarbageCollectionCallback, StrategyCallback
    from hfscale.run.trainer import HfscaleTrainer

    plan, results = state.plan, record.results
    on_cuda = plan.on_cuda
    record.update(perf=peak_tflops(args, results.environment, plan.precision))
    meter = Meter(plan, token_budget=args.token_budget, peak_tflops=results.perf.peak_tflops,
                  warmup_steps=args.perf_warmup_steps, full_recompute=reentrant_checkpointing(args)) \
        if args.measure else None
    is_main = args.process_index == 0
    tensorboard = None
    if state.tensorboard and is_main:
        tensorboard = TensorBoardWriter(args.output_dir, {**results.config.to_dict(), "strategy": plan.strategy.name,
                                                          "optim": plan.optimizer.name, "model": model_args.name})
    step_memory = StepMemory(on_cuda)
    trainer = HfscaleTrainer(model=model, args=args, train_dataset=blocks, eval_dataset=eval_blocks,
                             data_collator=default_data_collator, plan=plan, meter=meter, step_memory=step_memory,
                             checkpoint_identity=state.checkpoint_identity, parallelism=parallelism,
                             on_checkpoint=lambda info: record.note_checkpoint(**info))
    powersgd = (PowerSGDConfig(args.powersgd_rank, args.powersgd_warmup_steps)
                if plan.strategy.comm_hook == "powersgd" else None)
    trainer.add_callback(StrategyCallback(trainer, total_params=results.model.params_model, powersgd=powersgd,
                                          record=record, resume_from=state.resume_from, construction=construction))
    trainer.add_callback(GarbageCollectionCallback(args.gc_freq, record))  # after the start-up checks, before the clock starts
    trainer.collectives = CollectiveCounter(args.count_collectives) if args.count_collectives else None
    trainer.host_syncs = HostSyncCallback(plan.device_type) if args.count_host_syncs else None
    if trainer.host_syncs:
        trainer.add_callback(trainer.host_syncs)
    trainer.step_profiler = StepProfiler(args.profile_step, on_cuda, os.path.join(args.output_dir, "profile"),
                                         args.process_index) if args.profile_step else None
    trainer.add_callback(MeasureCallback(meter, record, tensorboard, is_main, step_memory, trainer.collectives,
                                         trainer.step_profiler))
    return trainer, meter


def finish(trainer, meter, record, args, trainer_metrics: dict) -> None:
    """Whole-run figures, peak memory over all ranks, final weights fingerprint; then the results file."""
    results, plan = record.results, trainer.plan
    figures, steps = meter.whole_run() if meter else (None, 0)
    memory = memory_now(plan.on_cuda, trainer.step_memory)
    if torch.distributed.is_initialized():
        names = sorted(memory)
        peak = torch.tensor([memory[n] for n in names], dtype=torch.float64, device=args.device)
        torch.distributed.all_reduce(peak, op=torch.distributed.ReduceOp.MAX)
        memory = {n: v for n, v in zip(names, peak.tolist())}
    for name, value in {**memory, "step_per_rank": gathered(trainer.step_memory.summary())}.items():
        setattr(results.memory, name, value)
    for name, value in (figures.__dict__ if figures else {}).items():
        setattr(results.perf, name, value)
    # the steady state (Meter): from the first logging step after the warm-up; warmup_steps: the steps before it
    results.perf.measured_steps = steps
    results.perf.warmup_steps = meter.timed_from - meter.first_step if figures else args.perf_warmup_steps
    results.perf.tokens_per_step = plan.tokens_per_step
    record.update(steps=trainer.state.global_step, trainer_metrics=trainer_metrics, epoch=trainer.state.epoch,
                  samples_seen=trainer.state.global_step * plan.global_batch_size)
    record.update(tokens_fed=tokens_fed(trainer))
    if args.fingerprint_weights:
        record.update(final_weights=weights_fingerprint(trainer.model, plan.strategy.engine),
                      probe_logits=probe_logits(trainer.model, plan.shape.vocab, args.device))
    if trainer.collectives:
        record.update(communication={"step": args.count_collectives,
                                     "per_rank": gathered(trainer.collectives.collectives)})
    if trainer.host_syncs:
        record.update(host_syncs=trainer.host_syncs.summary())
    if trainer.step_profiler:
        record.update(profile=trainer.step_profiler.summary)
    if args.record_batches:
        record.update(batch_digests=gathered(trainer.batch_digests))


def gathered(value) -> list:
    """Every rank's `value`, in rank order (collective; a process without a group: its own alone)."""
    if not torch.distributed.is_initialized():
        return [value]
    per_rank = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(per_rank, value)
    return per_rank


def tokens_fed(trainer) -> dict:
    """What each rank's data loader handed it over this process's optimizer steps, with the rank's place on the
    tensor-parallel mesh as torch holds it: the tokens of a step, counted apart from the plan that computes them."""
    tp_mesh = trainer.parallelism.device_mesh["tp"] if trainer.parallelism is not None else None
    per_rank = gathered([trainer.tokens_fed, tp_mesh.get_local_rank() if tp_mesh is not None else 0])
    first = trainer.state.global_step if trainer.first_trained_step is None else trainer.first_trained_step
    return {"steps": trainer.state.global_step - first,
            "per_rank": [tokens for tokens, _ in per_rank], "tp_rank": [tp_rank for _, tp_rank in per_rank]}


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    quiet_libraries()
    try:
        with garbage.paused():  # until train begin, where --gc_freq takes over
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


def check_args(argv: list[str] | None, launched: tuple[int, int] | None = None):
    """Every check of the command line that needs no data or model weights: the flags parse, the names exist, the
    choices fit together, the sizes are possible, the --output_dir named can take the run - and the run's plan. Pure
    (leaves nothing on disk); raises HfscaleError (and only that). Returns (model args, data args, TrainingArguments keywords,
    RunState). `launched`: (processes, per node) of a run about to be launched, instead of this process's launcher."""
    model_args, data_args, training, explicit = parse_args(argv)
    shape, seq_len = check_model(model_args, data_args.seq_len)
    check_model_tokenizer(model_args, data_args)
    training, recipe = apply_defaults(training, explicit, param_count(shape), training["optim"])
    check_hyperparameters(training)
    check_output_dir(training)
    training, plan, tensorboard = plan_training(training, shape, seq_len, model_args.attn_implementation, explicit,
                                                model_args.fused_linear_cross_entropy, launched,
                                                model_args.dropout_probability())
    check_trainer_combinations(training, training_flag_defaults())
    state = RunState(plan=plan, tensorboard=tensorboard, auto_output_dir=training["output_dir"] is None,
                     explicit=explicit, recipe=recipe,
                     validation=validation_plan(data_args, evaluating(training["eval_strategy"])))
    data_seed = training["seed"] if training.get("data_seed") is None else training["data_seed"]  # the sampler's
    state.checkpoint_identity = identity(
        plan.strategy.name, plan.optimizer.name, plan.world_size, plan.shape,
        data_position(plan, data_seed, position_identity(data_args, model_args.model_name_or_path, state.validation)))
    if training["resume_from_checkpoint"] not in LATEST:  # a named checkpoint is checked before anything starts
        resolve_resume(training["resume_from_checkpoint"], Path("."), state.checkpoint_identity,
                       not training.get("ignore_data_skip"))
    return model_args, data_args, training, state


def run(argv: list[str] | None) -> None:
    """One training run, start to results file."""
    model_args, data_args, training, state = check_args(argv)
    args = build_training_arguments(training, setup_processes(state.plan))  # the process group starts here
    restate_matmul_precision()  # transformers' TF32 switch, readable by inductor's autotuning
    # what torch really computes in, read back now that transformers has set it up (TF32 under --torch_compile)
    state.plan = state.plan.but(precision=compute_precision(args.bf16, args.fp16, getattr(args, "mixed_precision", None),
                                                            args.tf32, tf32_matmuls(state.plan.on_cuda)))
    setup_logging(args)
    logger.info("training recipe (flag = yours, default = hfscale's pretraining recipe, trainer = the Trainer's own, "
                "docs/compare.md): %s",
                ", ".join(f"{k}={v} ({src})" for k, (v, src) in state.recipe.items()))
    if ignored := ignored_optimizer_flags(state.plan.optimizer.name, state.explicit):
        logger.warning("%s: ignored by --optim %s, which transformers builds from %s alone", ", ".join(ignored),
                       state.plan.optimizer.name, OPTIMIZER_FLAGS[state.plan.optimizer.name])
    stopper = StopOnSignal(args.count_collectives)  # SIGUSR1: a checkpoint at the next logging step, then stop
    stopper.install()  # from here on, not only once training starts: SIGUSR1's default would end this rank
    try:
        with output_dir_for(args, state, run_name(model_args, state.plan)):
            train_and_record(model_args, data_args, args, state, stopper)
    finally:
        stopper.uninstall()


def train_and_record(model_args, data_args, args, state, stopper: StopOnSignal) -> None:
    """Data, model, engine, the Trainer's loop and the results file, in the run's folder."""
    resume = resume_checkpoint(args, state)
    set_seed(args.seed)
    tokenizer, blocks, eval_blocks = load_data(model_args, data_args, args, state.plan.shape.vocab, state.plan.seq_len,
                                               state.validation)
    construction = ConstructionMemory()
    construction.start()
    model = build(model_args, args, state.plan.shape, tokenizer, state.plan.strategy)
    use_training_forward(model, state.plan.fused_linear_cross_entropy)  # no KV cache; the fused loss if asked
    parallelism = tensor_parallel_config(state.plan)  # tp, fsdp_tp: the mesh, and the model split on its tp dimension
    if parallelism is not None:
        if state.plan.float8:  # converted before the split, or TP's hooks would go with the swapped layers
            convert_to_float8(model, state.plan.shape.spec, state.plan.float8, args.fp8_emulate,
                              state.plan.float8_all_gather, state.plan.tp)
        # split from the host: each tensor goes to the device as its slices (never the whole model on one GPU)
        apply_tensor_parallel(model, parallelism.device_mesh["tp"], state.plan.shape.spec).to(args.device)
    construction.read(built=True)  # before StepMemory resets the high-water mark; read again once the engine has sharded
    record = RunRecord(args.output_dir, base_results(model_args, data_args, args, state, model,
                                                     environment(args, state.plan)), args.process_index == 0)
    trainer, meter = make_trainer(model_args, args, state, model, blocks, eval_blocks, record, construction, parallelism)
    record.update(resumed_from=resume)
    trainer.add_callback(stopper)
    garbage.settle()  # the model is built: the train-begin collections (accelerate's, hfscale's) walk only what follows
    try:
        output = trainer.train(resume_from_checkpoint=resume)
        if eval_blocks is not None and not evaluating(args.eval_strategy) and stopper.stopped_at is None:
            trainer.evaluate()  # validation text given, no evaluation schedule: the final model's eval loss
    except HfscaleError as err:
        record.update(status="refused", error=str(err))
        record.flush()
        raise
    except BaseException as err:
        record.update(status="fail", error=f"{type(err).__name__}: {err}")
        record.flush()
        raise
    finally:  # a recorder's torch function mode or profiler leaves the stack however training ended
        for recorder in (trainer.host_syncs, trainer.step_profiler, trainer.collectives):
            if recorder:
                recorder.stop()
    finish(trainer, meter, record, args, output.metrics)
    if stopper.stopped_at is not None:
        step = stopper.stopped_at
        record.update(status="stopped", stopped={"signal": SIGNAL.name, "step": step,
                                                 "checkpoint": str(Path(args.output_dir) / f"checkpoint-{step}")})
    else:
        record.update(status="ok")
    record.update(finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    record.flush()
    measure_callback(trainer).close()  # the TensorBoard events are complete
    if args.process_index == 0:
        print_summary(record.results)
    if args.push_to_hub:  # every rank: the Trainer's final save is collective under ZeRO-3/FSDP
        trainer.push_to_hub(commit_message=f"hfscale {args.run_name}: model, results.json, TensorBoard events")


def measure_callback(trainer):
    return next(c for c in trainer.callback_handler.callbacks if isinstance(c, MeasureCallback))


if __name__ == "__main__":
    main()
