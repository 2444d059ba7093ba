"""`hfscale export CHECKPOINT OUT`: a consolidated HuggingFace model (safetensors) from any strategy's checkpoint.

Only the weights — no optimizer state — in fp32, bf16 or fp16, loadable with `AutoModelForCausalLM.from_pretrained`.
Where the weights come from, by engine:
  ddp     the Trainer's `model.safetensors` (or its sharded index)
  zero*   DeepSpeed's partitioned fp32 master weights, consolidated with `deepspeed.utils.zero_to_fp32`
  fsdp*   the sharded `pytorch_model_fsdp_0/` (torch.distributed.checkpoint), read without a process group
The checkpoint must be complete (hfscale_checkpoint.json written after every rank finished saving). A run's output
directory stands for its newest complete, intact checkpoint, the one `--resume_from_checkpoint latest` would take.
"""

from pathlib import Path

from ..errors import ArgumentParser, HfscaleError, one_of
from ..files import check_writable_dir
from ..parallel.strategies import get_strategy
from .checkpoints import MARKER, checkpoint_dirs, damage, is_complete, latest_complete, read_marker

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _empty_model(checkpoint: Path):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(checkpoint)  # local directory: no code is run from it
    with torch.device("cpu"):
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _ddp_state_dict(checkpoint: Path) -> dict:
    from safetensors.torch import load_file

    single = checkpoint / "model.safetensors"
    if single.is_file():
        return load_file(single)
    index = checkpoint / "model.safetensors.index.json"
    if index.is_file():
        import json

        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return {k: v for f in files for k, v in load_file(checkpoint / f).items()}
    raise HfscaleError(f"{checkpoint}: no model.safetensors in this ddp checkpoint")


def _deepspeed_state_dict(checkpoint: Path) -> dict:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    # DeepSpeed's own reader (it unpickles the checkpoint's *_optim_states.pt files, which this user's run wrote).
    return get_fp32_state_dict_from_zero_checkpoint(str(checkpoint))


def _fsdp_state_dict(checkpoint: Path, model) -> dict:
    import torch.distributed.checkpoint as dcp

    shards = sorted(checkpoint.glob("pytorch_model_fsdp_*"))
    if not shards or not shards[0].is_dir():
        raise HfscaleError(f"{checkpoint}: no pytorch_model_fsdp_0/ (sharded FSDP state dict) in this fsdp checkpoint")
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(shards[0]), no_dist=True)  # fills the tensors in place; no pickle
    return state["model"]


def consolidated_state_dict(checkpoint: Path, model) -> dict:
    engine = get_strategy(read_marker(checkpoint)["strategy"]).engine
    if engine == "deepspeed":
        return _deepspeed_state_dict(checkpoint)
    if engine == "fsdp":
        return _fsdp_state_dict(checkpoint, model)
    return _ddp_state_dict(checkpoint)


def run_checkpoint(run_dir: Path) -> Path:
    """The checkpoint that stands for a run's output directory: its newest complete, intact one."""
    last = latest_complete(run_dir)
    if last is None:
        names = ", ".join(p.name for p in checkpoint_dirs(run_dir))
        raise HfscaleError(f"{run_dir}: a run directory without a complete, intact checkpoint ({names}: interrupted "
                           "or damaged saves)")
    return last


def export(checkpoint: Path, out: Path, dtype: str = "fp32") -> Path:
    """Write `out` (config.json + model.safetensors) from a checkpoint or a run's output directory; returns the
    checkpoint read. Nothing is left at `out` if this fails."""
    import shutil
    import tempfile

    import torch

    if dtype not in DTYPES:
        raise one_of("dtype", dtype, DTYPES)
    checkpoint, out = _checked_paths(Path(checkpoint), Path(out))
    model = _consolidated_model(checkpoint)
    model.to(getattr(torch, DTYPES[dtype]))
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt"):
            if (checkpoint / name).is_file():
                shutil.copy2(checkpoint / name, staging / name)
        if out.exists():
            out.rmdir()
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return checkpoint


def _checked_paths(checkpoint: Path, out: Path) -> tuple[Path, Path]:
    """(the complete, intact checkpoint to read - a run's newest when given its output directory -, out), or one line
    saying why not: nothing is read or written before these checks."""
    if checkpoint.is_file():
        raise HfscaleError(f"{checkpoint} is a file, not a checkpoint directory: give the folder that holds it "
                           f"({checkpoint.parent})")
    if not checkpoint.is_dir():
        raise HfscaleError(f"{checkpoint}: no such checkpoint directory")
    if not is_complete(checkpoint) and checkpoint_dirs(checkpoint):  # a run's output directory
        checkpoint = run_checkpoint(checkpoint)
    if not is_complete(checkpoint):
        raise HfscaleError(f"{checkpoint}: not a complete hfscale checkpoint (no {MARKER}; the save was interrupted "
                           "or it was not written by hfscale)")
    problem = damage(checkpoint, read_marker(checkpoint))
    if problem:
        raise HfscaleError(f"{checkpoint}: {problem}")
    if out.resolve().is_relative_to(checkpoint.resolve()):  # the Trainer's rotation or a resume would meet it there
        raise HfscaleError(f"{out} is inside the checkpoint {checkpoint} it exports; choose a directory outside it")
    check_writable_dir(out, "out")
    if out.exists() and any(out.iterdir()):
        raise HfscaleError(f"{out} exists and is not empty; choose a new directory")
    return checkpoint, out


def _consolidated_model(checkpoint: Path):
    """The checkpoint's whole model, every shard of every rank gathered into one, its tied head tied."""
    try:  # the files are the user's: a truncated or overwritten one fails deep in safetensors, DeepSpeed or DCP
        model = _empty_model(checkpoint)
        state = consolidated_state_dict(checkpoint, model)
    except (HfscaleError, KeyboardInterrupt, SystemExit):
        raise
    except BaseException as err:  # any library's reading error (DCP's CheckpointException is a BaseException)
        cause = next(iter(getattr(err, "failures", {}).values()), (err,))[0]  # DCP wraps each rank's exception
        first = (str(cause).strip().splitlines() or [""])[0]
        raise HfscaleError(f"{checkpoint}: cannot read its weights ({type(cause).__name__}: {first})") from None
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise HfscaleError(f"{checkpoint}: weights do not match the model (missing {sorted(set(missing) - tied)[:5]}, "
                           f"unexpected {sorted(unexpected)[:5]})")
    model.tie_weights()
    return model


def main(argv: list[str]) -> None:
    parser = ArgumentParser(prog="hfscale export", description="Consolidate a checkpoint (any strategy) into a "
                            "HuggingFace model directory: safetensors weights only, no optimizer state.")
    parser.add_argument("checkpoint", type=Path, help="a checkpoint-N directory, or a run's output directory (its "
                        "newest complete checkpoint)")
    parser.add_argument("out", type=Path, help="new directory for the model")
    parser.add_argument("--dtype", default="fp32", help="fp32 (default), bf16 or fp16")
    opts = parser.parse_args(argv)
    read = export(opts.checkpoint, opts.out, opts.dtype)
    print(f"exported {read} -> {opts.out} ({opts.dtype}); load with "
          f"AutoModelForCausalLM.from_pretrained('{opts.out}')")
