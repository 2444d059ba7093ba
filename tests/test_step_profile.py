"""Where a step's time goes (issue 21: hfscale's step against a hand-written loop).

Host syncs (hfscale/run/host_syncs.py, `--count_host_syncs`): what the training loop reads back from the device per
optimizer step. A GPU waits at each one, and the host's per-step work then shows as idle device time, so the loop
hfscale runs must read nothing between logging steps. The profiler (hfscale/run/profile.py, `--profile_step`): one
loop period's trace and summary."""

import json
import os
import sys

import pytest

import torch

from conftest import REPO, TINY, run, shared_run
from hfscale.run.host_syncs import HostReads, is_host_sync
from hfscale.run.profile import busy_time, summarize

# code of the training loop itself: the Trainer's loop, accelerate, hfscale (the model and torch's optimizers are
# the same in a hand-written loop)
LOOP = ("transformers/trainer.py", "accelerate/", "hfscale/")


def test_value_reads_and_blocking_copies_are_host_syncs_and_device_work_is_not():
    host, device = torch.ones(3), torch.ones(3, device="meta")  # meta stands in for a GPU's tensors
    item, to, bool_ = torch.Tensor.item, torch.Tensor.to, torch.Tensor.__bool__
    assert is_host_sync(item, (device,), {}, "cuda")
    assert not is_host_sync(item, (host,), {}, "cuda")  # a host tensor on the GPU route: no wait
    assert is_host_sync(item, (host,), {}, "cpu")  # the CPU route: every tensor could be a device tensor
    assert is_host_sync(bool_, (device,), {}, "cuda")
    assert is_host_sync(to, (device, "cpu"), {}, "cuda")  # device to host
    assert is_host_sync(to, (host, torch.device("meta")), {}, "cuda")  # a blocking copy to the device
    assert not is_host_sync(to, (host, torch.device("meta")), {"non_blocking": True}, "cuda")
    assert not is_host_sync(to, (host, "cpu"), {}, "cuda")  # no copy at all
    assert not is_host_sync(to, (device, torch.bfloat16), {}, "cuda")  # a cast on the device
    assert not is_host_sync(torch.Tensor.add, (device, device), {}, "cuda")


def test_host_reads_name_the_line_that_made_them():
    x = torch.tensor([1.0, float("nan")])
    with HostReads("cpu") as reads:
        line = sys._getframe().f_lineno + 1
        if torch.isnan(x).any() or x.sum().item() > 0:
            y = x * 2  # device work: not counted
    assert y.shape == x.shape
    here = os.path.relpath(__file__)
    assert dict(reads.sites) == {f"{here}:{line} (test_host_reads_name_the_line_that_made_them)": 1}
    assert torch._C._len_torch_function_stack() == 0


def _run(out, *extra):
    cmd = [sys.executable, str(REPO / "hfscale" / "train.py"), *TINY, "--max_steps", "6", "--logging_steps", "3",
           "--gradient_accumulation_steps", "2", "--count_host_syncs", "--output_dir", str(out), *extra]
    proc = run(cmd, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "results.json").read_text())


