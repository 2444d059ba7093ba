"""The Llama family through the strategies, with the checks GPT-2 gets: ZeRO-3 and FSDP2 (offloaded) train tiny-llama (grouped-query
attention, an untied head) as ddp does; tp splits its key/value heads and trains as ddp too; every run proves what it
shards, its figures count its loaders' tokens, the memory model equals what its engine holds, and a tp checkpoint
exports to a plain transformers Llama. Then the planners on the published Llama shapes."""

import json
import os
import sys

import pytest

from conftest import (LLAMA_STRATEGIES, PARITY_STEPS, assert_figures_count_the_loaders, assert_trains_as, llama_parity,
                      llama_tp_run, run)
from hfscale.formulas.tensors import tp_local_tensors
from hfscale.models import PRESETS

pytestmark = pytest.mark.multiprocess


def _holds_what_the_memory_model_says(res) -> None:
    """Parameters, gradients, fp32 masters and optimizer states counted on the live engine: the estimate's, within 2%
    (the rank that holds the most)."""
    estimate, ranks = res["estimate"], res["memory"]["model_states_per_rank"]
    for component in ("parameters", "gradients", "master_weights", "optimizer_states"):
        if (res["strategy"], component) == ("zero1", "gradients"):  # the backward's full gradients, by the step a
            continue  # partition: test_gradient_partitions.py compares the two moments
        measured = max(r[component] for r in ranks)
        held = estimate[component] + estimate["host"].get(component, 0)
        assert held == pytest.approx(measured, rel=0.02, abs=64), (res["strategy"], component, held, ranks)


@pytest.mark.parametrize("strategy", LLAMA_STRATEGIES)
def test_llama_trains_under_zero3_and_fsdp_offload_as_ddp_does(strategy):
    parity = llama_parity()
    verdict = {row["strategy"]: row for row in parity["report"]["comparisons"]}[strategy]
    assert verdict["verdict"] == "pass", verdict
    runs = parity["runs"]
    res, ref = runs[strategy], runs["ddp"]
    assert res["model"]["family"] == "llama" and res["model"]["n_kv_head"] == 2 and res["model"]["tied"] is False
    assert_trains_as(res, ref, PARITY_STEPS)
    for one in (res, ref):
        assert one["model"]["params_formula"] == one["model"]["params_model"] == 354_624
        assert_figures_count_the_loaders(one)
        _holds_what_the_memory_model_says(one)
    check = res["strategy_check"]
    assert check["world_size_torch"] == 2 and len(set(map(tuple, check["first_batch_per_rank"]))) == 2
    parameters = check["parameters"]
    assert 0.45 <= parameters["elements_local"] / parameters["elements_total"] <= 0.55  # each rank holds half of it
    if strategy == "fsdp_offload":  # every FSDP2 unit built with the host offload policy, the states on the host
        assert check["fsdp_offload_policy"] == ["CPUOffloadPolicy"] and check["optimizer_states"]["devices"] == ["cpu"]


def test_llama_tp_splits_the_key_value_heads_and_trains_as_ddp():
    """tp on one node of 2: every parameter the DTensor its family's plan says (q, k, v and gate/up by output rows -
    2 query heads and 1 key/value head a rank -, o and down by input, the embedding and the untied head by vocabulary
    rows), the model's 1/TP slices on each rank, and the same model as ddp's over 20 steps."""
    res, ref = llama_tp_run(), llama_parity()["runs"]["ddp"]
    assert res["strategy"] == "tp" and res["model"]["family"] == "llama"
    tp = res["strategy_check"]["tensor_parallel"]
    assert tp["tp"] == 2 and tp["mismatches"] == [] and tp["checked"] == len(list(res["final_weights"]))
    assert tp["elements_tp_slices"] == sum(t.numel for t in tp_local_tensors(PRESETS["tiny-llama"], 2))
    assert_trains_as(res, ref, PARITY_STEPS)
    assert_figures_count_the_loaders(res)
    assert res["config"]["dp"] == 1 and "  DP 1 · TP 2 · MBS 8" in res["_stdout"]
    _holds_what_the_memory_model_says(res)


