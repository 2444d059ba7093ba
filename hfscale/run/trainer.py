"""HfscaleTrainer: the HF Trainer plus the few things no library does for our strategies.

In order: (1) on a CPU-only machine, FSDP is forced onto accelerate's state when the accelerator is created
(accelerate would silently use DDP), with HSDP's 2-D mesh; (2) at train begin, after the model is wrapped, and
around the first optimizer step, run/callbacks.py's StrategyCallback proves the strategy; (3) every log adds the perf/*
figures, and the console shows a short line of them; (4) evaluation reports the exact mean token cross-entropy over
the validation blocks (see `prediction_step`); (5) checkpoints carry what the Trainer's do not: PowerSGD's state,
the tensor-parallel strategies' whole model and optimizer, and a marker that the save finished.
"""

import logging
import math
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from accelerate.utils import DistributedType, DummyOptim
from transformers import Trainer
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from ..errors import HfscaleError
from ..parallel import tensor_parallel
from ..parallel.storage import base_optimizer
from ..parallel.distributed import barrier, eager_optimizer_step
from ..parallel.hooks import force_fsdp_state, save_powersgd, use_tensor_parallel_state
from .checkpoints import write_marker
from .float8 import recipe_handler
from .measure import perf_scalars

logger = logging.getLogger("hfscale")

# The console line of a logging step: the Trainer's familiar dict, short. The full perf/* and memory/* set goes to
# TensorBoard and results.json (14 perf keys at every logging step could not be read).
CONSOLE_KEYS = {"loss": "loss", "grad_norm": "grad_norm", "learning_rate": "lr", "perf/tokens_per_s": "tokens_per_s",
                "perf/tflops_per_gpu": "tflops_per_gpu", "perf/mfu": "mfu", "memory/step_peak_gb": "mem_gb",
                "eval_loss": "eval_loss", "eval_perplexity": "eval_perplexity", "epoch": "epoch"}


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
        self.tokens_fed = 0  # input tokens this rank's data loader handed it: the figures' independent count
        self.first_trained_step = None  # the global step this process's training started from (a resume's)
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
            self.first_trained_step = self.state.global_step
        self.tokens_fed += inputs["input_ids"].numel()  # a shape, read on the host: no sync
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
        tensor_parallel.save_optimizer(base_optimizer(self.optimizer), output_dir, self.args.should_save)
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
        if tensor_parallel.load_optimizer(base_optimizer(self.optimizer), checkpoint):
            self.lr_scheduler.load_state_dict(torch.load(Path(checkpoint) / "scheduler.pt", weights_only=True))

    def _build_accelerator_args(self, **kwargs) -> dict:
        args = super()._build_accelerator_args(**kwargs)
        if self.plan.float8:  # accelerate converts the model as it prepares it (run/float8.py)
            args["kwargs_handlers"] = [*args.get("kwargs_handlers", []),
                                       recipe_handler(self.plan.float8, self.plan.shape.spec, self.args.fp8_emulate,
                                                      self.plan.float8_all_gather, self.plan.tp)]
        return args

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
