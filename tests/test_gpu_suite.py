"""benchmarks/gpu_suite.py, the one command a GPU session runs, exercised on this CPU machine (--dry_run: the same
code, tiny sizes), so it works when a GPU is lent; and its output has the shape the committed GPU fixtures have (the
files tests/test_memory.py checks the estimate against)."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO, load_benchmark, run
from hfscale.errors import HfscaleError


def test_the_gpu_suite_runs_end_to_end_and_writes_what_the_fixtures_hold(tmp_path):
    proc = run([sys.executable, "benchmarks/gpu_suite.py", "--dry_run", "--out", str(tmp_path)], timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_suite.json").read_text())
    assert report["versions"]["torch"] and report["command"].startswith("python benchmarks/gpu_suite.py")
    assert report["host"]["cores"] >= 1 and report["host"]["cpu"]  # what a host-bound step runs on
    ddp = report["runs"][0]
    assert ddp["status"] == "ok" and ddp["tokens_per_s"] > 0 and ddp["estimate_allocated_gb"] > 0
    assert ddp["warmup_steps"] + ddp["measured_steps"] == 4 and ddp["perf_history"]  # the span the speed is timed over
    fixture = json.loads((REPO / "benchmarks/results/h100_2026-11-23/runs.json").read_text())["runs"][0]
    assert set(fixture["plan"]) <= set(ddp["plan"])  # a new GPU session's runs can become the next fixture as they are
    ref = report["references"][0]
    assert ref["tokens_per_s"] > 0 and ref["hfscale_ratio"] > 0
    assert [w["sm_mhz"] for w in ref["warmup_steps"]] == [None, None] and all(w["s"] > 0 for w in ref["warmup_steps"])
    rows = [json.loads(line) for line in (tmp_path / "activations.jsonl").read_text().splitlines()]
    h100 = json.loads((REPO / "benchmarks/results/h100_2026-11-23/cuda_activations.jsonl").read_text().splitlines()[0])
    assert len(rows) == 3 and all(set(h100) <= set(r) and r["activations"] > 0 and r["peak"] >= r["activations"]
                                  for r in rows)
    assert rows[1]["n_layer"] > rows[0]["n_layer"] and rows[1]["activations"] > rows[0]["activations"]  # it measures
    # the rows say how the step ran: hfscale's training forward (no KV cache), the last with the fused loss
    assert [(r["fused_loss"], r["kv_cache"]) for r in rows] == [(False, False), (False, False), (True, False)]
    assert "[" in proc.stdout and "s] run ddp x adamw" in proc.stdout  # progress as it goes
    assert (tmp_path / "gpu_suite.md").read_text().startswith("# CPU")
    # the host-sync run names each sync of a step; the dry run's CPU route counts the optimizer's own step reads
    counted = next(r for r in report["runs"] if "host-syncs" in r["variant"])
    assert counted["status"] == "ok" and "hand_written_ratio" not in counted  # slowed by its counter: no speed figure
    assert [s["step"] for s in counted["host_syncs"]["steps"]] == list(range(1, 5))
    table = (tmp_path / "gpu_suite.md").read_text()
    assert f"host syncs of {counted['run']}, step 2: {counted['host_syncs']['steps'][1]['reads']}" in table
    # a profiled step of hfscale's run and of the hand-written loop, summarised the same way
    profiled = next(r for r in report["runs"] if "profile" in r["variant"])  # the same run in the dry run
    assert profiled["profile"]["step"] == 2 and "hand_written_ratio" not in profiled  # 4 dry steps: the last but 2
    assert ref["profile"]["wall_s"] > 0 and ref["profile"]["host_top"]
    assert f"| {profiled['run']} | " in table and f"| {ref['reference']} | {ref['profile']['wall_s']:.4f}" in table


def _suite():
    return load_benchmark("gpu_suite")


def test_ddp_variants_are_chosen_by_name():
    suite = _suite()
    assert suite.variant_names("all") == {"compiled", "trainer-syncs", "gc0", "cudagraphs", "workers2", "host-syncs", "profile",
                                          "mbs2x", "vocab128", "flce", "mbs2x+vocab128", "mbs2x+vocab128+autotune",
                                          "per-step", "fp8", "seed2"}
    assert suite.variant_names("none") == set() and suite.variant_names("compiled,profile") == {"compiled", "profile"}
    with pytest.raises(HfscaleError, match="unknown ddp variant 'gc1'; choose one of: compiled, "):
        suite.variant_names("compiled,gc1")


@pytest.mark.parametrize("asked, expected", [
    ("all", ["", "", "auto-buckets", "5e7-buckets", "auto-buckets", "5e7-buckets"]), ("none", ["", ""]),
    ("5e7-buckets", ["", "", "5e7-buckets", "5e7-buckets"])])
def test_zero_variants_are_chosen_by_name(asked, expected, monkeypatch, tmp_path):
    """--zero_variants picks which bucket variants run beside the shipped zero2/zero3 JSONs (none: the strategies
    alone, as a short lease re-measures them); the runs themselves are faked here."""
    suite, started = _suite(), []
    monkeypatch.setattr(suite, "cpu_memory_follows_tensors", lambda: None)
    monkeypatch.setattr(suite, "launch_run", lambda strategy, optim, opts, out, gpus, compiled, variant, extra: (
        started.append(variant) or {"run": f"{strategy}-{variant}", "status": "fail", "error": "faked"}))
    monkeypatch.setattr(sys, "argv", ["gpu_suite.py", "--only", "runs", "--strategy", "zero2,zero3", "--optim", "adamw",
                                      "--zero_variants", asked, "--out", str(tmp_path / "out")])
    suite.main()
    assert started == expected
    with pytest.raises(HfscaleError, match="unknown ZeRO variant 'auto'; choose one of: auto-buckets, 5e7-buckets"):
        suite.zero_variant_names("auto")


def test_the_zero_variants_carry_their_bucket_sizes_into_the_run_and_its_estimate(tmp_path, monkeypatch):
    """The suite's before/after of the shipped ZeRO JSONs: each variant is the shipped JSON with other bucket sizes
    (transformers' "auto", filled from the model as the estimate fills it; a tenth of DeepSpeed's reduce bucket),
    accepted by hfscale for its strategy, and the run's plan (its memory estimate) reads those sizes; the run records
    the JSON's zero_optimization in its plan."""
    suite = _suite()
    from hfscale.train import check_args

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    variants = [(strategy, variant) for strategy, variant, _ in suite.ZERO_VARIANTS]
    assert len(set(variants)) == len(variants) and {s for s, _ in variants} == {"zero2", "zero3"}
    for strategy, variant, values in suite.ZERO_VARIANTS:
        path = suite.deepspeed_variant(strategy, variant, values, tmp_path)
        assert path.name == f"{strategy}-{variant}.json"
        zero = json.loads(path.read_text())["zero_optimization"]
        assert {k: zero[k] for k in values} == values and zero["stage"] == int(strategy[-1])
        assert suite.zero_optimization(strategy, ["--deepspeed", str(path)]) == {"zero_optimization": zero}
        shipped = check_args(["--strategy", strategy])[3].plan
        layout = check_args(["--strategy", strategy, "--deepspeed", str(path)])[3].plan.memory_layout
        hidden = shipped.shape.hidden
        auto = {"reduce_bucket_size": hidden ** 2, "stage3_prefetch_bucket_size": int(0.9 * hidden ** 2),
                "stage3_param_persistence_threshold": 10 * hidden}
        expected = {k: auto[k] if v == "auto" else v for k, v in values.items()}
        assert layout.reduce_bucket == expected["reduce_bucket_size"] != shipped.memory_layout.reduce_bucket
        if "stage3_prefetch_bucket_size" in values:
            assert layout.prefetch_bucket == expected["stage3_prefetch_bucket_size"]
            assert layout.persistence_threshold == expected["stage3_param_persistence_threshold"]
    assert suite.zero_optimization("ddp", []) == {}


