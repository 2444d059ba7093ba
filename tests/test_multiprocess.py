"""Every strategy runs for real with 2 processes on CPU, proves it is the strategy asked for, and shards what it claims.

Runs are real `accelerate launch` subprocesses; each is started once per session and reused by the checks below.
"""

import functools
import math
from pathlib import Path

import pytest

from conftest import (BF16_RUNS, HOST_RUNS, PARTITION_OPTIM, PARITY_STEPS, PARITY_STRATEGIES, REPO, TINY,
                      accelerate_launch, assert_figures_count_the_loaders, bf16_result, fsdp_tp_job, host_memory_run,
                      hsdp_8bit_job, hsdp_job, llama_pair_run, partition_run, parity_runs, run, shared_train, swept_run,
                      tp_fp8_run, tune_trial)

pytestmark = pytest.mark.multiprocess

SHARED = PARITY_STRATEGIES  # zero1, zero2, zero3, fsdp


def result(key: str, strategy, *extra, **kw) -> dict:
    return shared_train(key, strategy, *extra, **kw)


@pytest.fixture()
def parity():
    """One `hfscale parity` over the sharded strategies (conftest.parity_runs): the CI parity check."""
    return parity_runs()


def parity_run(strategy, nproc=2, mbs=4):
    if nproc == 2 and mbs == 4:  # the runs `hfscale parity` made
        return parity_runs()["runs"][strategy]
    return result(f"parity-{strategy}-np{nproc}", strategy, "--fingerprint_weights",
                  "--per_device_train_batch_size", str(mbs), "--include_num_input_tokens_seen", "true", nproc=nproc,
                  steps=PARITY_STEPS)


def losses(res) -> list[float]:
    return [h["loss"] for h in res["loss_history"]]


def max_rel(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) > 0
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def test_hfscale_parity_passes_for_every_sharded_strategy(parity):
    """`hfscale parity`: same seed, data and fp32, 20 steps -> losses, grad norms and weights within 1e-4 of ddp."""
    proc, report = parity["proc"], parity["report"]
    assert proc["returncode"] == 0, proc["stdout"][-3000:]
    assert report["tolerance"] == 1e-4
    verdicts = {c["strategy"]: c for c in report["comparisons"]}
    assert set(verdicts) == set(SHARED)
    for strategy, c in verdicts.items():
        assert c["verdict"] == "pass" and c["steps"] == PARITY_STEPS, c
        assert c["loss_max_rel"] <= 1e-4 and c["grad_norm_max_rel"] <= 1e-4 and c["weights_max_rel"] <= 1e-4
    assert "all judged strategies match ddp" in proc["stdout"]


@pytest.mark.parametrize("strategy", SHARED)
def test_parity_with_ddp(strategy):
    """The same check by hand on the parity runs' results files (independent of hfscale.parity's arithmetic)."""
    ref, res = parity_run("ddp"), parity_run(strategy)
    assert len(losses(res)) == PARITY_STEPS
    assert max_rel(losses(res), losses(ref)) <= 1e-4
    ref_w, w = ref["final_weights"], res["final_weights"]
    assert ref_w.keys() == w.keys()
    for name, (ref_sum, ref_l1, ref_l2) in ref_w.items():
        total, l1, l2 = w[name]
        # A sum can be ~0 (biases), so its difference is measured against the tensor's magnitude (L1).
        assert abs(total - ref_sum) / ref_l1 <= 1e-4, name
        assert max_rel([l1, l2], [ref_l1, ref_l2]) <= 1e-4, name
    # The model moved: parity is not two untrained copies agreeing.
    assert losses(ref)[-1] < losses(ref)[0] - 0.05


@pytest.mark.parametrize("strategy", ["ddp", *SHARED])
def test_each_rank_trains_on_its_own_samples(strategy):
    check = parity_run(strategy)["strategy_check"]
    assert check["world_size_launcher"] == check["world_size_accelerate"] == check["world_size_torch"] == 2
    first = check["first_batch_per_rank"]
    assert len(first) == 2 and first[0] != first[1]
    assert_figures_count_the_loaders(parity_run(strategy))


