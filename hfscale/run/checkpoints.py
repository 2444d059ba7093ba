"""Checkpoints a crash cannot spoil: a checkpoint counts only once every rank has finished writing it.

The Trainer writes `checkpoint-N/` (model, optimizer, scheduler, RNG, trainer state; sharded where the strategy
shards). After it returns, hfscale waits for every rank, then rank 0 writes `checkpoint-N/hfscale_checkpoint.json`
atomically — step, strategy, optimizer, world size, model shape, save time and size. A directory without that
file is a save that was interrupted: `--resume_from_checkpoint latest` never picks it, and a resumed run moves
it aside (renamed `incomplete-checkpoint-N-<time>`, which the Trainer's rotation and resume ignore).

The marker also lists every file of the checkpoint with its size. A file missing or of another size since (a copy
cut short, a disk that filled while it was moved) makes the checkpoint damaged: a named one is refused in one line,
`latest` passes over it to the newest intact one, and a resumed run sets it aside (`damaged-checkpoint-N-<time>`).
Sizes only, so checking costs a `stat` per file, not a read; a file rewritten in place at the same size passes.
"""

import json
import logging
import re
import time
from pathlib import Path

from ..errors import HfscaleError
from ..files import atomic_write_text

logger = logging.getLogger("hfscale")

MARKER = "hfscale_checkpoint.json"
_STEP = re.compile(r"^checkpoint-(\d+)$")
LATEST = ("latest", "true", "True", "1")