def test_past_its_budget_the_suite_starts_nothing_and_says_what_it_skipped(tmp_path):
    proc = run([sys.executable, "benchmarks/gpu_suite.py", "--dry_run", "--budget_s", "0", "--out", str(tmp_path)],
               timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_suite.json").read_text())
    assert report["references"] == report["runs"] == report["grid"] == []
    assert report["skipped"][0] == "reference step" and "run ddp x adamw" in report["skipped"]
    assert any(s.startswith("grid ") for s in report["skipped"])


def test_every_ddp_variant_is_a_command_line_hfscale_accepts_on_a_gpu(monkeypatch):
    """A GPU session's minutes are not spent on a variant refused at start-up: each one's flags pass hfscale's checks on
    a faked one-GPU machine, and the Trainer-defaults variant really puts both defaults back."""
    import torch

    from hfscale.train import check_args

    suite = _suite()
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))  # an H100: float8 matmuls
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)  # --fp8 sets --bf16
    for variant, compiled, extra in suite.DDP_VARIANTS:
        flags = suite.fill_placeholders(extra, SimpleNamespace(steps=12, per_device_train_batch_size=8,
                                                               model="gpt2-350m"))
        model_args, _, kw, state = check_args(["--strategy", "ddp", "--model", "gpt2-350m", "--max_steps", "12",
                                               "--per_device_train_batch_size", "8", "--torch_compile",
                                               str(compiled).lower(), *flags])
        assert kw["torch_compile"] is compiled, variant
        # the MFU levers: twice the micro-batch; GPT-2's 50257 rows padded as Megatron and nanoGPT do
        assert kw["per_device_train_batch_size"] == (16 if "mbs2x" in variant else 8)
        assert state.plan.shape.vocab == (50304 if "vocab128" in variant else 50257)
        assert state.plan.fused_linear_cross_entropy is (variant == "flce")
        assert state.plan.float8 == ("tensorwise" if variant == "fp8" else None) and kw["bf16"] is (variant == "fp8")
        assert kw.get("torch_compile_mode") == {"cudagraphs": "reduce-overhead",
                                                "mbs2x+vocab128+autotune": "max-autotune-no-cudagraphs"}.get(variant)
        # per-step: every step its own interval from step 2; the rest: the GPU route's 5 untimed steps
        assert kw["perf_warmup_steps"] == (1 if variant == "per-step" else 5)
        if variant == "trainer-syncs":
            assert kw["logging_nan_inf_filter"] is True and kw["accelerator_config"] == {"non_blocking": False}
        else:
            assert kw["logging_nan_inf_filter"] is False and kw["accelerator_config"] == {"non_blocking": True}