def test_one_and_two_processes_step_the_same_tokens():
    """The same global batch (1 x 8 or 2 x 4 samples) gives the same tokens per step and the same losses; and the
    reported tokens/s equals the tokens the Trainer itself counted entering the model on all ranks
    (include_num_input_tokens_seen gathers every batch) over the measured steps, divided by the time between those
    steps' log points - a count and a clock the Meter never touches."""
    one, two = parity_run("ddp", nproc=1, mbs=8), parity_run("ddp")
    assert one["config"]["global_batch_size"] == two["config"]["global_batch_size"] == 8
    assert max_rel(losses(one), losses(two)) <= 1e-4
    for res in (one, two):
        perf, points = res["perf"], {p["step"]: p for p in res["loss_history"]}
        start, end = points[res["perf"]["warmup_steps"]], points[res["steps"]]  # the Meter's measured span
        counted = end["tokens_counted"] - start["tokens_counted"]
        assert counted == (end["step"] - start["step"]) * 8 * 64  # what the loaders delivered, all ranks
        seconds = end["elapsed_s"] - start["elapsed_s"]
        assert perf["tokens_per_s"] == pytest.approx(counted / seconds, rel=0.1), (perf["tokens_per_s"], counted, seconds)
        assert perf["tokens_per_s_per_gpu"] == pytest.approx(perf["tokens_per_s"] / res["config"]["world_size"])
        assert perf["days_to_budget"] == pytest.approx(1e11 / perf["tokens_per_s"] / 86400)


@pytest.mark.parametrize("strategy,wrapper", [("ddp", "DistributedDataParallel"), ("fsdp", "FSDPGPT2LMHeadModel"),
                                              ("zero1", "DeepSpeedEngine"), ("zero2", "DeepSpeedEngine"),
                                              ("zero3", "DeepSpeedEngine")])
def test_sharding_is_real(strategy, wrapper):
    check = parity_run(strategy)["strategy_check"]
    assert check["wrapper"] == wrapper and check["compiled"] is False
    # accelerate's own view too (it once drifted back to MULTI_CPU after `prepare` under FSDP on CPU)
    assert check["distributed_type"] == {"ddp": "MULTI_CPU", "fsdp": "FSDP"}.get(strategy, "DEEPSPEED")
    params, states = check["parameters"], check["optimizer_states"]
    param_share = params["elements_local"] / params["elements_total"]
    state_share = states["elements_local"] / states["elements_unsharded"]
    sharded_params = strategy in ("fsdp", "zero3")
    sharded_states = strategy != "ddp"
    assert math.isclose(param_share, 0.5, abs_tol=0.02) if sharded_params else param_share == 1.0
    assert math.isclose(state_share, 0.5, abs_tol=0.02) if sharded_states else state_share == 1.0
    if strategy.startswith("zero"):
        assert check["zero_stage"] == int(strategy[-1])


def test_compiled_ddp_is_proved_and_trains_the_same_model():
    """ddp compiles by default on GPUs (planning.COMPILE_BY_DEFAULT_ON_GPUS), and accelerate compiles after wrapping:
    OptimizedModule(DDP(model)). The start-up proof sees DDP through it, and the compiled model trains ddp's curve.
    The backend is aot_eager: the same wrappers, dynamo's DDP graph splitting and AOT autograd, without inductor's C++
    code generation (13 s instead of 37 from a cold cache here; inductor's run matched ddp's curve within 1e-4 too)."""
    ref = parity_run("ddp")
    res = result("ddp-compiled", "ddp", "--torch_compile", "true", "--torch_compile_backend", "aot_eager",
                 "--fingerprint_weights", "--include_num_input_tokens_seen", "true", steps=PARITY_STEPS)
    check = res["strategy_check"]
    assert check["wrapper"] == "DistributedDataParallel" and check["compiled"] is True
    assert res["config"]["torch_compile"] is True and "compiled" in res["_stdout"]
    assert max_rel(losses(res), losses(ref)) <= 1e-4
    assert res["memory"]["model_states_per_rank"] == ref["memory"]["model_states_per_rank"]  # measured through it


# bf16 for every strategy: conftest.BF16_RUNS (also the uninterrupted references of the fault tests).

