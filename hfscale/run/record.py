"""What a run records about itself before it trains: the machine and versions, the peak its MFU divides by, the model
and configuration from its RunPlan, and what the memory model predicts for it (results.json's first version).

torch and the optional libraries are imported inside the functions (the process group and the device state exist by
the time they are called).
"""

import importlib.metadata
import os
import platform
import socket
import time

from ..formulas.metrics import param_count, param_count_bigscience
from ..formulas.peaks import measure_peak_tflops, table_peak
from ..models import parameter_count
from .results import ConfigRecord, EnvironmentRecord, ModelRecord, PerfRecord, Results


def environment(args, plan) -> EnvironmentRecord:
    import accelerate
    import datasets
    import torch
    import transformers

    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__, "accelerate": accelerate.__version__,
                "datasets": datasets.__version__}
    for optional in ("deepspeed", "bitsandbytes", "torchao"):  # read from the installed metadata: importing
        try:  # bitsandbytes and torchao only for their versions cost a second per process
            versions[optional] = importlib.metadata.version(optional)
        except importlib.metadata.PackageNotFoundError:  # an absent optional library is reported, not fatal
            versions[optional] = None
    on_cuda = plan.on_cuda  # the route the plan decided (--use_cpu on a GPU host is a CPU run)
    if args.device.type != plan.device_type:  # the Trainer must have taken that route: a difference is hfscale's bug
        raise RuntimeError(f"the plan's route is {plan.device_type}, but the Trainer runs on {args.device.type}")
    return EnvironmentRecord(
        versions=versions, hostname=socket.gethostname(), device_type="cuda" if on_cuda else "cpu",
        device_name=(torch.cuda.get_device_name() if on_cuda
                     else f"CPU ({platform.machine()}, {torch.get_num_threads()} threads/process)"),
        device_count=torch.cuda.device_count() if on_cuda else os.cpu_count(),
        # the launcher's view of the nodes (torchrun/accelerate set LOCAL_WORLD_SIZE: processes on this node)
        world_size=plan.world_size, processes_per_node=plan.processes_per_node, nodes=plan.nodes,
        cpu_threads_per_process=torch.get_num_threads())


def peak_tflops(args, env: EnvironmentRecord, precision: str) -> PerfRecord:
    """The peak used for MFU, where it came from, and the measured peak (or None). Never a GPU peak on a CPU. Only
    the main process measures: the results, the console and TensorBoard are its, and a probe in every other rank
    would cost each ~0.2 CPU-s (on a CPU, where every run measures) for a figure nobody reads."""
    on_cuda = env.device_type == "cuda"
    probed, main = args.measure_peak or not on_cuda, args.process_index == 0  # probed: by the main process
    measured = None
    if probed and main:
        device = f"cuda:{args.local_process_index}" if on_cuda else "cpu"
        # a few matmuls: on CPU the probe runs in every run (its MFU needs a peak), so it is kept to ~0.2 s
        measured = measure_peak_tflops(device, precision, seconds=0.5 if on_cuda else 0.2)
    table = table_peak(env.device_name, precision) if on_cuda else None
    if args.peak_tflops:
        peak, source = args.peak_tflops, "--peak_tflops"
    elif table:
        peak, source = table, f"datasheet {env.device_name} {precision}"
    elif probed and not main:
        peak, source = None, "measured by the main process"
    elif measured is None:  # a GPU the table does not know, and nothing measured: no MFU rather than a wrong one
        peak, source = None, f"unknown device {env.device_name!r}: pass --peak_tflops or --measure_peak"
    else:
        peak, source = measured, "measured matmul peak on this device"
    # an --fp8 run's headline MFU stays against the bf16 peak (the BigScience convention); the float8 one beside it
    fp8 = table_peak(env.device_name, "fp8") if on_cuda and getattr(args, "fp8", False) else None
    return PerfRecord(peak_tflops=peak, peak_source=source, measured_peak_tflops=measured, peak_tflops_fp8=fp8)


def memory_estimate(plan, model) -> dict:
    """What hfscale.formulas.memory predicts for this very run, per rank, recorded beside what it measures (with the
    attention implementation the built model really uses)."""
    attention = getattr(model.config, "_attn_implementation", None)
    dropout = plan.shape.spec.dropout_of(model.config) > 0  # the built model's: a checkpoint's config sets its own
    return {**plan.but(attention=attention, dropout=dropout).memory().as_dict(), "attention": attention}


def base_results(model_args, data_args, args, state, model, env: EnvironmentRecord) -> Results:
    plan, shape = state.plan, state.plan.shape
    return Results(
        run_name=args.run_name, output_dir=args.output_dir, strategy=plan.strategy.name, optim=plan.optimizer.name,
        started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        model=ModelRecord(name=model_args.name, family=shape.family, n_layer=shape.n_layer, hidden=shape.hidden,
                          n_head=shape.n_head, n_kv_head=shape.kv_heads, vocab=shape.vocab, positions=shape.positions,
                          ffn=shape.ffn, ffn_size=shape.ffn_size, tied=shape.tied_head,
                          rope_theta=shape.rope_theta, head_dim=shape.head_dim, sliding_window=shape.sliding_window,
                          params_formula=param_count(shape),
                          # the BigScience size formula; its s x h term only for a family with a position table
                          params_bigscience=param_count_bigscience(
                              shape.n_layer, shape.hidden, shape.positions if shape.spec.position_embedding else 0,
                              shape.vocab),
                          params_model=parameter_count(model), params_trainable=parameter_count(model, True),
                          dropout=shape.spec.dropout_of(model.config)),
        config=ConfigRecord(world_size=plan.world_size, per_device_train_batch_size=plan.per_device_train_batch_size,
                            gradient_accumulation_steps=plan.gradient_accumulation_steps,
                            global_batch_size=plan.global_batch_size, seq_len=plan.seq_len,
                            activation_checkpointing=plan.activation_checkpointing,
                            precision=plan.precision, float8=plan.float8, torch_compile=plan.torch_compile,
                            fused_linear_cross_entropy=plan.fused_linear_cross_entropy,
                            sync_each_batch=plan.sync_each_batch,
                            zero_optimization=plan.zero_optimization, max_steps=args.max_steps,
                            seed=args.seed, learning_rate=args.learning_rate, recipe=state.recipe,
                            token_budget=args.token_budget, dataset=data_args.train_files or data_args.dataset,
                            validation=state.validation, powersgd_rank=args.powersgd_rank,
                            powersgd_warmup_steps=args.powersgd_warmup_steps,
                            dp=plan.data_parallel_size, tp=plan.tp, pp=1),
        environment=env, estimate=memory_estimate(plan, model))