def test_an_item_that_breaks_costs_that_item_not_the_call():
    """A lease is 15 minutes: an item that raises on a new machine is recorded with its error, and the suite goes on."""
    suite = _suite()
    assert suite.attempt(lambda a, b: a + b, 1, 2) == (3, None)
    result, error = suite.attempt(lambda: 1 / 0)
    assert result is None and error.startswith("ZeroDivisionError")
    report = {"references": [{"reference": "reference step", "compiled": False, "status": "fail", "error": "x"}],
              "runs": [], "grid": [], "skipped": [], "machine": "m", "date": "d", "command": "c"}
    suite.hand_written_ratios(report, 1)
    assert "| reference step | fail |" in suite.markdown(report)


def test_a_failed_run_says_the_ranks_own_error(tmp_path):
    """torchrun's summary of a failed rank names no cause: the rank's exception, where its results file holds one."""
    suite = _suite()
    results = tmp_path / "results.json"
    launcher = "ChildFailedError: train.py FAILED ... Root Cause (first observed failure): exitcode 1"
    assert suite.run_error(results, launcher) == launcher  # no results file: the launcher's output
    results.write_text("{not json")
    assert suite.run_error(results, launcher) == launcher
    results.write_text(json.dumps({"status": "fail", "error": "InductorError: LoweringException: " + "x" * 900}))
    assert suite.run_error(results, launcher) == ("InductorError: LoweringException: " + "x" * 900)[:600]