def test_a_llama_checkpoint_exports_to_a_plain_transformers_llama(tmp_path):
    """The tp run's final checkpoint (whole HF weights) through `hfscale export`: a LlamaForCausalLM that transformers
    loads alone, its untied head its own, computing the trained model's logits."""
    import torch
    from transformers import AutoModelForCausalLM

    from hfscale.parallel.fingerprint import probe_ids
    from hfscale.run.export import export

    res = llama_tp_run()
    exported = tmp_path / "exported"
    export(res["output_dir"], exported, "fp32")
    config = json.loads((exported / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_key_value_heads"] == 2
    model = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():  # the run's probe: the first 4 positions x 8 vocabulary entries, fp32 like its training
        logits = model(input_ids=probe_ids(model.config.vocab_size)).logits[0, :4, :8].flatten()
    assert torch.allclose(logits, torch.tensor(res["probe_logits"]), rtol=0, atol=1e-5)


# ---- the memory a Llama step holds on this CPU, against the calibrated activation model ----------------------------

# A Llama shape none of the calibration shapes has (benchmarks/calibrate_activations.py HEAD_WIDTH_SHAPES): 3 layers,
# 6 heads sharing 2 key/value heads, an MLP 2.5 x hidden
LLAMA_HELD_OUT = ["--model", "tiny-llama", "--n_layer", "3", "--hidden_size", "384", "--n_head", "6",
                  "--num_key_value_heads", "2", "--ffn_hidden_size", "960", "--vocab_size", "6144",
                  "--default_tokenizer_vocab", "6144", "--seq_len", "224", "--per_device_train_batch_size", "6"]


# ... with heads of a width of their own (calibrate_activations.py HEAD_WIDTH_SHAPES): 32-wide heads on a 384-wide
# model, so the queries are 192 wide, half the model's width (no calibration shape's are under three quarters of it) -
# a Qwen3 (tiny-qwen3's 32), a Gemma 3 (tiny-gemma3's) and a Llama as Mistral-Nemo sets them (--head_dim)
QWEN3_HELD_OUT = ["--model", "tiny-qwen3", *LLAMA_HELD_OUT[2:]]
GEMMA3_HELD_OUT = ["--model", "tiny-gemma3", *LLAMA_HELD_OUT[2:]]
HEAD_WIDTH_HELD_OUT = [*LLAMA_HELD_OUT, "--head_dim", "32"]
# ... and an OLMo 2 of the Llama's shape (calibrate_activations.py LLAMA_SHAPES: its heads are hidden / heads wide)
OLMO2_HELD_OUT = ["--model", "tiny-olmo2", *LLAMA_HELD_OUT[2:]]


@pytest.mark.parametrize("model,attention,checkpointing", [("llama", "sdpa", True), ("llama-heads", "sdpa", False),
                                                           ("qwen3", "sdpa", False), ("gemma3", "sdpa", False),
                                                           ("olmo2", "sdpa", False)])
def test_the_activation_estimate_matches_the_measured_step(tmp_path, model, attention, checkpointing):
    """The step's peak (one process on this CPU) within 10% of the estimate, on shapes the calibration never saw: a
    checkpointed Llama, and - uncheckpointed, where the most is kept - a Llama, a Qwen3 and a Gemma 3 whose queries are
    half the model's width, and an OLMo 2."""
    out = tmp_path / "run"
    held_out = {"llama": LLAMA_HELD_OUT, "llama-heads": HEAD_WIDTH_HELD_OUT, "qwen3": QWEN3_HELD_OUT,
                "gemma3": GEMMA3_HELD_OUT, "olmo2": OLMO2_HELD_OUT}[model]
    cmd = [sys.executable, "-m", "hfscale", "train", *held_out, "--max_steps", "4", "--logging_steps", "1",
           "--save_strategy", "no", "--attn_implementation", attention, "--output_dir", str(out),
           *(["--activation_checkpointing"] if checkpointing else [])]
    proc = run(cmd, timeout=600, environ={**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    measured = results["memory"]["step_per_rank"][0]["step_delta_gb"] * 1e9
    assert measured > 50e6 and results["estimate"]["activation_calibration"] == "cpu"
    assert results["estimate"]["step_peak"] == pytest.approx(measured, rel=0.10), (results["estimate"], measured)


# ---- the planners on the published shapes --------------------------------------------------------------------------

def test_estimate_and_project_plan_a_llama(tmp_path):
    """`hfscale estimate` of llama-3.1-8b on 8 H100s and of a Llama config.json alone (the preset's own numbers), and
    `hfscale project` from a Llama run's results: the untied head and grouped-query attention in every figure."""
    def estimate(*argv):
        proc = run([sys.executable, "-m", "hfscale", "estimate", *argv, "--strategy", "zero3", "--optim", "adamw",
                    "--gpus", "8", "--gpus_per_node", "8", "--device", "H100-80GB", "--bf16", "--seq_len", "4096",
                    "--per_device_train_batch_size", "1", "--activation_checkpointing", "--json"])
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout)

    preset = estimate("--model", "llama-3.1-8b")
    row = preset["rows"][0]["memory"]
    # ZeRO-3 in bf16 on 8: 2 + 2 bytes of weights and gradients, 4 of fp32 master, 8 of Adam, 8.03B / 8 each
    assert row["model_states"] == pytest.approx(16 * 8_030_261_248 / 8, rel=0.01)
    from hfscale.models import hf_config

    folder = tmp_path / "llama-3.1-8b"
    hf_config(PRESETS["llama-3.1-8b"]).save_pretrained(folder)
    assert estimate("--model_name_or_path", str(folder))["rows"] == preset["rows"]
    results = llama_parity()["runs"]["zero3"]
    proc = run([sys.executable, "-m", "hfscale", "project", f"{results['output_dir']}/results.json", "--strategy",
                "all", "--gpus", "2,4,8", "--json"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    points = json.loads(proc.stdout)["points"]
    assert {p["gpus"] for p in points} == {2, 4, 8} and all(p["tokens_per_s"] > 0 for p in points)


def test_a_killed_llama_run_resumes_exactly(tmp_path):
    """The tp run SIGKILLed (launcher and ranks) after step TP_SAVE_STEP + 1 and resumed with `latest` from its
    step-TP_SAVE_STEP checkpoint (whole weights and AdamW states, each rank taking its slices of the split q/k/v, the
    untied head and the vocabulary-parallel embedding again) continues with exactly the uninterrupted run's losses."""
    from conftest import TP_SAVE_STEP, llama_tp_command, run_and_kill

    full, faulty = llama_tp_run(), tmp_path / "faulty"
    run_and_kill(*llama_tp_command(faulty), TP_SAVE_STEP + 1)
    killed = json.loads((faulty / "results.json").read_text())
    assert killed["status"] == "running" and not (faulty / f"checkpoint-{PARITY_STEPS}").exists()
    cmd, cwd = llama_tp_command(faulty)
    proc = run([*cmd, "--resume_from_checkpoint", "latest"], cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    resumed = json.loads((faulty / "results.json").read_text())
    assert resumed["status"] == "ok" and resumed["resumed_from"] == str(faulty / f"checkpoint-{TP_SAVE_STEP}")
    assert [p["loss"] for p in resumed["loss_history"]] == [p["loss"] for p in full["loss_history"]]


# Beside ddp, zero3, fsdp_offload and tp above: the other engines' routes and the other optimizers' state layouts on
# Llama (bitsandbytes' 8-bit blocks with the embedding's 32-bit states, Adafactor's factored states of the gated MLP,
# DeepSpeed's CPU Adam over ZeRO-3's partitions, PowerSGD's compressed buckets), 3 steps each - ZeRO-1's on SmolLM3
# (Llama's tensors, its head tied, a NoPE layer in four, built as SmolLM3ForCausalLM), ZeRO-3 offload's on OLMo 2
# (its q/k norms as wide as the queries and keys, partitioned with them), PowerSGD's on Phi-3 (its fused q/k/v and
# gate/up matrices compressed and factored whole); test_multiprocess.py's matrix runs zero2, fsdp_tp and fsdp_hybrid
# on Llama-shaped models
LLAMA_PAIRS = [("zero1", "adamw_8bit", "tiny-smollm3"), ("zero3_offload", "adamw", "tiny-olmo2"),
               ("ddp_powersgd", "adafactor", "tiny-phi3")]


@pytest.mark.parametrize("strategy,optim,model", LLAMA_PAIRS)
def test_llama_trains_under_more_strategies_and_optimizers(strategy, optim, model):
    from conftest import llama_pair_run

    res = llama_pair_run(strategy, optim, model)
    assert (res["strategy"], res["optim"], res["model"]["family"]) == (strategy, optim, PRESETS[model].family)
    check = res["strategy_check"]
    assert check["world_size_torch"] == 2 and len(set(map(tuple, check["first_batch_per_rank"]))) == 2
    assert "uint8" in check["optimizer_states"]["dtypes"] if optim == "adamw_8bit" else True
    assert check["optimizer_states"]["factored"] if optim == "adafactor" else True
    if strategy == "zero3_offload":
        assert check["offload_optimizer"] and check["offload_param"] and check["optimizer_states"]["devices"] == ["cpu"]
    if strategy == "ddp_powersgd":
        assert check["powersgd"]["compressed_buckets"] > 0
    assert [p["loss"] for p in res["loss_history"]][-1] < [p["loss"] for p in res["loss_history"]][0]
    assert_figures_count_the_loaders(res)
    _holds_what_the_memory_model_says(res)
