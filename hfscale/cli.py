"""`hfscale` console script: train | launch | slurm | sweep | report | parity | import-logs | export | estimate | project | bandwidth | tune | strategies | peak.

Each command's module is imported when the command runs (importlib, below): `hfscale estimate` never pays for the
training stack's imports, nor `hfscale --help` for any.
"""

import importlib
import sys

from .errors import ArgumentParser, HfscaleError, exit_on_user_error
from .formulas.peaks import matmul_memory_refusal, measure_peak_tflops, table_peak
from .parallel.optimizers import OPTIMIZERS
from .parallel.strategies import all_strategies, matrix_markdown
from .run.garbage import paused


def cmd_strategies(argv: list[str]) -> None:
    parser = ArgumentParser(prog="hfscale strategies", description="List strategies (and the optimizer matrix).")
    parser.add_argument("--matrix", action="store_true", help="print which strategy x optimizer pairs work")
    opts = parser.parse_args(argv)
    if opts.matrix:
        print(matrix_markdown())
        return
    for s in all_strategies().values():
        print(f"{s.name:<14} {s.summary}")
    print("\noptimizers (--optim): " + ", ".join(f"{name} ({o.summary})" for name, o in OPTIMIZERS.items()))


def cmd_peak(argv: list[str]) -> None:
    parser = ArgumentParser(prog="hfscale peak", description="Measure the best matmul TFLOPs this device reaches.")
    parser.add_argument("--dtype", default=None, choices=["bf16", "fp16", "tf32", "fp32"])
    parser.add_argument("--size", type=int, default=None, help="matrix size (default 8192 on GPU, 512 on CPU)")
    parser.add_argument("--seconds", type=float, default=3.0, help="how long to measure each dtype (default 3)")
    opts = parser.parse_args(argv)
    from .flags import positive

    positive(opts, "size", "seconds")
    import psutil
    import torch  # a second to import: only for the command that measures

    on_cuda = torch.cuda.is_available()
    device = "cuda" if on_cuda else "cpu"
    name = torch.cuda.get_device_name() if on_cuda else f"CPU ({torch.get_num_threads()} threads)"
    dtypes = [opts.dtype] if opts.dtype else (["bf16", "tf32", "fp32"] if on_cuda else ["fp32", "bf16"])
    if opts.size:
        memory = torch.cuda.mem_get_info()[0] if on_cuda else psutil.virtual_memory().available
        for dtype in dtypes:
            refusal = matmul_memory_refusal(opts.size, dtype, memory, "the GPU's free" if on_cuda else
                                            "the host's available")
            if refusal:
                raise HfscaleError(refusal)
    for dtype in dtypes:
        measured = measure_peak_tflops(device, dtype, opts.size, opts.seconds)
        table = table_peak(name, dtype) if on_cuda else None
        ratio = f" ({measured / table:.0%} of datasheet {table:g})" if table else ""
        print(f"{name} {dtype}: measured {measured:.2f} TFLOPs{ratio}")


COMMANDS = {
    "train": "train with a strategy and optimizer (every TrainingArguments flag works)",
    "launch": "accelerate launch of the training script, launcher config checked first",
    "slurm": "an sbatch script for a multi-node run: one launcher per node, static rendezvous",
    "sweep": "run strategies x optimizers x processes x MBS x GAS x checkpointing; failures are rows",
    "report": "markdown/CSV table in the BigScience format, plots, optional HTML",
    "parity": "compare strategies' loss curves and final weights with ddp",
    "import-logs": "turn Megatron-LM/Megatron-DeepSpeed logs into report rows",
    "export": "consolidate a checkpoint (any strategy) into a HuggingFace safetensors model",
    "estimate": "memory per GPU (and host RAM per node) before launch, per strategy x optimizer x micro-batch",
    "project": "days and GPU-days to a token budget vs number of GPUs, per strategy, with a communication model",
    "tune": "short real trials of every configuration that fits; the winner as ready-to-launch files",
    "bandwidth": "all-reduce / all-gather / reduce-scatter bus bandwidth of this node (like nccl-tests)",
    "strategies": "list strategies; --matrix for the strategy x optimizer table",
    "configs": "write accelerate_configs/ and ds_configs/ from strategies/*.yaml (--check: only compare)",
    "peak": "measure this device's matmul peak TFLOPs",
}


def import_command(module: str):
    """A command's module; its imports (torch and transformers for most) run without garbage collections, which
    would walk the whole growing heap again and again to find almost nothing (hfscale/run/garbage.py)."""
    with paused():
        return importlib.import_module(f"hfscale.{module}")


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: hfscale {" + ",".join(COMMANDS) + "} ...\n")
        for name, text in COMMANDS.items():
            print(f"  {name:<11} {text}")
        sys.exit(0 if not argv or argv[0] in ("-h", "--help") else 2)
    command, rest = argv[0], argv[1:]
    if command == "train":
        return import_command("train").main(rest)
    if command in ("launch", "slurm", "sweep", "report", "parity", "import-logs", "export", "estimate", "project",
                   "bandwidth", "tune", "configs"):
        module = {"launch": "launch", "slurm": "cluster.slurm", "sweep": "compare.sweep", "report": "compare.report", "parity": "compare.parity",
                  "import-logs": "compare.megatron", "export": "run.export", "estimate": "plan.estimate",
                  "project": "plan.project", "bandwidth": "plan.bandwidth", "tune": "plan.tune",
                  "configs": "parallel.shipped"}[command]
        sys.exit(import_command(module).main(rest) or 0)
    {"strategies": cmd_strategies, "peak": cmd_peak}[command](rest)