@pytest.mark.parametrize("strategy", list(BF16_RUNS))
def test_bf16_reaches_the_engine_and_trains_the_same_model(strategy):
    res = bf16_result(strategy)
    assert res["config"]["precision"] == "bf16" and res["strategy"] == strategy
    check = res["strategy_check"]
    if strategy.startswith("zero"):  # DeepSpeed trains a bf16 copy; fp32 masters in the optimizer
        assert check["parameters"]["dtypes"] == ["bfloat16"] and check["optimizer_states"]["dtypes"] == ["float32"]
    if strategy.startswith("fsdp"):  # FSDP2 keeps fp32 shards and computes in its policy's dtype
        assert check["fsdp_param_dtype"] == "bfloat16" and check["parameters"]["dtypes"] == ["float32"]
    # Same seed, data and samples per step as the fp32 ddp reference (MBS 2 x GAS 2 vs MBS 4): the same curve up to
    # bf16 rounding (8 mantissa bits)...
    bf16, fp32 = losses(res), losses(parity_run("ddp"))
    assert max_rel(bf16, fp32) < 5e-3
    if strategy != "ddp_powersgd":  # ...and not the fp32 curve itself: bf16 really ran (PowerSGD is lossy anyway)
        assert bf16 != fp32


@pytest.mark.parametrize("strategy", ["zero2_offload", "zero3_offload", "fsdp_offload"])
def test_offload_strategies(strategy):
    res = bf16_result(strategy)
    check = res["strategy_check"]
    assert check["optimizer_states"]["devices"] == ["cpu"]
    assert check["parameters"]["devices"] == ["cpu"]
    # on a CPU machine "device == cpu" proves nothing: the engines' own offload settings must differ from the
    # non-offload strategy's (its parity run), and ZeRO-Offload must step in DeepSpeed's CPU Adam
    plain = parity_run(strategy.replace("_offload", ""))["strategy_check"]
    if strategy.startswith("zero"):
        assert check["offload_optimizer"] is True and plain["offload_optimizer"] is False
        assert check["offload_param"] is (strategy == "zero3_offload") and plain["offload_param"] is False
        assert check["optimizer_states"]["optimizer"].endswith("DeepSpeedCPUAdam")
        assert plain["optimizer_states"]["optimizer"] == "torch.optim.adamw.AdamW"
    else:
        assert check["parameters"]["dtensor"]
        assert check["fsdp_offload_policy"] == ["CPUOffloadPolicy"] and plain["fsdp_offload_policy"] == ["OffloadPolicy"]
    assert math.isclose(check["optimizer_states"]["elements_local"] / check["optimizer_states"]["elements_unsharded"], 0.5, abs_tol=0.02)


@functools.cache
def _tiny_one_dimensional_elements() -> int:
    """Elements of the tiny model's 1-D parameters (biases and LayerNorm gains): the tensors the recipe does not
    decay (nanoGPT's rule by dimension, independent of the Trainer's rule by name)."""
    from hfscale.models import build_model, model_shape
    return sum(p.numel() for p in build_model(model_shape("tiny"), seed=0).parameters() if p.dim() == 1)


@pytest.mark.parametrize("strategy", list(BF16_RUNS))
def test_weight_decay_spares_biases_and_norms_under_every_strategy(strategy):
    """Every engine steps the Trainer's two groups: --weight_decay on the matrices, none on biases and norms. DeepSpeed
    builds the offload strategies' CPU Adam from its config's optimizer block, which transformers hands every
    parameter in one group (weight decay on everything) unless hfscale gives it the groups."""
    res = bf16_result(strategy)
    assert res["config"]["recipe"]["weight_decay"][0] == 0.1
    states = res["strategy_check"]["optimizer_states"]
    groups = dict(states["weight_decay"])
    assert set(groups) == {0.0, 0.1}, groups
    share = states["elements_local"] / states["elements_unsharded"]  # this rank's part of the states (ZeRO/FSDP: ~1/2)
    assert groups[0.0] == pytest.approx(share * _tiny_one_dimensional_elements(), rel=0.02), (groups, share)
    assert groups[0.0] + groups[0.1] == pytest.approx(states["elements_local"] / 2, rel=1e-6)  # AdamW: 2 states each