def test_only_the_same_step_gets_a_ratio_to_the_hand_written_one():
    """ddp against the hand-written step of the same compile mode, micro-batch and vocabulary: twice the micro-batch
    or a padded vocabulary is another step (its MFU says what it gained), a run slowed by what it records no figure."""
    suite = _suite()
    ref = {"reference": "r", "compiled": True, "tokens_per_s": 100.0, "per_device_train_batch_size": 8, "vocab": 50257}

    def run(variant, mbs=8, vocab=50257, compiled=True):
        return {"run": variant, "status": "ok", "strategy": "ddp", "optim": "adamw", "compiled": compiled,
                "variant": variant, "tokens_per_s": 110.0, "plan": {"per_device_train_batch_size": mbs, "vocab": vocab}}

    runs = [run(""), run("mbs2x", mbs=16), run("vocab128", vocab=50304), run("per-step"), run("eager", compiled=False)]
    report = {"references": [ref], "runs": runs}
    suite.hand_written_ratios(report, 1)
    assert [r.get("hand_written_ratio") for r in runs] == [1.1, None, None, None, None] and ref["hfscale_ratio"] == 1.1


def test_a_profiled_run_is_timed_without_its_profiled_period():
    """--profile profiles step 18 of 20: the profiler's host cost on every op lands in the last logging interval. On one
    H200 (2026-11-27) ddp logged 0.213, 0.118 and 0.289 s/it for steps 6-10, 11-15 and 16-20: its speed is that of
    11-15, the steady state hfscale's own figure would time (after the first log past the warm-up, whose one-off costs
    the first interval holds); a run with a single interval before the profiled period takes it, and a run whose every
    interval reaches that period keeps its own figures."""
    suite = _suite()
    history = [{"step": 10, "s_per_iter": 0.213}, {"step": 15, "s_per_iter": 0.118}, {"step": 20, "s_per_iter": 0.289}]
    assert suite.speed_before_profile(history, 5, 5, 18) == pytest.approx(0.118)
    assert suite.speed_before_profile(history, 5, 5, 16) == pytest.approx(0.118)  # the period starts after step 15
    assert suite.speed_before_profile(history, 5, 5, 15) == pytest.approx(0.213)  # 6-10 alone: all there is
    assert suite.speed_before_profile(history, 0, 5, 21) == pytest.approx((0.118 + 0.289) / 2)
    assert suite.speed_before_profile(history, 3, 2, 30) == pytest.approx((0.118 * 2 + 0.289 * 2) / 4)  # 14-15, 19-20
    assert suite.speed_before_profile(history, 5, 5, 10) is None
    entry = {"s_per_iter": 0.4, "tokens_per_s": 20_000.0, "tflops_per_gpu": 50.0, "mfu": 0.05, "warmup_steps": 5,
             "perf_history": history}
    clean = suite.unprofiled_speed(entry, 18, 5)
    assert clean["s_per_iter"] == pytest.approx(0.118) and clean["s_per_iter_with_profile"] == 0.4
    assert clean["tokens_per_s"] == pytest.approx(20_000 * 0.4 / 0.118)
    assert clean["mfu"] == pytest.approx(0.05 * 0.4 / 0.118)
    assert suite.unprofiled_speed(entry, 10, 5) is entry


def test_sections_are_chosen_before_anything_runs(monkeypatch, capsys, tmp_path):
    suite = _suite()
    for flags, message in ((["--references", "eagr"], "unknown reference 'eagr'"),
                           (["--grid_filter", "("], "--grid_filter: missing )"),
                           (["--grid_shapes", "8x1024x16"], "--grid_shapes: '8x1024x16' is not LAYERSxHIDDENx"),
                           (["--grid_shapes", "8x1024x15x50257x1024x8"], "--grid_shapes: '8x1024x15x50257x1024x8': "
                                                                        "heads (15) must divide hidden size (1024)"),
                           (["--only", "runs,grids"], "--only: unknown section 'grids'; choose one of: reference, ")):
        monkeypatch.setattr(sys, "argv", ["gpu_suite.py", "--dry_run", "--out", str(tmp_path / "out"), *flags])
        with pytest.raises(SystemExit) as exit_:
            suite.main()
        assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_chosen_grid_shapes_are_measured_eager_and_compiled(monkeypatch, tmp_path):
    """--grid_shapes replaces the grid's own shapes, and the compiled points take every chosen one (the grid's own:
    only the first COMPILED_SHAPES); the points themselves are faked here (a GPU measures them)."""
    suite, measured = _suite(), []
    monkeypatch.setattr(suite, "cpu_memory_follows_tensors", lambda: None)
    monkeypatch.setattr(suite, "grid_point", lambda mode, shape, compiled, device, fused_loss=False: measured.append(
        (mode, shape, compiled)) or {"mode": mode, "shape": list(shape)})
    monkeypatch.setattr(sys, "argv", ["gpu_suite.py", "--only", "grid", "--out", str(tmp_path / "out"),
                                      "--grid_shapes", "2x64x4x512x64x2,3x64x4x512x64x2,4x64x4x512x64x2,"
                                      "2x64x4x512x64x4",
                                      "--grid_filter", "^gpt2/sdpa/bf16/0( compiled)?$"])
    suite.main()
    shapes = [(2, 64, 4, 512, 64, 2), (3, 64, 4, 512, 64, 2), (4, 64, 4, 512, 64, 2), (2, 64, 4, 512, 64, 4)]
    mode = "gpt2/sdpa/bf16/0"
    assert len(shapes) > suite.COMPILED_SHAPES
    assert measured == [(mode, s, False) for s in shapes] + [(mode, s, True) for s in shapes]