def _loop_reads(results: dict) -> dict:
    steps = results["host_syncs"]["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    return {s["step"]: {site: n for site, n in s["sites"].items() if site.startswith(LOOP)} for s in steps}


@pytest.fixture()
def hfscale_run():
    """One run of hfscale's defaults, its host syncs counted and step 5 profiled (a step without logging): made once
    per session, whichever pytest-xdist worker asks first (a module fixture would be made once per worker)."""
    return shared_run("step-profile", lambda folder: _run(folder, "--profile_step", "5"))


def test_the_training_loop_reads_nothing_back_between_logging_steps(hfscale_run, tmp_path):
    """hfscale's run: the loop's only reads are the Trainer's logging (loss, grad norm, flos at steps 3 and 6) and
    hfscale's first-batch digest (step 1). With the Trainer's own default NaN filter, which hfscale turns off, every
    micro-batch's loss is read twice (`isnan(loss) or isinf(loss)`): 4 per step of 2 micro-batches here - the counter
    sees the syncs hfscale removed."""
    loop = _loop_reads(hfscale_run)
    assert {step: sites for step, sites in loop.items() if step in (2, 4, 5)} == {2: {}, 4: {}, 5: {}}
    assert all(site.startswith("transformers/trainer.py") for step in (3, 6) for site in loop[step])
    assert loop[1] and all(site.startswith("hfscale/run/trainer.py") for site in loop[1])
    filtered = _loop_reads(_run(tmp_path / "filter", "--logging_nan_inf_filter", "true"))
    for step in (2, 4, 5):
        [(site, reads)] = filtered[step].items()
        assert site.startswith("transformers/trainer.py") and reads == 4, filtered[step]


def test_busy_time_counts_overlapping_device_work_once():
    assert busy_time([]) == 0
    assert busy_time([(0, 10), (20, 25)]) == 15
    assert busy_time([(20, 25), (0, 10), (5, 12), (6, 7)]) == 17  # unsorted, overlapping, nested


def test_the_device_busy_time_is_its_work_not_the_spans_of_host_ranges():
    """On CUDA the profiler also draws each host range (`Optimizer.step#AdamW.step`) on the device's timeline, from its
    first kernel to its last: idle gaps included. bitsandbytes' 8-bit step, which waits for the device after every
    parameter, drew a 51 ms span over 9 ms of kernels (one H200, 2026-11-27); counted as work it hid the idle time."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    def event(name, start, end, device=True, annotation=False):
        return SimpleNamespace(name=name, device_type=DeviceType.CUDA if device else DeviceType.CPU,
                               is_user_annotation=annotation, time_range=SimpleNamespace(start=start, end=end),
                               self_device_time_total=end - start, self_cpu_time_total=end - start)

    events = [event("Optimizer.step#AdamW.step", 0, 50_000, annotation=True), event("kOptimizer8bit", 0, 4_000),
              event("kOptimizer8bit", 40_000, 45_000), event("Optimizer.step#AdamW.step", 0, 60_000, device=False)]
    summary = summarize(events, wall_s=0.1, on_device=True)
    assert summary["device_busy_s"] == pytest.approx(0.009)
    assert summary["device_idle_share"] == pytest.approx(0.91)
    assert [row["name"] for row in summary["device_top"]] == ["kOptimizer8bit"]
    assert summary["host_top"][0]["name"] == "Optimizer.step#AdamW.step"  # the host's range stays the host's


def test_a_profiled_step_leaves_a_trace_and_says_where_its_host_time_went(hfscale_run):
    profile = hfscale_run["profile"]
    assert profile["step"] == 5 and profile["wall_s"] > 0
    trace = json.loads(open(profile["trace"]).read())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"aten::addmm", "aten::mm"} & names  # the step's matmuls are in the trace
    assert not os.path.exists(profile["trace"] + ".partial")
    top = profile["host_top"]
    assert top and [r["self_s"] for r in top] == sorted((r["self_s"] for r in top), reverse=True)
    assert sum(r["self_s"] for r in top) <= profile["wall_s"]  # self times of one period, within it
    assert {r["name"] for r in top} & {"aten::addmm", "aten::mm"} and all(r["calls"] > 0 for r in top)
    assert "device_busy_s" not in profile  # CPU: no device activity to profile


def test_the_run_summary_says_what_the_profile_and_the_counter_found(hfscale_run):
    from hfscale.run.summary import format_summary
    from hfscale.run.results import Results

    profile = hfscale_run["profile"]
    text = format_summary(Results.from_dict(hfscale_run))
    top = profile["host_top"][0]
    assert (f"step 5 profiled: {profile['wall_s'] * 1e3:.1f} ms · busiest on the host {top['name']} "
            f"({top['self_s'] * 1e3:.1f} ms) · trace {profile['trace']}") in text
    reads = sorted(s["reads"] for s in hfscale_run["host_syncs"]["steps"])
    assert f"host syncs per step: {reads[0]} to {reads[-1]}, median {reads[3]} over 6 steps" in text
    on_gpu = {**hfscale_run, "profile": {**profile, "device_idle_share": 0.25,
                                         "device_top": [{"name": "sm90_gemm", "self_s": 0.01, "calls": 3}]}}
    assert "device idle 25.0% · busiest on the device sm90_gemm (10.0 ms)" in format_summary(Results.from_dict(on_gpu))


def test_total_flos_is_the_trainers_formula_on_the_models_own_parameter_count(hfscale_run):
    """HfscaleTrainer.floating_point_ops counts the parameters once instead of every micro-batch: the Trainer's
    total_flos must still be 6 x tokens x the model's non-embedding parameters (transformers' own count)."""
    from hfscale.models import PRESETS, build_model

    non_embedding = build_model(PRESETS["tiny"], seed=0).num_parameters(exclude_embeddings=True)
    tokens = 6 * 2 * 4 * 64  # steps x micro-batches x MBS x seq (TINY)
    assert hfscale_run["trainer_metrics"]["total_flos"] == 6 * tokens * non_embedding
