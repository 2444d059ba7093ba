"""Python's garbage collector in a training process (hfscale/run/garbage.py): paused through start-up, settled and
frozen at train begin, then collected on --gc_freq's schedule. A real run's record of it is checked in test_readme.py
(the default) and test_eval.py (a schedule, with evaluations)."""

import gc
import importlib
import weakref

import pytest

from hfscale import cli
from hfscale.run import garbage


class Node:
    def __init__(self):
        self.me = self  # a reference cycle: only the cyclic collector frees it


@pytest.fixture
def collector():
    """The collector as the test found it, whatever the code under test does (restore_process_state checks it too)."""
    was = gc.isenabled()
    yield
    gc.unfreeze()
    (gc.enable if was else gc.disable)()


def test_paused_restores_the_collector_and_unfreezes_what_a_run_froze(collector):
    gc.enable()
    with garbage.paused():
        assert not gc.isenabled()
        garbage.start_training(50)  # an in-process run freezes the caller's heap too
        assert gc.get_freeze_count() > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.disable()
    with garbage.paused():
        pass
    assert not gc.isenabled()  # a caller that had it off keeps it off
    gc.enable()
    with pytest.raises(RuntimeError), garbage.paused():
        raise RuntimeError("a run that fails")
    assert gc.isenabled()


def test_settle_frees_start_up_cycles_and_freezes_the_survivors(collector):
    gc.disable()
    cycle, survivor = Node(), Node()
    dead = weakref.ref(cycle)
    del cycle
    assert dead() is not None  # collection is off: the cycle is still there
    garbage.settle()
    assert dead() is None
    assert not any(o is survivor for o in gc.get_objects())  # frozen: no generation holds it any more


@pytest.mark.parametrize("gc_freq, automatic", [(0, True), (50, False)])
def test_start_training_hands_collection_to_the_schedule(collector, gc_freq, automatic):
    garbage.start_training(gc_freq)
    assert gc.isenabled() is automatic and gc.get_freeze_count() > 0


def test_after_step_collects_every_gc_freq_steps_only(collector):
    before = garbage.collections()
    made = [step for step in range(1, 11) if garbage.after_step(step, 4)]
    assert made == [4, 8]
    after = garbage.collections()
    assert after[1] - before[1] == 2 and after[2] == before[2]  # the young generations, never a full walk
    assert not any(garbage.after_step(step, 0) for step in range(1, 11))  # 0: Python's thresholds, never hfscale


def test_the_cli_imports_a_command_without_collections(monkeypatch):
    seen = []

    def import_module(name):
        seen.append((name, gc.isenabled()))
        return object()

    monkeypatch.setattr(importlib, "import_module", import_module)
    was = gc.isenabled()
    cli.import_command("plan.estimate")
    assert seen == [("hfscale.plan.estimate", False)] and gc.isenabled() == was


def test_the_launcher_imports_accelerate_without_collections_then_settles():
    """`python -m hfscale.run.launcher` (every launch hfscale makes): accelerate's launcher imported with no collection
    at all (dozens when imported as usual), then one full one and the survivors frozen; then collection is back on."""
    import json
    import subprocess
    import sys

    record = ("import gc, json, sys\nseen = []\n"  # each collection once accelerate's import began, till the freeze
              "gc.callbacks.append(lambda phase, info: phase == 'start' and 'accelerate' in sys.modules and "
              "gc.get_freeze_count() == 0 and seen.append(info['generation']))\n")
    launched = ("from hfscale.run import launcher\nsys.argv = ['accelerate launch', '--help']\n"
                "try:\n    launcher.main()\nexcept SystemExit:\n    pass\n")
    report = "print(json.dumps([seen, gc.get_freeze_count(), gc.isenabled()]))"
    (seen, frozen, enabled), (usual, _, _) = (
        json.loads(subprocess.run([sys.executable, "-c", record + body + report], capture_output=True, text=True,
                                  check=True).stdout.splitlines()[-1])
        for body in (launched, "import accelerate.commands.launch\n"))
    assert seen == [2]
    assert frozen > 50_000 and enabled
    assert len(usual) > 20  # what the pause saves: the usual import collects again and again