@pytest.mark.parametrize("plan", sorted(_suite().PLANS))
def test_every_section_of_a_plan_is_a_command_its_script_accepts(plan):
    """A lease is 15 minutes of a GPU once in a while: an option renamed in gpu_suite.py (or fp8_matmul.py) must fail
    here, not there. Each section parses with its script's own parser, has its own name (its folder) and a later
    deadline than the one before, the last before 560 s of the call's 590."""
    suite = _suite()
    _, sections = suite.PLANS[plan]
    assert sections and len({s.name for s in sections}) == len(sections)
    deadlines = [s.deadline_s for s in sections]
    assert deadlines == sorted(set(deadlines)) and deadlines[-1] < 560
    for section in sections:
        command = section.command(Path("/out"), Path("/runs"), 100)
        script, args = command[1], command[2:]
        assert Path(script).is_file() and args[-2:] == ["--budget_s", "100"]
        if section.script == "gpu_suite.py":
            assert suite.options(args).out == Path("/out") / section.name
        else:
            load_benchmark(Path(script).stem).build_parser().parse_args(args)


def test_a_short_call_brings_every_deadline_inside_its_limit():
    """A short second call on a warm machine (--lease_s, its timeout_s) must end its sections before the tool stops
    it: an item starts only before its section's deadline and may run a whole item past it, so no deadline may fall
    within ITEM_S of the limit; without --lease_s each section keeps its own."""
    suite = _suite()
    assert suite.section_budget(340, 0, None) == 340
    assert suite.section_budget(340, 0, 300) == 300 - suite.ITEM_S
    assert suite.section_budget(100, 40, 300) == 60 and suite.ITEM_S >= 100


def test_a_plan_runs_its_sections_in_turn_and_packs_after_each(tmp_path, monkeypatch):
    """run_plan: each section its own process (its environment added), its log beside its folder, every run's
    results.json copied out and everything packed into the one archive after each section - here with sections that
    only write what a suite writes."""
    import tarfile

    suite = _suite()
    runs = tmp_path / "runs"
    writes = ("import json, os, sys, pathlib; out, runs = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]); "
              "out.mkdir(parents=True, exist_ok=True); (out / 'gpu_suite.json').write_text('{}'); "
              "(runs / 'ddp').mkdir(parents=True, exist_ok=True); "
              "(runs / 'ddp' / 'results.json').write_text(json.dumps({'threads': os.environ.get('OMP_NUM_THREADS')}));"
              " print('[ 0 s] run ddp')")
    plan = (suite.Section("first", 100, ()), suite.Section("second", 200, (), env=(("OMP_NUM_THREADS", "1"),)))
    monkeypatch.setitem(suite.PLANS, "fake", ("two sections", plan))
    monkeypatch.setattr(suite.Section, "command", lambda self, out, runs_root, budget: [
        sys.executable, "-c", writes, str(out / self.name), str(runs_root / self.name)])
    suite.run_plan("fake", tmp_path / "res", tmp_path / "results.tgz", None, runs)
    with tarfile.open(tmp_path / "results.tgz") as tar:
        names = set(tar.getnames())
    assert {"res/machine.txt", "res/first.log", "res/second.log", "res/first/gpu_suite.json",
            "res/runs/first-ddp.json", "res/runs/second-ddp.json"} <= names
    assert json.loads((tmp_path / "res" / "runs" / "second-ddp.json").read_text()) == {"threads": "1"}
    assert "[ 0 s] run ddp" in (tmp_path / "res" / "first.log").read_text()