def checkpoint_dirs(output_dir: Path) -> list[Path]:
    """checkpoint-N directories, oldest step first."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in output_dir.iterdir() if p.is_dir() and (m := _STEP.match(p.name))]
    return [p for _, p in sorted(found)]


def is_complete(path: Path) -> bool:
    return (Path(path) / MARKER).is_file()


def file_sizes(path: Path) -> dict[str, int]:
    """Every file of a checkpoint but its marker, by path relative to it, with its size in bytes."""
    path = Path(path)
    return {f.relative_to(path).as_posix(): f.stat().st_size
            for f in sorted(path.rglob("*")) if f.is_file() and f.relative_to(path).as_posix() != MARKER}


def damage(path: Path, marker: dict) -> str | None:
    """What is wrong with a complete checkpoint's files now, or None. Markers written before hfscale listed the files
    (no `files`) are taken as they are."""
    recorded = marker.get("files")
    if not isinstance(recorded, dict):
        return None
    for name, size in recorded.items():
        try:
            now = (Path(path) / name).stat().st_size
        except OSError:
            return f"its file {name} is missing"
        if now != size:
            return f"its file {name} is {now:,} bytes but was {size:,} when it was saved (cut short or changed since)"
    return None


def _damaged(path: Path) -> str | None:
    """What is wrong with a complete checkpoint (an unreadable marker, a file not as saved), or None."""
    try:
        problem = damage(path, read_marker(path))
    except HfscaleError as err:
        return str(err)
    return f"{path}: {problem}" if problem else None


def read_marker(path: Path) -> dict:
    try:
        marker = json.loads((Path(path) / MARKER).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HfscaleError(f"{path}: unreadable {MARKER} ({err})") from None
    if not isinstance(marker, dict):
        raise HfscaleError(f"{path}: unreadable {MARKER} (not a JSON object)")
    return marker


def latest_complete(output_dir: Path) -> Path | None:
    """The newest complete checkpoint whose files are as they were saved; a damaged newer one is named in a warning."""
    for path in reversed([p for p in checkpoint_dirs(output_dir) if is_complete(p)]):
        problem = _damaged(path)
        if problem is None:
            return path
        logger.warning("passing over the damaged checkpoint %s", problem)
    return None


def write_marker(path: Path, info: dict) -> dict:
    """Mark a checkpoint complete: `info`, plus every file it holds now with its size. Returns what was written."""
    files = file_sizes(path)
    marker = {**info, "size_bytes": sum(files.values()), "files": files}
    atomic_write_text(Path(path) / MARKER, json.dumps(marker, indent=2) + "\n")
    return marker


MODEL_IDENTITY = ("family", "n_layer", "hidden", "n_head", "vocab", "positions", "ffn_size", "kv_heads", "tied_head",
                  "head_size")


def identity(strategy: str, optim: str, world_size: int, shape, data: dict | None = None) -> dict:
    """What a checkpoint must share with the run that resumes it. `data`: what decides its place in the data (the
    batch shape, the data seed, run/data.position_identity); a run with --ignore_data_skip starts the data over."""
    return {"strategy": strategy, "optim": optim, "world_size": world_size,
            "model": {k: getattr(shape, k) for k in MODEL_IDENTITY},
            "data": data or {}}


def data_position(plan, data_seed: int, text: dict) -> dict:
    """The `data` of identity(): the Trainer finds its place again by skipping as many batches as it had trained."""
    return {"seq_len": plan.seq_len, "per_device_train_batch_size": plan.per_device_train_batch_size,
            "gradient_accumulation_steps": plan.gradient_accumulation_steps, "data_seed": data_seed, **text}


def resolve_resume(value: str | None, output_dir: Path, expected: dict, data_skip: bool = True) -> str | None:
    """The checkpoint directory to resume from, or None to start fresh. `latest` (or true) = the newest complete
    checkpoint in output_dir, or a fresh start when there is none (so one command serves the first launch and every
    relaunch). The checkpoint must be of the same strategy, optimizer, world size and model, and (`data_skip`: the
    Trainer resumes its place in the data, unless --ignore_data_skip) of the same data position."""
    if value in (None, "", "false", "False"):
        return None
    if value in LATEST:
        path = latest_complete(output_dir)
        if path is None:
            logger.info("no complete checkpoint in %s: starting from step 0", output_dir)
            return None
    else:
        path = Path(value)
        if path.is_file():
            raise HfscaleError(f"--resume_from_checkpoint {value} is a file, not a checkpoint directory: give the "
                               f"folder that holds it ({path.parent})")
        if not path.is_dir():
            raise HfscaleError(f"--resume_from_checkpoint {value}: no such checkpoint directory")
        newest = None if is_complete(path) else latest_complete(path)
        if newest is not None:  # a run's folder, named as `hfscale export` takes it: its newest complete checkpoint
            logger.info("--resume_from_checkpoint %s is a run's folder: resuming from its newest complete checkpoint "
                        "%s", value, newest)
            path = newest
        elif not is_complete(path):
            last = latest_complete(path.parent)
            raise HfscaleError(f"--resume_from_checkpoint {value}: incomplete checkpoint (no {MARKER}: its save was "
                               f"interrupted); the last complete one is {last or 'none'}")
    marker = read_marker(path)  # `latest` found it intact; a named one is checked here
    problem = damage(path, marker) if value not in LATEST else None
    if problem:
        last = latest_complete(path.parent)
        raise HfscaleError(f"--resume_from_checkpoint {path}: {problem}; the last intact one is {last or 'none'}")
    check_compatible(path, marker, expected, data_skip)
    return str(path)


def saved_model(marker: dict):
    """A marker's model identity; one written before Llama (GPT-2 and BLOOM alone) holds no key/value heads or tied
    head, and had one key/value head per query head and a tied head; one written before Qwen3 holds no head size, and
    had hidden / heads."""
    model = marker.get("model")
    if isinstance(model, dict) and "kv_heads" not in model and "n_head" in model:
        model = {**model, "kv_heads": model["n_head"], "tied_head": True}
    if isinstance(model, dict) and "head_size" not in model and isinstance(model.get("hidden"), int) \
            and isinstance(model.get("n_head"), int) and model["n_head"] > 0:
        model = {**model, "head_size": model["hidden"] // model["n_head"]}
    return model


def check_compatible(path: Path, marker: dict, expected: dict, data_skip: bool = True) -> None:
    for key in ("strategy", "optim", "world_size", "model"):
        if (saved_model(marker) if key == "model" else marker.get(key)) != expected[key]:
            raise HfscaleError(f"checkpoint {path} was saved with {key} {marker.get(key)!r} but this run has "
                               f"{expected[key]!r}; resume with the same {key} (or start a new --output_dir)")
    saved = marker.get("data")
    if not data_skip or not isinstance(saved, dict):  # --ignore_data_skip, or a marker older than the data identity
        return
    for key, value in expected.get("data", {}).items():
        if key in saved and saved[key] != value:
            raise HfscaleError(
                f"checkpoint {path} was saved with {key} {saved[key]!r} but this run has {value!r}: the Trainer finds "
                "its place in the data by skipping the batches it trained, so it would skip or repeat samples; resume "
                f"with the same {key}, pass --ignore_data_skip to start the data over, or start a new --output_dir")


def set_aside_unusable(output_dir: Path) -> list[Path]:
    """Rename interrupted saves and damaged checkpoints so neither resume nor the Trainer's checkpoint rotation ever
    uses them (nor a new save of the same step lands among their files)."""
    moved = []
    for path in checkpoint_dirs(output_dir):
        if not is_complete(path):
            kind, why = "incomplete", "interrupted save"
        elif _damaged(path):
            kind, why = "damaged", "damaged checkpoint"
        else:
            continue
        target = path.with_name(f"{kind}-{path.name}-{time.strftime('%Y%m%d-%H%M%S')}")
        path.rename(target)
        logger.warning("set aside the %s %s as %s", why, path, target.name)
        moved.append(target)
    return moved