def test_powersgd_hook_compresses_after_warmup():
    res = bf16_result("ddp_powersgd")
    psgd = res["strategy_check"]["powersgd"]
    assert psgd["rank"] == 2 and psgd["warmup_steps"] == 3
    assert psgd["compressing"] and psgd["compressed_buckets"] >= 1
    assert psgd["iterations"] == PARITY_STEPS  # one hook iteration per optimizer step


def eight_bit_run(strategy: str) -> dict:
    """The 3-step adamw_8bit run of ddp, zero2 or fsdp: the 8-bit checks' and those strategies' adamw_8bit pair (zero2's
    on Qwen2: QWEN2_PAIRS)."""
    return result(f"{strategy}-8bit", strategy, "--optim", "adamw_8bit", *pair_model(strategy, "adamw_8bit"),
                  steps=3)


@pytest.mark.parametrize("strategy", ["ddp", "zero2", "fsdp"])
def test_adamw_8bit_states_are_uint8_and_train_like_ddp(strategy):
    """bitsandbytes under ddp and ZeRO; under FSDP2 torchao's AdamW8bit, whose 8-bit states are DTensors of its own
    subclass (uint8 codes, fp32 block scales): sharded per rank, and the same losses as ddp's bitsandbytes run up to
    the two libraries' quantization."""
    res = eight_bit_run(strategy)
    states = res["strategy_check"]["optimizer_states"]
    assert "uint8" in states["dtypes"]
    assert states["optimizer"].startswith("torchao." if strategy == "fsdp" else "bitsandbytes.")
    if strategy == "fsdp":
        assert states["elements_local"] / states["elements_unsharded"] == pytest.approx(0.5, abs=0.02)
        reference = losses(eight_bit_run("ddp"))
        assert max_rel(losses(res), reference) < 1e-4
        for noise in ("Failed to load", "is an Enum subclass"):  # torchao's import-time noise stays out of the log
            assert noise not in res["_stdout"] + res["_stderr"], noise


def test_adafactor_states_are_factored():
    res = pair_result("ddp", "adafactor")
    states = res["strategy_check"]["optimizer_states"]
    assert states["factored"] and {"exp_avg_sq_row", "exp_avg_sq_col"} <= set(states["keys"])
    # Factored second moments are far smaller than AdamW's two full copies.
    assert states["elements_local"] < 0.1 * 2 * res["model"]["params_model"]


def test_launcher_config_file_selects_the_strategy():
    res = bf16_result("zero2")
    assert res["strategy"] == "zero2"
    assert res["strategy_check"]["wrapper"] == "DeepSpeedEngine" and res["strategy_check"]["zero_stage"] == 2


def test_launcher_config_contradicting_strategy_is_refused(tmp_path):
    args = ["--strategy", "zero1", "--max_steps", "1", "--output_dir", str(tmp_path / "out")]
    proc = run(accelerate_launch(args, 2, str(REPO / "accelerate_configs" / "zero3.yaml")))
    assert proc.returncode == 2
    assert "hfscale: error: --strategy zero1 contradicts the launcher's config, which asks for zero3" in proc.stderr
    assert proc.stderr.count("hfscale: error:") == 1  # both ranks refused it; the first said it (errors.first_to_say)
    assert "Traceback" not in proc.stderr  # the ranks' refusal, not torch's report of a failed child
    assert not (tmp_path / "out").exists()