def test_an_in_process_item_gives_the_device_back_before_the_runs_after_it(monkeypatch):
    """The suite steps the hand-written reference (and the grid's points) in its own process, then launches runs in
    others: on one H100 the 1.3B runs after a 1.3B reference ran out of memory beside the 35-55 GB the suite's process
    still reserved - freed tensors stay in torch's caching allocator until empty_cache. On a (faked) CUDA device
    release_device hands them back; on a CPU there is nothing to hand back."""
    import torch

    suite, emptied = _suite(), []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    suite.release_device("cpu")
    assert emptied == []
    suite.release_device("cuda:0")
    assert emptied == [True]


def test_a_failed_run_is_kept_out_of_the_hand_written_ratios():
    """A run that failed (out of memory) is recorded with its error and no step: the ratios skip it instead of stopping
    the suite (2026-11-26: a KeyError there ended two sections of an H100 lease)."""
    suite = _suite()
    report = {"references": [{"reference": "by hand", "compiled": True, "tokens_per_s": 100.0,
                              "per_device_train_batch_size": 8, "vocab": 50257}],
              "runs": [{"run": "ddp-adamw-compiled-mbs2x", "status": "fail", "error": "OutOfMemoryError"},
                       {"run": "ddp-adamw-compiled", "status": "ok", "strategy": "ddp", "optim": "adamw",
                        "compiled": True, "variant": "", "tokens_per_s": 97.0, "s_per_iter": 0.08, "tflops_per_gpu": 1.0,
                        "mfu": None, "estimate_allocated_gb": 1.0, "device_allocated_gb": 1.0,
                        "plan": {"per_device_train_batch_size": 8, "vocab": 50257}}]}
    suite.hand_written_ratios(report, 1)
    assert report["runs"][1]["hand_written_ratio"] == 0.97 and "hand_written_ratio" not in report["runs"][0]
    assert "| ddp-adamw-compiled-mbs2x | fail" in suite.markdown({**report, "machine": "GPU", "date": "today",
                                                                   "command": "c", "grid": [], "skipped": []})


def test_the_loss_only_reference_steps_hfscales_forward_and_gets_its_own_ratio(monkeypatch):
    """`--references loss-only`: the hand-written step with hfscale's training forward (the loss alone), so that
    hfscale's ratio to it is the Trainer's and hfscale's cost alone; the plain reference returns the logits, as a loop
    written with the HF model does. Each run gets one ratio to each."""
    import torch

    from hfscale.run import forward as training_forward

    suite = _suite()
    opts = suite.options(["--references", "compiled,loss-only"])
    assert opts.references == {"compiled", "loss-only"}
    opts.model, opts.seq_len, opts.per_device_train_batch_size, opts.steps = "tiny", 64, 2, 4  # as --dry_run sets them
    calls = []
    original = training_forward.use_training_forward
    monkeypatch.setattr(training_forward, "use_training_forward",
                        lambda model: calls.append(type(model).__name__) or original(model))
    torch.manual_seed(0)
    ref = suite.reference_step(opts, False, "cpu", loss_only=True)
    plain = suite.reference_step(opts, False, "cpu")
    assert calls == ["GPT2LMHeadModel"] and ref["loss_only"] and not plain["loss_only"]
    assert ref["reference"].endswith("the loss alone") and ref["tokens_per_s"] > 0
    run = {"run": "ddp-adamw", "status": "ok", "strategy": "ddp", "optim": "adamw", "compiled": False, "variant": "",
           "tokens_per_s": 90.0, "plan": {"per_device_train_batch_size": 2, "vocab": ref["vocab"]}}
    report = {"references": [{**plain, "tokens_per_s": 100.0}, {**ref, "tokens_per_s": 120.0}], "runs": [run]}
    suite.hand_written_ratios(report, 1)
    assert run["hand_written_ratio"] == 0.9 and run["loss_only_ratio"] == 0.75
    run.update(s_per_iter=0.1, tflops_per_gpu=1.0, mfu=None, estimate_allocated_gb=1.0, device_allocated_gb=1.0)
    run["perf_history"] = [{"step": 10, "s_per_iter": 0.1, "sm_mhz": 1980}, {"step": 15, "s_per_iter": 0.1,
                                                                            "sm_mhz": 1755}]
    table = suite.markdown({**report, "machine": "CPU", "date": "today", "command": "c", "grid": [], "skipped": []})
    assert "| 0.9 (0.75 of the loss-only step) |" in table
    assert "SM clock of ddp-adamw at each logging interval (MHz): 1980, 1755" in table  # a GPU run's, from NVML


