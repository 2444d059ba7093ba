"""HfscaleTrainer: the HF Trainer plus the few things no library does for our strategies.

In order: (1) on a CPU-only machine, FSDP is forced onto accelerate's state when the accelerator is created
(accelerate would silently use DDP), with HSDP's 2-D mesh; (2) at train begin, after the model is wrapped, the
StrategyCallback registers PowerSGD, proves the wrapper, world size, mesh and sharding, and records every rank's
host-memory peak of building the model; (3) right before the first optimizer step it
counts the gradients each rank holds, and after it proves where optimizer states live and how many each rank holds,
and counts every rank's model-state bytes (the memory estimate's check); (4) every log adds the perf/* figures;
(5) evaluation reports the exact mean token cross-entropy over the validation blocks (see `prediction_step`).
"""

import logging
import math
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from accelerate.utils import DistributedType, DummyOptim
from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from ..errors import HfscaleError
from ..parallel import tensor_parallel, verify
from ..parallel.distributed import barrier, eager_optimizer_step
from ..parallel.hooks import (PowerSGDConfig, apply_powersgd, force_fsdp_state, powersgd_facts, restore_powersgd,
                              save_powersgd, use_tensor_parallel_state)
from ..formulas.memory import tp_local_tensors
from . import garbage
from .checkpoints import write_marker
from .measure import perf_scalars

logger = logging.getLogger("hfscale")

# The console line of a logging step: the Trainer's familiar dict, short. The full perf/* and memory/* set goes to
# TensorBoard and results.json (14 perf keys at every logging step could not be read).
CONSOLE_KEYS = {"loss": "loss", "grad_norm": "grad_norm", "learning_rate": "lr", "perf/tokens_per_s": "tokens_per_s",
                "perf/tflops_per_gpu": "tflops_per_gpu", "perf/mfu": "mfu", "memory/step_peak_gb": "mem_gb",
                "eval_loss": "eval_loss", "eval_perplexity": "eval_perplexity", "epoch": "epoch"}
MAX_SKIPPED_STEPS = 50  # fp16 loss scaling from 2^16 halves per overflow: a healthy run steps long before this


def token_weighted_eval_loss(prediction) -> dict:
    """eval_loss = all validation cross-entropy / all predicted tokens (from HfscaleTrainer.prediction_step)."""
    stats = prediction.predictions
    tokens = float(stats[:, 1].sum())
    return {"loss": float(stats[:, 0].sum()) / tokens, "tokens_evaluated": int(tokens)}


def console_logs(logs: dict) -> dict:
    """What a logging step prints: CONSOLE_KEYS, renamed; any other log (the end-of-training metrics) as it is."""
    short = {name: logs[key] for key, name in CONSOLE_KEYS.items() if key in logs}
    return short if "loss" in short or "eval_loss" in short else logs