def test_metrics_reach_tensorboard_and_results():
    res = parity_run("zero1")
    out = Path(parity_runs()["folder"]) / "zero1"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/grad_norm", "train/lr", "perf/tokens_per_s", "perf/tflops_per_gpu", "perf/mfu"} <= tags
    assert [e.value for e in acc.Scalars("train/loss")] == pytest.approx(losses(res), rel=1e-6)
    # the same loss against tokens and training time, each its own curve though written in one event per log
    assert [e.step for e in acc.Scalars("train_by_tokens/loss")] == [p["tokens"] for p in res["loss_history"]]
    assert [e.value for e in acc.Scalars("train_by_time_ms/loss")] == pytest.approx(losses(res), rel=1e-6)
    model = res["model"]
    assert model["params_formula"] == model["params_model"] == model["params_trainable"]
    assert res["perf"]["peak_source"].startswith("measured")  # a CPU never gets a GPU datasheet peak
    assert "hfscale run" in res["_stdout"] and "days on 2 process(es)" in res["_stdout"]  # a CPU run's ranks
    # clean logs: hfscale's lines, the progress bar and the summary; no config dumps or library deprecations
    output = res["_stdout"] + res.get("_stderr", "")  # the parity runs' launch.log holds both streams
    for noise in ("Model config", "Generate config", "is deprecated", "kernels-community", "Configuration saved in"):
        assert noise not in output, noise


# ---- every strategy x optimizer pair: runs for real with 2 processes, or is refused before launch ---------------------
from hfscale.parallel.strategies import INCOMPATIBLE, OPTIMIZERS, all_strategies  # noqa: E402

# Pairs another test already runs (their results are reused); the rest get a 3-step run of their own.
_RUN_ELSEWHERE = {("ddp", "adamw"): "parity:ddp", ("fsdp", "adamw"): "parity:fsdp", ("zero1", "adamw"): "parity:zero1",
                  ("zero2", "adamw"): "parity:zero2", ("zero3", "adamw"): "parity:zero3",
                  ("ddp_powersgd", "adamw"): "bf16:ddp_powersgd", ("fsdp_offload", "adamw"): "bf16:fsdp_offload",
                  ("zero2_offload", "adamw"): "bf16:zero2_offload", ("zero3_offload", "adamw"): "bf16:zero3_offload",
                  ("ddp", "adamw_8bit"): "8bit:ddp", ("zero2", "adamw_8bit"): "8bit:zero2", ("fsdp", "adamw_8bit"): "8bit:fsdp",
                  ("ddp", "adafactor"): "sweep:ddp-adafactor-np2-mbs4-gas1",  # test_sweep.py's (3 steps, MBS 4)
                  ("zero1", "adafactor"): "tune:zero1-adafactor-np2-mbs4-gas1",  # a trial of test_tune.py's (5 steps)
                  ("ddp_powersgd", "adafactor"): "phi3:ddp_powersgd-adafactor",  # test_llama.py's, on tiny-phi3
                  ("zero1", "adamw_8bit"): "smollm3:zero1-adamw_8bit"}  # ... and on tiny-smollm3
# runs whose own checks do not depend on the optimizer, made with the optimizer of a pair (conftest)
_RUN_ELSEWHERE.update({(s, o): f"partitions:{s}" for s, o in PARTITION_OPTIM.items() if (s, o) not in _RUN_ELSEWHERE})
_RUN_ELSEWHERE.update({(s, o): f"host:{name}" for name, (s, o, _) in HOST_RUNS.items()
                       if (s, o) not in _RUN_ELSEWHERE and s != "tp"})  # tp's pair is its float8 run (pair_result)
PAIRS = [(s, o) for s in all_strategies() for o in OPTIMIZERS]


def pair_result(strategy: str, optim: str) -> dict:
    if all_strategies()[strategy].hybrid:  # HSDP needs 2+ nodes: 2 x 2 simulated-SLURM jobs (conftest)
        return hsdp_8bit_job() if optim == "adamw_8bit" else hsdp_job()
    if strategy == "tp":  # the only optimizer tp runs (the others are refused): the tensor-parallel suite's (float8)
        return tp_fp8_run()
    if strategy == "fsdp_tp":  # 2 nodes x 2 processes, as the tensor-parallel suite's job
        return fsdp_tp_job() if optim == "adamw" else fsdp_tp_job("--optim", optim, *pair_model(strategy, optim),
                                                                  "--save_steps", "2", steps=3,
                                                                  key=f"fsdp_tp-2x2-{optim}")
    where = _RUN_ELSEWHERE.get((strategy, optim), "")
    kind, _, key = where.partition(":")
    if key:  # a run another test makes, by the conftest function that makes it
        return {"parity": parity_run, "bf16": bf16_result, "8bit": eight_bit_run, "sweep": swept_run, "tune": tune_trial,
                "partitions": partition_run, "host": host_memory_run,
                "phi3": lambda pair: llama_pair_run(*pair.split("-"), model="tiny-phi3"),
                "smollm3": lambda pair: llama_pair_run(*pair.split("-"), model="tiny-smollm3")}[kind](key)
    extra = ["--powersgd_warmup_steps", "2"] if strategy == "ddp_powersgd" else []
    if (strategy, optim) in BLOOM_PAIRS:
        extra += ["--model", "tiny-bloom", "--bf16"]
    return result(f"pair-{strategy}-{optim}", strategy, "--optim", optim, *extra, steps=3)