def test_an_fp8_loss_curve_is_judged_against_two_bf16_seeds():
    """The fp8-loss plan's verdict (issue 64: fp8's loss within bf16's run-to-run spread): the mean of each curve's
    last fifth, fp8's distance from the bf16 run against the two seeds' distance; nothing said without all three."""
    suite = load_benchmark("gpu_suite")

    def run(variant, offset, points=60):
        return {"status": "ok", "strategy": "ddp", "variant": variant,
                "loss_history": [{"loss": 5 - i * 0.01 + offset} for i in range(points)]}

    within = suite.loss_lines([run("", 0.0), run("seed2", 0.02), run("fp8", 0.01)])
    assert "fp8 - bf16 0.0100 against the seeds' spread 0.0200: within it" in within[-1]
    outside = suite.loss_lines([run("", 0.0), run("seed2", 0.01), run("fp8", -0.03)])
    assert outside[-1].endswith("OUTSIDE it")
    assert suite.loss_lines([run("", 0.0), run("fp8", 0.0)]) == []  # no second seed: no spread to judge by
    assert suite.loss_lines([run("", 0.0), run("seed2", 0.0, points=5), run("fp8", 0.0)]) == []  # too few points


def test_the_grid_measures_each_point_with_and_without_dropout_for_the_dropout_fit(tmp_path):
    """--grid_dropout (the `dropout` plan): each grid point measured twice, side by side, a row holding both, which
    calibrate_activations.py --fit hands to its dropout fit rather than to the activation fit. On this CPU the SDPA
    point with dropout runs torch's math kernel: it keeps more."""
    proc = run([sys.executable, "benchmarks/gpu_suite.py", "--dry_run", "--only", "grid", "--grid_dropout", "0.1",
                "--grid_filter", "^gpt2/sdpa/autocast_bf16/0$", "--out", str(tmp_path)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "activations.jsonl").read_text().splitlines()]
    assert rows and all(r["dropout"] == 0.1 and r["activations"] > r["without"]["activations"] > 0 for r in rows)
    calibrate = load_benchmark("calibrate_activations")
    read = calibrate.read_rows([tmp_path / "activations.jsonl"])
    assert [r["without"] for r in read] == [r["without"] for r in rows]
    table = calibrate.fit_dropout(read)
    assert set(table) == {"gpt2/sdpa/autocast_bf16/0"} and table["gpt2/sdpa/autocast_bf16/0"][1] > 0


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_a_grid_row_carries_its_head_width_to_the_fit(family):
    """The `qwen3` and `llama` plans' grids: a Qwen3 or Llama point is built at its head width (the queries heads x
    head_dim wide, apart from the hidden size), its row says so, and calibrate_activations.py --fit plans the same shape
    from it."""
    suite = _suite()
    shape = suite.HEAD_WIDTH_DRY_SHAPES[0]
    row = suite.grid_point(f"{family}/sdpa/fp32/0", shape, False, "cpu")
    assert "error" not in row and row["head_dim"] == shape[-1] != row["hidden"] // row["heads"]
    planned = load_benchmark("calibrate_activations").row_shape(family, row)
    assert (planned.head_size, planned.q_hidden, planned.kv_hidden) == (64, 4 * 64, 2 * 64)