class ConsoleProgressCallback(ProgressCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        return super().on_log(args, state, control, logs=console_logs(logs or {}), **kwargs)


class ConsolePrinterCallback(PrinterCallback):  # --disable_tqdm: the same short line, without the bar
    def on_log(self, args, state, control, logs=None, **kwargs):
        return super().on_log(args, state, control, logs=console_logs(logs or {}), **kwargs)


class HfscaleTrainer(Trainer):
    def __init__(self, *args, plan, meter=None, step_memory=None, checkpoint_identity=None, on_checkpoint=None,
                 parallelism=None, **kwargs):
        self.plan, self.meter, self.step_memory = plan, meter, step_memory  # plan: the run's RunPlan
        self.parallelism = parallelism  # a TP run's ParallelismConfig, its mesh built (distributed.tensor_parallel_config)
        self._clock_start = None  # wall clock of the first micro-batch of this process's training
        self._elapsed_before = 0.0  # training seconds before a resume (from the checkpoint's log history)
        self._paused_s = 0.0  # evaluations and checkpoint saves since the clock started: not training time
        self._eval_start = None
        self._memory_logged_step = 0  # the step of the last log: where the next memory window starts
        self.checkpoint_identity, self.on_checkpoint = checkpoint_identity or {}, on_checkpoint
        self.powersgd_state = None  # set by StrategyCallback; saved with every checkpoint
        kwargs.setdefault("compute_metrics", token_weighted_eval_loss)
        self.first_batch_digest = None  # proves each rank got its own samples (see StrategyCallback)
        self.batch_digests: list[list[int]] = []  # [step, sum of input ids] per micro-batch, with --record_batches
        self._flop_params = None  # the Trainer's total_flos parameter count, taken once (floating_point_ops)
        super().__init__(*args, **kwargs)
        for library, ours in ((ProgressCallback, ConsoleProgressCallback), (PrinterCallback, ConsolePrinterCallback)):
            if self.pop_callback(library) is not None:
                self.add_callback(ours)

    def create_optimizer(self, model=None):
        optimizer = super().create_optimizer(model)
        if isinstance(optimizer, DummyOptim):
            # The DeepSpeed config's optimizer block (the offload strategies: DeepSpeed's CPU Adam) is built by
            # DeepSpeed from the DummyOptim's params, which transformers' deepspeed_init fills with every parameter in
            # one group: weight decay on the biases and LayerNorms too. The Trainer's own two groups instead.
            optimizer.params = self.weight_decay_groups(self.model if model is None else model)
        eager_optimizer_step(optimizer, self.plan.on_cuda, self.args.torch_compile)
        return optimizer

    def weight_decay_groups(self, model) -> list[dict]:
        """The Trainer's parameter groups: --weight_decay on the weights, none on biases and norms."""
        decay = set(self.get_decay_parameter_names(model))
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        return [{"params": [p for n, p in named if n in decay], "weight_decay": self.args.weight_decay},
                {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]

    def training_step(self, model, inputs, *args, **kwargs):
        if self._clock_start is None:
            self._clock_start = time.perf_counter()
            earlier = [e["elapsed_s"] for e in self.state.log_history if e.get("elapsed_s") is not None]
            self._elapsed_before = earlier[-1] if earlier else 0.0
        if self.first_batch_digest is None or self.args.record_batches:
            ids = inputs["input_ids"]
            digest = int(ids.sum())  # a sync: on the first micro-batch only, unless --record_batches
            if self.first_batch_digest is None:
                self.first_batch_digest = [digest, ids.shape[0]]
            if self.args.record_batches:
                self.batch_digests.append([self.state.global_step + 1, digest])
        return super().training_step(model, inputs, *args, **kwargs)

    def floating_point_ops(self, inputs) -> int:
        """The Trainer's own total_flos term (6 x input tokens x non-embedding parameters), with the parameters counted
        once: the Trainer walks every parameter on every micro-batch (0.5 ms of host time per micro-batch at 350M on
        the CI machine), and the count does not change while training."""
        main = getattr(self.model, "main_input_name", "input_ids")
        if main not in inputs or not hasattr(self.model, "num_parameters"):
            return 0
        if self._flop_params is None:
            self._flop_params = self.model.num_parameters(exclude_embeddings=True)
        return 6 * inputs[main].numel() * self._flop_params

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Per validation block: (sum of next-token cross-entropies, number of predicted tokens), returned as the
        "predictions". The Trainer's own eval loss is a mean of per-batch means, re-weighted by the gathered token
        counts; when the blocks do not divide evenly over ranks x eval batch, accelerate pads the last batches with
        repeated blocks that stay inside those means, and the figure drifts. Per-block sums are gathered with the
        padding dropped (gather_for_metrics), so token_weighted_eval_loss is exact for any world size and batch."""
        inputs = self._prepare_inputs(inputs)
        labels = inputs["labels"][..., 1:]
        with torch.no_grad(), self.compute_loss_context_manager():
            logits = model(**{k: v for k, v in inputs.items() if k != "labels"}).logits[..., :-1, :]
        ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100,
                             reduction="none").view(labels.shape)
        counted = labels.ne(-100)
        stats = torch.stack([(ce * counted).sum(-1), counted.sum(-1).float()], dim=-1)
        return None, stats, torch.zeros(len(stats), device=stats.device)

    def _save_checkpoint(self, model, trial) -> None:
        """The Trainer's save, then: every rank done -> rank 0 marks the checkpoint complete (run/checkpoints.py)."""
        start = time.perf_counter()
        super()._save_checkpoint(model, trial)
        step = self.state.global_step
        folder = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{step}"
        if self.powersgd_state is not None:
            save_powersgd(self.powersgd_state, folder, self.args.process_index)
        if dist.is_initialized():
            barrier()
        seconds = time.perf_counter() - start
        if self._clock_start is not None:
            self._paused_s += seconds
        info = {"step": step, "save_s": round(seconds, 4), "size_gb": None}
        if self.args.process_index == 0 and folder.is_dir():
            if not (folder / "config.json").is_file():  # sharded saves keep no config; export needs one
                self.accelerator.unwrap_model(self.model).config.save_pretrained(folder)
            marker = write_marker(folder, {**self.checkpoint_identity, "step": step, "save_s": info["save_s"],
                                           "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
            info["size_gb"] = marker["size_bytes"] / 1e9
        if dist.is_initialized():
            barrier()  # nobody goes on (or gets killed mid-step) believing in a checkpoint not yet marked
        if self.on_checkpoint:
            self.on_checkpoint(info)

    @property
    def strategy(self):
        return self.plan.strategy

    @property
    def _tp_checkpoints(self) -> bool:
        """tp and fsdp_tp write and read their checkpoints on every rank, whole (tensor_parallel.py): the Trainer writes
        a plain model from rank 0 only, and FSDP's sharded checkpoint (torch.distributed.checkpoint) refuses GPT-2's
        per-head c_attn split."""
        return self.strategy.tensor_parallel

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        if not self._tp_checkpoints:
            return super().save_model(output_dir, _internal_call)
        weights = tensor_parallel.full_state_dict(self.model)  # every rank gathers; rank 0 writes
        if self.args.should_save:
            self.model.save_pretrained(output_dir or self.args.output_dir, state_dict=weights)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        if not self._tp_checkpoints:
            return super()._save_optimizer_and_scheduler(output_dir)
        tensor_parallel.save_optimizer(verify.base_optimizer(self.optimizer), output_dir, self.args.should_save)
        if self.args.should_save:
            torch.save(self.lr_scheduler.state_dict(), Path(output_dir) / "scheduler.pt")

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        if not self._tp_checkpoints:
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        from safetensors.torch import load_file

        files = sorted(Path(resume_from_checkpoint).glob("model*.safetensors"))  # save_pretrained's shards, if several
        if not files:
            raise HfscaleError(f"{resume_from_checkpoint} holds no model*.safetensors to resume {self.strategy.name} from")
        tensor_parallel.load_full_state_dict(self.model, {k: v for f in files for k, v in load_file(f).items()})

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if not self._tp_checkpoints or checkpoint is None:
            return super()._load_optimizer_and_scheduler(checkpoint)
        if tensor_parallel.load_optimizer(verify.base_optimizer(self.optimizer), checkpoint):
            self.lr_scheduler.load_state_dict(torch.load(Path(checkpoint) / "scheduler.pt", weights_only=True))

    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()
        if self.strategy.engine == "fsdp" and self.accelerator.state.distributed_type == DistributedType.MULTI_CPU:
            force_fsdp_state(self.accelerator, self.args.fsdp_plugin_args, self.plan.mesh)
            self.is_fsdp_enabled = True
        if self.parallelism is not None:
            use_tensor_parallel_state(self.accelerator, self.parallelism, self.model)

    def evaluate(self, *args, **kwargs):
        self._eval_start = time.perf_counter()
        try:
            return super().evaluate(*args, **kwargs)
        finally:
            if self._clock_start is not None:
                self._paused_s += time.perf_counter() - self._eval_start
            self._eval_start = None

    def log(self, logs: dict, *args, **kwargs) -> None:
        if "loss" in logs or "eval_loss" in logs:  # where the point lies in tokens seen and training seconds (kept
            logs["tokens"] = self.state.global_step * self.plan.tokens_per_step  # in the checkpoint's history)
            if self._clock_start is not None:
                now = self._eval_start if "eval_loss" in logs and self._eval_start else time.perf_counter()
                logs["elapsed_s"] = round(self._elapsed_before + now - self._clock_start - self._paused_s, 3)
        if "eval_loss" in logs:  # mean token cross-entropy (nats) over the validation blocks
            logs["eval_perplexity"] = math.exp(min(logs["eval_loss"], 700.0))
        if self.meter is not None and "loss" in logs:
            figures = self.meter.interval(self.state.global_step)
            if figures is not None:
                logs.update(perf_scalars(figures))
        if self.step_memory is not None and "loss" in logs:  # this rank's step memory since the last log (rank 0's
            logs.update(self.step_memory.window(self._memory_logged_step))  # on the console; every rank's in results)
            self._memory_logged_step = self.state.global_step
        super().log(logs, *args, **kwargs)


class GarbageCollectionCallback(TrainerCallback):
    """Python's collector on --gc_freq's schedule from train begin (hfscale/run/garbage.py). results.json's perf.gc:
    the collections of each generation made during start-up and during training, and the scheduled ones' count and
    seconds."""

    def __init__(self, gc_freq: int, record):
        self.gc_freq, self.record = gc_freq, record
        self.facts = {"gc_freq": gc_freq, "scheduled": 0, "scheduled_s": 0.0}
        self._at_begin: list[int] = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.facts["start_up"] = garbage.collections()
        garbage.start_training(self.gc_freq)
        self._at_begin = garbage.collections()

    def on_step_end(self, args, state, control, **kwargs):
        began = time.perf_counter()
        if garbage.after_step(state.global_step, self.gc_freq):
            self.facts["scheduled"] += 1
            self.facts["scheduled_s"] += time.perf_counter() - began

    def on_evaluate(self, args, state, control, **kwargs):
        garbage.after_evaluation(self.gc_freq)

    def on_train_end(self, args, state, control, **kwargs):
        self.facts["training"] = [now - then for now, then in zip(garbage.collections(), self._at_begin)]
        self.record.results.perf.gc = self.facts


class StrategyCallback(TrainerCallback):
    """Registers PowerSGD and proves at start-up that the strategy running is the one asked for."""

    def __init__(self, trainer: HfscaleTrainer, *, total_params: int, powersgd: PowerSGDConfig | None, record,
                 resume_from: str | None = None, construction=None):
        self.trainer, self.total_params = trainer, total_params
        self.engine_params = total_params  # what the engine shards: the whole model, or under TP this rank's slices
        self.powersgd, self.record = powersgd, record
        self.resume_from = resume_from
        self.construction = construction  # measure.ConstructionMemory: host memory to build and shard the model
        self.facts: dict = {}
        self.gradient_bytes: int | None = None
        self.accumulating_gradient_bytes: int | None = None  # after the first micro-batch, with gradient accumulation
        self.states_checked = False  # optimizer states are checked after the first step that really ran

    @property
    def plan(self):
        return self.trainer.plan

    @property
    def strategy(self):
        return self.trainer.plan.strategy

    @property
    def powersgd_state(self):
        return self.trainer.powersgd_state  # the trainer saves it with every checkpoint

    def on_train_begin(self, args, state, control, **kwargs):
        trainer, strategy = self.trainer, self.strategy
        world = trainer.accelerator.num_processes
        self.facts = {
            "strategy": strategy.name,
            "world_size_launcher": self.plan.world_size,
            "world_size_accelerate": world,
            "world_size_torch": dist.get_world_size() if dist.is_initialized() else 1,
            "distributed_type": str(trainer.accelerator.state.distributed_type).split(".")[-1],
            "mesh": list(self.plan.mesh) if self.plan.mesh else None,
            **verify.inspect_wrapper(trainer.model_wrapped),
            "parameters": {**verify.inspect_parameters(trainer.model_wrapped), "elements_total": self.total_params},
        }
        if strategy.tensor_parallel:  # what the data-parallel engine starts from: this rank's TP slices
            self.engine_params = sum(t.numel for t in tp_local_tensors(self.plan.shape, self.plan.tp,
                                                                         args.process_index % self.plan.tp))
            self.facts["tensor_parallel"] = {
                **verify.inspect_tensor_parallel(trainer.model_wrapped, self.plan.shape.family, self.plan.tp),
                "tp": self.plan.tp, "elements_tp_slices": self.engine_params}
        verify.check_world(self.facts, strategy)
        verify.check_wrapper(self.facts, strategy, world)
        verify.check_compiled(self.facts, strategy, bool(args.torch_compile))
        running = getattr(args, "mixed_precision", None)  # flags, or ACCELERATE_MIXED_PRECISION from the environment
        verify.check_precision(self.facts, strategy, args.bf16 or running == "bf16", args.fp16 or running == "fp16")
        params = self.facts["parameters"]
        verify.check_sharded("parameters", params["elements_local"], self.engine_params, self.plan.shard_ranks, strategy)
        if strategy.tensor_parallel and self.plan.shard_ranks == 1:  # TP alone: exactly the plan's slices
            verify.require(params["elements_local"] == self.engine_params, f"this rank holds "
                           f"{params['elements_local']:,} parameters, the TP plan {self.engine_params:,}", strategy)
        verify.check_placement("parameters", params["devices"], strategy, self.plan.on_cuda)
        self._measure_gradients_before_the_first_step()
        self._record_construction_memory()
        if self.powersgd is not None:
            trainer.powersgd_state = apply_powersgd(verify.uncompiled(trainer.model_wrapped), self.powersgd)
            if self.resume_from:
                self.facts["powersgd_restored"] = restore_powersgd(self.powersgd_state, self.resume_from, args.process_index)
        self._publish()

    def _record_construction_memory(self) -> None:
        """Every rank's host-memory peaks to build the model, and from the build to training begin (all ranks take
        part)."""
        if self.construction is None:
            return
        self.construction.read()
        ranks = [(self.construction.build_bytes(), self.construction.bytes())]
        if dist.is_initialized() and dist.get_world_size() > 1:
            ranks = [None] * dist.get_world_size()
            dist.all_gather_object(ranks, (self.construction.build_bytes(), self.construction.bytes()))
        memory = self.record.results.memory
        memory.build_peak_bytes_per_rank = [built for built, _ in ranks]
        memory.construction_peak_bytes_per_rank = [through_prepare for _, through_prepare in ranks]

    def _measure_gradients_before_the_first_step(self) -> None:
        """The gradients a rank holds are measured right before its first optimizer step: by the Trainer's
        on_pre_optimizer_step, except under DeepSpeed, whose engine steps inside accelerate's backward (so its `step`
        is wrapped, once, on this engine instance)."""
        engine = self.trainer.model_wrapped
        if not hasattr(engine, "zero_optimization_stage"):
            return
        real_step = engine.step

        def step(*args, **kwargs):  # called after every micro-batch; the optimizer steps at the boundary only
            if self.gradient_bytes is None and engine.is_gradient_accumulation_boundary():
                self.gradient_bytes = verify.measure_gradients(engine)
            return real_step(*args, **kwargs)

        engine.step = step

    def on_substep_end(self, args, state, control, **kwargs):
        """After a micro-batch that is not the last of its step (gradient accumulation): the gradients a rank holds
        while accumulating - full under DDP and ZeRO-1, a partition under ZeRO-2/3, full under FSDP2 with accelerate's
        no_sync (docs/estimate.md)."""
        if self.accumulating_gradient_bytes is None:
            self.accumulating_gradient_bytes = verify.measure_gradients(self.trainer.model_wrapped)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.gradient_bytes is None and not hasattr(self.trainer.model_wrapped, "zero_optimization_stage"):
            self.gradient_bytes = verify.measure_gradients(self.trainer.model_wrapped)

    def on_step_end(self, args, state, control, **kwargs):
        if not self.states_checked and self._optimizer_has_stepped(state.global_step):
            self._check_optimizer_states()
            self._measure_model_states()
            self.states_checked = True
        if self.powersgd_state is not None:
            self.facts["powersgd"] = powersgd_facts(self.powersgd_state)
            if state.global_step == self.powersgd_state.start_powerSGD_iter + 1:
                verify.require(self.facts["powersgd"]["compressing"],
                                f"PowerSGD is not compressing after {state.global_step - 1} steps", self.strategy)
                self._publish()

    def _optimizer_has_stepped(self, step: int) -> bool:
        """States exist only once an optimizer step really ran: with fp16's dynamic loss scaling (DeepSpeed starts at
        2^16, torch's GradScaler too) the first steps are often skipped as overflows, and checking states at step 1
        would refuse a correct run. Refused when no step has run after MAX_SKIPPED_STEPS."""
        if verify.inspect_optimizer_states(self.trainer.optimizer)["elements_local"] > 0:
            return True
        verify.require(step < MAX_SKIPPED_STEPS, f"the optimizer has not stepped in {step} steps (every step skipped "
                       "as a loss-scale overflow?)", self.strategy)
        return False

    def _check_data_sharded(self) -> None:
        """Every rank must have trained on different samples (the DeepSpeed-on-CPU trap gives them the same)."""
        digests = [self.trainer.first_batch_digest]
        if dist.is_initialized() and dist.get_world_size() > 1:
            digests = [None] * dist.get_world_size()
            dist.all_gather_object(digests, self.trainer.first_batch_digest)
        self.facts["first_batch_per_rank"] = digests
        verify.check_batches_follow_the_mesh(digests, self.plan.tp, self.strategy)

    def _check_optimizer_states(self) -> None:
        self._check_data_sharded()
        strategy, optimizer = self.strategy, self.plan.optimizer
        states = verify.inspect_optimizer_states(self.trainer.optimizer)
        # Adafactor's factored states are not proportional to the parameters: their sharding is reported, not checked
        per_param = optimizer.state_elements_per_param
        states["elements_unsharded"] = per_param * self.engine_params if per_param else None
        self.facts["optimizer_states"] = states
        if per_param:
            verify.check_sharded("optimizer_states", states["elements_local"], states["elements_unsharded"],
                                 self.plan.shard_ranks, strategy)
        verify.check_placement("optimizer_states", states["devices"], strategy, self.plan.on_cuda)
        verify.check_optimizer_engine(states["optimizer"], strategy)
        # the recipe decays weights only: a library that builds the optimizer from one group decays biases and norms
        states["weight_decay"] = verify.inspect_weight_decay(self.trainer.optimizer)
        if self.trainer.args.weight_decay > 0:
            verify.require(dict(states["weight_decay"]).get(0.0, 0) > 0, "its optimizer decays every parameter, "
                           "biases and norms included (groups [[weight decay, elements]]: "
                           f"{states['weight_decay']})", strategy)
        if optimizer.eight_bit:
            verify.require("uint8" in states["dtypes"], f"8-bit Adam states are {states['dtypes']}", strategy)
        if optimizer.factored and strategy.engine != "deepspeed":  # DeepSpeed steps flat 1-D partitions
            verify.require(states["factored"], "Adafactor states are not factored", strategy)
        self._publish()

    def _measure_model_states(self) -> None:
        """Bytes of parameters, gradients, fp32 masters and optimizer states on every rank (all ranks take part)."""
        mine = ({**verify.measure_model_states(self.trainer.model_wrapped, self.trainer.optimizer),
                 "gradients": self.gradient_bytes}, self.accumulating_gradient_bytes)
        ranks = [mine]
        if dist.is_initialized() and dist.get_world_size() > 1:
            ranks = [None] * dist.get_world_size()
            dist.all_gather_object(ranks, mine)
        memory = self.record.results.memory
        memory.model_states_per_rank = [states for states, _ in ranks]
        memory.gradients_accumulating_per_rank = [accumulating for _, accumulating in ranks]

    def _publish(self) -> None:
        self.record.update(strategy_check=self.facts)
        self.record.flush()
