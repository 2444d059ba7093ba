"""Checkpoints a crash cannot spoil: a checkpoint counts only once every rank has finished writing it.

The Trainer writes `checkpoint-N/` (model, optimizer, scheduler, RNG, trainer state; sharded where the strategy
shards). After it returns, hfscale waits for every rank, then rank 0 writes `checkpoint-N/hfscale_checkpoint.json`
atomically — step, strategy, optimizer, world size, model shape, save time and size. A directory without that
file is a save that was interrupted: `--resume_from_checkpoint latest` never picks it, and a resumed run moves
it aside (renamed `incomplete-checkpoint-N-<time>`, which the Trainer's rotation and resume ignore).
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


def read_marker(path: Path) -> dict:
    try:
        return json.loads((Path(path) / MARKER).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise HfscaleError(f"{path}: unreadable {MARKER} ({err})") from None


def latest_complete(output_dir: Path) -> Path | None:
    complete = [p for p in checkpoint_dirs(output_dir) if is_complete(p)]
    return complete[-1] if complete else None


def dir_size_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def write_marker(path: Path, info: dict) -> None:
    atomic_write_text(Path(path) / MARKER, json.dumps(info, indent=2) + "\n")


def identity(strategy: str, optim: str, world_size: int, shape) -> dict:
    """What a checkpoint must share with the run that resumes it."""
    return {"strategy": strategy, "optim": optim, "world_size": world_size,
            "model": {k: getattr(shape, k) for k in ("family", "n_layer", "hidden", "n_head", "vocab", "positions", "ffn_size")}}


def resolve_resume(value: str | None, output_dir: Path, expected: dict) -> str | None:
    """The checkpoint directory to resume from, or None to start fresh. `latest` (or true) = the newest complete
    checkpoint in output_dir, or a fresh start when there is none (so one command serves the first launch and every
    relaunch). An explicit path must be a complete checkpoint of the same strategy, optimizer, world size and model."""
    if value in (None, "", "false", "False"):
        return None
    if value in LATEST:
        path = latest_complete(output_dir)
        if path is None:
            logger.info("no complete checkpoint in %s: starting from step 0", output_dir)
            return None
    else:
        path = Path(value)
        if not path.is_dir():
            raise HfscaleError(f"--resume_from_checkpoint {value}: no such checkpoint directory")
        if not is_complete(path):
            last = latest_complete(path.parent)
            raise HfscaleError(f"--resume_from_checkpoint {value}: incomplete checkpoint (no {MARKER}: its save was "
                               f"interrupted); the last complete one is {last or 'none'}")
    check_compatible(path, read_marker(path), expected)
    return str(path)


def check_compatible(path: Path, marker: dict, expected: dict) -> None:
    for key in ("strategy", "optim", "world_size", "model"):
        if marker.get(key) != expected[key]:
            raise HfscaleError(f"checkpoint {path} was saved with {key} {marker.get(key)!r} but this run has "
                               f"{expected[key]!r}; resume with the same {key} (or start a new --output_dir)")


def set_aside_incomplete(output_dir: Path) -> list[Path]:
    """Rename interrupted saves so neither resume nor the Trainer's checkpoint rotation ever uses them."""
    moved = []
    for path in checkpoint_dirs(output_dir):
        if not is_complete(path):
            target = path.with_name(f"incomplete-{path.name}-{time.strftime('%Y%m%d-%H%M%S')}")
            path.rename(target)
            logger.warning("set aside the interrupted save %s as %s", path, target.name)
            moved.append(target)
    return moved