@pytest.mark.parametrize("strategy,optim", PAIRS)
def test_every_pair_runs_or_is_refused_before_launch(tmp_path, strategy, optim, hfscale_cli):
    if (strategy, optim) in INCOMPATIBLE:
        out = tmp_path / "out"
        proc = hfscale_cli(["train", "--strategy", strategy, "--optim", optim, *TINY, "--max_steps", "1", "--output_dir", out])
        assert proc.returncode == 2 and f"strategy {strategy!r} cannot use optimizer {optim!r}" in proc.stderr
        assert not out.exists()
        return
    res = pair_result(strategy, optim)
    s = all_strategies()[strategy]
    world = 4 if s.hybrid or (s.tensor_parallel and s.engine == "fsdp") else 2  # HSDP, fsdp_tp: 2 nodes x 2
    assert res["strategy"] == strategy and res["optim"] == optim and res["config"]["world_size"] == world
    check = res["strategy_check"]
    data_parallel = world // (2 if s.tensor_parallel else 1)  # the ranks of a TP group share their batches
    assert check["world_size_torch"] == world and len(set(map(tuple, check["first_batch_per_rank"]))) == data_parallel
    if optim == "adamw_8bit":
        assert "uint8" in check["optimizer_states"]["dtypes"]
    if s.tensor_parallel and s.engine == "fsdp" and optim == "adamw_8bit":  # its checkpoint gathers 8-bit states
        import torch

        saved = torch.load(Path(res["output_dir"]) / "checkpoint-2" / "optimizer_tp.pt", weights_only=True)
        assert saved["quantized"] and all(signed == (key == "exp_avg") for keys in saved["quantized"].values()
                                          for key, signed in keys.items())


# BLOOM too (its own tensors, and bitsandbytes' 32-bit embedding states), in bf16, under each engine: the matrix's runs
# of two pairs no other test runs are BLOOM's (DDP with bitsandbytes, FSDP2 with torchao), and ZeRO-3 gets a 3-step
# BLOOM run of its own (every DeepSpeed pair's run is another test's, on GPT-2).
BLOOM_PAIRS = [("ddp_powersgd", "adamw_8bit"), ("fsdp_offload", "adamw_8bit")]
BLOOM_RUNS = [("zero3", "adafactor")]
# ... and Llama (grouped-query attention split by TP, an untied head): torchao's 8-bit AdamW on HSDP's 2-D mesh (the
# matrix's run of fsdp_hybrid with it; tests/test_llama.py runs the other engines on Llama)
LLAMA_PAIRS = [("fsdp_hybrid", "adamw_8bit")]
# ... and Qwen2, Llama's tensors with biases on q/k/v: bitsandbytes' 8-bit Adam under ZeRO-2 keeps such small
# tensors' states in 32 bits, counted by the memory model (tests/test_tensor_parallel.py splits its biases over TP)
QWEN2_PAIRS = [("zero2", "adamw_8bit")]
# ... and Qwen3, with its per-head q/k norms and queries wider than the model: fsdp_tp keeps those norms whole over TP
# (their gradients summed over the TP group) and shards them over FSDP, the projections at the query width split over
# TP and again over FSDP (the run refuses a layout other than the plan's), with torchao's 8-bit AdamW
QWEN3_PAIRS = [("fsdp_tp", "adamw_8bit")]
# ... and SmolLM3, Llama's tensors with a tied head and a NoPE layer in four: ZeRO-1 with bitsandbytes' 8-bit Adam,
# whose 32-bit states of the tied embedding the memory model counts (test_llama.py's run)
SMOLLM3_PAIRS = [("zero1", "adamw_8bit")]
# ... and Phi-3, its q/k/v and gate/up projections fused: PowerSGD with Adafactor, whose factored states of those
# matrices the memory model counts (test_llama.py's run)
PHI3_PAIRS = [("ddp_powersgd", "adafactor")]
# the host-memory runs (conftest.HOST_RUNS) build a Llama too
FAMILY = {**{p: "bloom" for p in BLOOM_PAIRS}, **{p: "llama" for p in LLAMA_PAIRS},
          **{p: "qwen2" for p in QWEN2_PAIRS}, **{p: "qwen3" for p in QWEN3_PAIRS},
          **{p: "smollm3" for p in SMOLLM3_PAIRS}, **{p: "phi3" for p in PHI3_PAIRS},
          **{(s, o): "llama" for name, (s, o, _) in HOST_RUNS.items() if _RUN_ELSEWHERE.get((s, o)) == f"host:{name}"}}


