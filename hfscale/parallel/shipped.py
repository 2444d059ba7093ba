"""The shipped launcher files, generated from the strategies: `accelerate_configs/<name>.yaml` and
`ds_configs/<name>.json` are written from `strategies/<name>.yaml` by `hfscale configs` and committed, for users who
reuse them with a stock Trainer script. hfscale's code reads the strategy (`Strategy.deepspeed_settings`), never those copies;
tests/test_strategies.py fails when a committed file differs from what this module writes.

    hfscale configs            # write every file the strategies define
    hfscale configs --check    # exit 1 naming each file that differs (a hand edit, or a strategy changed unwritten)
"""

import json
from pathlib import Path

from ..errors import ArgumentParser
from ..files import atomic_write_text
from .configs import config_dir
from .strategies import Strategy, all_strategies

# an example size, as accelerate's own configs give one: hfscale launch and slurm pass the real shape
_NODE_PROCESSES = 8


def accelerate_config_text(strategy: Strategy) -> str:
    """The strategy's `accelerate launch --config_file` YAML, with a comment on each line a user may change."""
    nodes = 2 if strategy.hybrid or (strategy.tensor_parallel and strategy.engine == "fsdp") else 1
    lines = [f"# {strategy.name}: {strategy.summary}",
             "# Generated from strategies/{0}.yaml by `hfscale configs`; hfscale reads the strategy, not this file."
             .format(strategy.name)]
    if strategy.comm_hook:
        lines += [f"# accelerate configs cannot name a comm hook: pass --strategy {strategy.name} to hfscale/train.py "
                  "as well (its flags: --powersgd_rank, --powersgd_warmup_steps)."]
    lines += ["compute_environment: LOCAL_MACHINE"]
    if strategy.engine == "deepspeed":
        init = ("true     # build the model partitioned (deepspeed.zero.Init); false: every process builds it whole"
                if strategy.zero_stage == 3 else "false")
        lines += ["distributed_type: DEEPSPEED", "deepspeed_config:",
                  f"  deepspeed_config_file: ds_configs/{strategy.deepspeed_config}   # relative to where you launch "
                  "(the repository root)",
                  f"  zero3_init_flag: {init}"]
    elif strategy.engine == "fsdp":
        offload = strategy.offloads_state("parameters")
        lines += ["distributed_type: FSDP", "fsdp_config:", "  fsdp_version: 2",
                  "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP   # one FSDP unit per block (GPT2Block, BloomBlock, "
                  "LlamaDecoderLayer)",
                  "  fsdp_reshard_after_forward: true                # full shard: parameters re-sharded after each "
                  "forward",
                  f"  fsdp_offload_params: {str(offload).lower()}" + ("   # parameters, gradients and optimizer step on "
                                                                      "CPU" if offload else ""),
                  "  fsdp_state_dict_type: SHARDED_STATE_DICT",
                  "  # hfscale's own runs turn this on (rank 0 builds the model, the others build it without weights) "
                  "and send",
                  "  # rank 0's non-persistent buffers itself; off here for stock scripts: with it on, transformers "
                  "gives the other",
                  "  # ranks zeros for them and accelerate keeps those - a rotary model (Llama's inv_freq) would rotate "
                  "nothing there",
                  "  fsdp_cpu_ram_efficient_loading: false"]
    else:
        lines += ["distributed_type: MULTI_GPU"]
    lines += _parallelism_config(strategy)
    lines += [f"num_machines: {nodes}",
              f"num_processes: {nodes * _NODE_PROCESSES}          # processes on all machines together (GPUs per node x "
              "num_machines); --num_processes N overrides",
              "machine_rank: 0", "main_training_function: main"]
    if strategy.engine != "deepspeed":  # DeepSpeed's precision is its JSON's, filled from the Trainer's flags
        lines += ["mixed_precision: 'no'     # precision comes from the Trainer flags (--bf16 / --fp16)"]
    lines += ["rdzv_backend: static", "same_network: true",
              "use_cpu: false            # on a machine without GPUs hfscale runs the same strategy on CPU (gloo) by "
              "itself"]
    return "\n".join(lines) + "\n"


def _parallelism_config(strategy: Strategy) -> list[str]:
    """accelerate's ParallelismConfig of a 2-D strategy, at the example size; hfscale launch/slurm pass the real one."""
    real = "hfscale launch/slurm pass --parallelism_config_* for the real shape"
    if strategy.hybrid:
        return ["parallelism_config:", f"  parallelism_config_dp_replicate_size: 2  # nodes; {real}",
                f"  parallelism_config_dp_shard_size: {_NODE_PROCESSES}      # processes per node"]
    if strategy.tensor_parallel and strategy.engine == "fsdp":
        return ["parallelism_config:", f"  parallelism_config_dp_shard_size: 2  # nodes; {real}",
                f"  parallelism_config_tp_size: {_NODE_PROCESSES}        # processes per node"]
    if strategy.tensor_parallel:
        return ["parallelism_config:", f"  parallelism_config_tp_size: {_NODE_PROCESSES}    # processes per node; {real}"]
    return []


def shipped_files() -> dict[Path, str]:
    """Every file the strategies define, by path, with the text `hfscale configs` writes."""
    files = {}
    for strategy in all_strategies().values():
        files[config_dir("accelerate_configs") / strategy.accelerate_config] = accelerate_config_text(strategy)
        if strategy.deepspeed_config:
            files[config_dir("ds_configs") / strategy.deepspeed_config] = (
                json.dumps(strategy.deepspeed_settings(), indent=2) + "\n")
    return files


def stale_files(files: dict[Path, str]) -> list[Path]:
    """The files of `files` whose text on disk is not theirs (missing ones included)."""
    return [path for path, text in files.items() if not path.is_file() or path.read_text() != text]


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="hfscale configs", allow_abbrev=False,
                            description="Write accelerate_configs/ and ds_configs/ from strategies/*.yaml.")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each file that differs")
    opts = parser.parse_args(argv)
    files = shipped_files()
    stale = stale_files(files)
    if opts.check:
        for path in stale:
            print(f"{path}: differs from what strategies/{path.stem}.yaml defines (run: hfscale configs)")
        return 1 if stale else 0
    for path in stale:
        atomic_write_text(path, files[path])
        print(f"wrote {path}")
    print(f"{len(files) - len(stale)} file(s) already as the strategies define them")
    return 0
