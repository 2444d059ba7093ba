"""Python's cyclic garbage collector in a training process: off during start-up, on a fixed schedule while training.

Start-up (importing torch, transformers, accelerate and DeepSpeed; building the model; the engine's set-up) creates
about 500k long-lived objects and almost no garbage cycles, yet each allocation burst triggers collections that
walk the whole growing heap: ~20% of a launched 2-process run's CPU on the tiny model (benchmarks/gc_startup.py). So
a process starts with collection off; once the model is built and again at train begin, one full collection frees
what start-up left (`settle`) and `gc.freeze()` moves the survivors (modules, the model, the engine) out of every
later collection's walk.

While training, what runs the collector is `--gc_freq` (torchtitan's `gc_freq`, Megatron's `--manual-gc-interval`):
N > 0, automatic collection stays off and every rank collects the young generations at the end of every Nth optimizer
step - at the same step on every rank, so no rank stalls its collective partners at a random moment - plus a full
collection after each evaluation; 0 hands the collector back to Python's automatic thresholds.

Pure stdlib: the `hfscale` console script pauses collection around its command's imports too.
"""

import contextlib
import gc

DEFAULT_GC_FREQ = 50  # torchtitan's default; a generation-1 collection on a frozen heap measured ~0.15 ms here


@contextlib.contextmanager
def paused():
    """No automatic collection while the block runs (a run's start-up, a command's imports); afterwards the collector
    as it was before - enabled or not, and nothing of the caller's left frozen by `start_training` (a run started
    in-process: tests, notebooks)."""
    was_enabled, was_frozen = gc.isenabled(), gc.get_freeze_count()
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count() != was_frozen:
            gc.unfreeze()
        if was_enabled:
            gc.enable()


def settle() -> None:
    """Free the garbage so far in one full collection and move every survivor to the permanent generation, which no
    later collection walks (a full collection costs ~0.3 s per 500k objects: walk the start-up heap once)."""
    gc.collect()
    gc.freeze()


def start_training(gc_freq: int) -> None:
    """At train begin: settle what the engine's set-up made, then collect as `gc_freq` says (0: Python's automatic
    thresholds; N: only `after_step`'s)."""
    gc.disable()
    settle()
    if gc_freq == 0:
        gc.enable()


def after_step(step: int, gc_freq: int) -> bool:
    """At the end of optimizer step `step`: the scheduled collection of the young generations, if this is one."""
    if gc_freq > 0 and step % gc_freq == 0:
        gc.collect(1)
        return True
    return False


def after_evaluation(gc_freq: int) -> None:
    """After an evaluation: a full collection of everything since train begin (objects that outlived a young
    collection and died later are only found by one), while the ranks are already paused together."""
    if gc_freq > 0:
        gc.collect()


def collections() -> list[int]:
    """Collections of each generation so far in this process (explicit ones included)."""
    return [generation["collections"] for generation in gc.get_stats()]