def pair_model(strategy: str, optim: str) -> list[str]:
    """The --model of a pair's own run: tiny-llama, tiny-qwen2 or tiny-qwen3 where the pair runs that family, else the
    default."""
    family = FAMILY[strategy, optim] if (strategy, optim) in LLAMA_PAIRS + QWEN2_PAIRS + QWEN3_PAIRS else None
    return ["--model", f"tiny-{family}"] if family else []


@pytest.mark.parametrize("strategy,optim,family", [(*p, FAMILY.get(p, "gpt2")) for p in PAIRS
                                                   if p not in INCOMPATIBLE] + [(*p, "bloom") for p in BLOOM_RUNS])
def test_memory_estimate_equals_what_the_engine_holds(strategy, optim, family):
    """Per rank: bytes of parameters, gradients (right before the first optimizer step), fp32 masters and optimizer
    states, counted by storage on the live engine, against hfscale.formulas.memory: equal within 2%. The estimate
    is for the rank that holds the most, so it is compared with the largest rank."""
    if family == "bloom" and (strategy, optim) in BLOOM_RUNS:
        res = result(f"bloom-{strategy}-{optim}", strategy, "--optim", optim, "--model", "tiny-bloom",
                     "--bf16", steps=3)
    else:
        res = pair_result(strategy, optim)
    assert res["model"]["family"] == family
    if family == "bloom":
        model = res["model"]  # the BigScience size formula has no position table for ALiBi BLOOM; its 2h LayerNorm
        assert model["params_bigscience"] == model["params_model"] - 2 * model["hidden"]  # counts one of BLOOM's two
    estimate, ranks = res["estimate"], res["memory"]["model_states_per_rank"]
    accumulating = res["memory"]["gradients_accumulating_per_rank"]  # between micro-batches (GAS > 1), else None
    assert len(ranks) == res["config"]["world_size"]
    for component in ("parameters", "gradients", "master_weights", "optimizer_states"):
        if (strategy, component) == ("zero1", "gradients"):  # estimated as the backward's full gradients; by the step
            continue  # DeepSpeed has reduced them to a partition: compared in test_gradient_partitions.py instead
        device, host = estimate[component], estimate["host"].get(component, 0)
        measured = max(r[component] for r in ranks)
        if component == "gradients" and strategy == "fsdp_offload" and accumulating[0] is not None:
            # FSDP2 offload under no_sync: whole gradients on the device while accumulating, shards on the host once
            # the last micro-batch has reduce-scattered them - two peaks at two moments, each estimated where it is
            assert device == pytest.approx(max(accumulating), rel=0.02, abs=64), (device, accumulating)
            assert host == pytest.approx(measured, rel=0.02, abs=64), (host, ranks)
            continue
        assert device + host == pytest.approx(measured, rel=0.02, abs=64), (component, device, host, ranks)  # wherever
        if component == "gradients" and accumulating[0] is not None:  # it lives; held between micro-batches too
            assert device + host == pytest.approx(max(accumulating), rel=0.02, abs=64), (device, host, accumulating)

