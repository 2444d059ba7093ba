"""The Trainer callbacks of a run that are not about the Trainer itself.

StrategyCallback proves at start-up that the strategy running is the one asked for: at train begin, after the model
is wrapped, it registers PowerSGD, proves the wrapper, world size, mesh and sharding, and records every rank's
host-memory peak of building the model; right before the first optimizer step it counts the gradients each rank
holds, and after it proves where optimizer states live and how many each rank holds, and counts every rank's
model-state bytes (the memory estimate's check). GarbageCollectionCallback runs Python's collector on --gc_freq's
schedule.
"""

import time

import torch.distributed as dist
from transformers import TrainerCallback

from ..formulas.tensors import tp_local_tensors
from ..parallel import storage, verify
from ..parallel.hooks import PowerSGDConfig, apply_powersgd, powersgd_facts, restore_powersgd
from . import garbage
from .float8 import inspect_float8, precompute_scales

MAX_SKIPPED_STEPS = 50  # fp16 loss scaling from 2^16 halves per overflow: a healthy run steps long before this


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
    """Registers PowerSGD and proves at start-up that the strategy running is the one asked for (`trainer`: the
    run's run.trainer.HfscaleTrainer)."""

    def __init__(self, trainer, *, total_params: int, powersgd: PowerSGDConfig | None, record,
                 resume_from: str | None = None, construction=None):
        self.trainer, self.total_params = trainer, total_params
        self.engine_params = total_params  # what the engine shards: the whole model, or under TP this rank's slices
        self.powersgd, self.record = powersgd, record
        self.resume_from = resume_from
        self.construction = construction  # run/memory.ConstructionMemory: host memory to build and shard the model
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
                **verify.inspect_tensor_parallel(trainer.model_wrapped, self.plan.shape, self.plan.tp),
                "tp": self.plan.tp, "elements_tp_slices": self.engine_params}
        verify.check_world(self.facts, strategy)
        verify.check_wrapper(self.facts, strategy, world)
        verify.check_compiled(self.facts, strategy, bool(args.torch_compile))
        verify.check_precision(self.facts, strategy, self.plan.dtypes)  # the flags, or the launcher's, read back
        params = self.facts["parameters"]
        verify.check_sharded("parameters", params["elements_local"], self.engine_params, self.plan.shard_ranks,
                             strategy)
        if strategy.tensor_parallel and self.plan.shard_ranks == 1:  # TP alone: exactly the plan's slices
            verify.require(params["elements_local"] == self.engine_params, f"this rank holds "
                           f"{params['elements_local']:,} parameters, the TP plan {self.engine_params:,}", strategy)
        verify.check_placement("parameters", params["devices"], strategy, self.plan.on_cuda)
        if self.plan.float8:  # the blocks' linear layers train in float8, the rest as planned
            model = verify.uncompiled(trainer.model_wrapped)
            model = getattr(model, "module", model)  # DDP's wrapped module: the names the plan converted
            self.facts["float8"] = inspect_float8(model, self.plan.shape.spec, self.plan.float8, args.fp8_emulate,
                                                  self.plan.float8_all_gather, self.plan.tp)
            if self.plan.float8_all_gather:
                precompute_scales(model)
        self._measure_gradients_before_the_first_step()
        self._record_construction_memory()
        if self.powersgd is not None:
            trainer.powersgd_state = apply_powersgd(verify.uncompiled(trainer.model_wrapped), self.powersgd)
            if self.resume_from:
                self.facts["powersgd_restored"] = restore_powersgd(self.powersgd_state, self.resume_from,
                                                                   args.process_index)
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
                self.gradient_bytes = storage.measure_gradients(engine)
            return real_step(*args, **kwargs)

        engine.step = step

    def on_substep_end(self, args, state, control, **kwargs):
        """After a micro-batch that is not the last of its step (gradient accumulation): the gradients a rank holds
        while accumulating - full under DDP and ZeRO-1, a partition under ZeRO-2/3, full under FSDP2 with accelerate's
        no_sync (docs/estimate.md)."""
        if self.accumulating_gradient_bytes is None:
            self.accumulating_gradient_bytes = storage.measure_gradients(self.trainer.model_wrapped)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.gradient_bytes is None and not hasattr(self.trainer.model_wrapped, "zero_optimization_stage"):
            self.gradient_bytes = storage.measure_gradients(self.trainer.model_wrapped)

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
        mine = ({**storage.measure_model_states(self.trainer.model_wrapped, self.trainer.optimizer),
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
