"""Formulas against independent sources: the model's own parameters, torch's FLOP counter, the BigScience notes."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from hfscale.formulas import metrics
from hfscale.formulas.metrics import ModelShape
from hfscale.models import PRESETS, hf_config, model_class


def _model(shape, attn="eager", device=None):
    config = hf_config(shape)
    config._attn_implementation = attn
    with torch.device(device or "cpu"):
        return model_class(shape.family)(config)


@pytest.mark.parametrize("name", list(PRESETS))
def test_param_formula_equals_model_numel(name):
    """Every preset's exact count is the transformers model's, built from the same config on the meta device; and the
    family's tensors are the model's, in its parameters' order."""
    from hfscale.formulas.tensors import parameter_tensors

    shape = PRESETS[name]
    model = _model(shape, device="meta")
    assert metrics.param_count(shape) == sum(p.numel() for p in model.parameters())
    assert [(t.name, t.shape) for t in parameter_tensors(shape)] == [
        (n, tuple(p.shape)) for n, p in model.named_parameters()]


@pytest.mark.parametrize("name,published", [("llama-3.1-8b", 8_030_261_248), ("llama-3.2-1b", 1_235_814_400),
                                            ("smollm2-135m", 134_515_008), ("tinyllama-1.1b", 1_100_048_384),
                                            ("mistral-7b", 7_248_023_552),
                                            # their checkpoints' totals: 32 heads of 128 on a 5120-wide model
                                            ("mistral-nemo-12b", 12_247_782_400),
                                            ("mistral-small-24b", 23_572_403_200),
                                            ("gemma3-1b", 999_885_952),
                                            # OLMo 2's cards: 1.48B, 7.30B, 13.7B, 32.2B (to the parameter: its
                                            # q/k norms as wide as the queries and keys, no pre-norms)
                                            ("olmo2-1b", 1_484_916_736), ("olmo2-7b", 7_298_617_344),
                                            ("olmo2-13b", 13_716_198_400), ("olmo2-32b", 32_234_279_936),
                                            # Phi-3-mini's and Phi-4's cards: 3.8B and 14.7B (their fused projections
                                            # hold Llama's matrices)
                                            ("phi-3-mini", 3_821_079_552), ("phi-4", 14_659_507_200)])
def test_llama_presets_have_the_published_sizes(name, published):
    assert metrics.param_count(PRESETS[name]) == published


# The Qwen2.5 and Qwen3 model cards' "Number of Parameters" and "(Non-Embedding)", in billions as printed: rounded to 2-3
# figures, some from the tokenizer's 151,646 tokens rather than the embedding's padded rows - so within 1% (2% for the
# 2-figure ones), which a wrong layer count, width or head would pass by far
QWEN_CARDS = {"qwen2.5-0.5b": (0.49, 0.36), "qwen2.5-1.5b": (1.54, 1.31), "qwen2.5-3b": (3.09, 2.77),
              "qwen2.5-7b": (7.61, 6.53), "qwen2.5-14b": (14.7, 13.1), "qwen2.5-32b": (32.5, 31.0),
              "qwen2.5-72b": (72.7, 70.0),
              # Qwen3's: every model 128 wide a head, whatever its hidden size
              "qwen3-0.6b": (0.6, 0.44), "qwen3-1.7b": (1.7, 1.4), "qwen3-4b": (4.0, 3.6), "qwen3-8b": (8.2, 6.95),
              "qwen3-14b": (14.8, 13.2), "qwen3-32b": (32.8, 31.2)}


@pytest.mark.parametrize("name", QWEN_CARDS)
def test_qwen_presets_have_the_published_sizes(name):
    """The presets' shapes are the published models': the cards' totals and non-embedding parameters (every tensor
    but the embedding and an untied head). Exact counts, biases included, are test_param_formula_equals_model_numel's."""
    from hfscale.formulas.tensors import parameter_tensors
    from hfscale.models.family import UNTIED_HEAD

    shape = PRESETS[name]
    total, non_embedding = QWEN_CARDS[name]
    embedding = sum(t.numel for t in parameter_tensors(shape) if t.name in (shape.spec.embedding, UNTIED_HEAD))
    tolerance = 0.01 if len(str(total).replace(".", "").strip("0")) > 2 else 0.02  # "4.0" prints 2 figures
    assert metrics.param_count(shape) / 1e9 == pytest.approx(total, rel=tolerance)
    assert (metrics.param_count(shape) - embedding) / 1e9 == pytest.approx(non_embedding, rel=tolerance)


@pytest.mark.parametrize("params,label", [(124_439_808, "124M"), (354_823_168, "355M"), (999_885_952, "1B"),
                                          (999_400_000, "999M"), (1_315_575_808, "1.32B"), (176_247_271_424, "176B")])
def test_size_labels_read_as_people_write_them(params, label):
    assert metrics.size_label(params) == label


def test_smollm3_preset_has_the_published_size():
    """SmolLM3-3B's card prints 3.08B parameters (its checkpoint's total, rounded); the exact count is the meta-device
    model's (test_param_formula_equals_model_numel)."""
    assert metrics.param_count(PRESETS["smollm3-3b"]) / 1e9 == pytest.approx(3.08, rel=0.005)


def test_bigscience_size_formula_matches_gpt2_with_4h_ffn():
    shape = PRESETS["gpt2-350m"]
    assert metrics.param_count_bigscience(24, 1024, 1024, 50257) == metrics.param_count(shape)


SHAPES = [
    ModelShape("gpt2", 2, 64, 4, 512, 256),  # short
    ModelShape("gpt2", 2, 64, 4, 512, 512),
    ModelShape("gpt2", 3, 96, 6, 1000, 256, ffn=1000),  # lopsided FFN
    ModelShape("bloom", 2, 64, 4, 512, 256),
    ModelShape("llama", 2, 64, 4, 512, 256, ffn=176, n_kv_head=2),  # grouped-query attention, a gated MLP, untied
    ModelShape("llama", 3, 96, 6, 1000, 512, ffn=320, n_kv_head=6, tied=True),
    ModelShape("qwen2", 2, 64, 4, 512, 256, ffn=176, n_kv_head=2),  # Llama's with q/k/v biases: no matmul FLOPs more
    ModelShape("qwen3", 2, 64, 4, 512, 256, ffn=176, n_kv_head=2, head_dim=32),  # queries 128 wide on a 64-wide model
    ModelShape("llama", 2, 64, 4, 512, 256, ffn=176, n_kv_head=2, head_dim=32),  # Mistral-Nemo's way, no q/k norms
    ModelShape("smollm3", 4, 64, 4, 512, 256, ffn=176, n_kv_head=2),  # its 4th layer NoPE: no FLOPs fewer
    ModelShape("gemma3", 6, 64, 4, 512, 256, ffn=176, n_kv_head=2, head_dim=32),  # 5 windowed layers, 1 global
    ModelShape("olmo2", 2, 64, 4, 512, 256, ffn=176, n_kv_head=2),  # norms after each sublayer, on q/k whole
    ModelShape("olmo3", 4, 64, 4, 512, 256, ffn=176, n_kv_head=2),  # 3 windowed layers, 1 global
    ModelShape("phi3", 2, 64, 4, 512, 256, ffn=176, n_kv_head=2),  # q/k/v and gate/up fused: Llama's matmuls
    ModelShape("phi3", 2, 64, 4, 512, 256, ffn=176, n_kv_head=2, sliding_window=32),  # a window: no FLOP fewer
]


@pytest.mark.parametrize("shape,seq", [(SHAPES[0], 32), (SHAPES[1], 512), (SHAPES[2], 128), (SHAPES[3], 32),
                                       (SHAPES[3], 256), (SHAPES[4], 64), (SHAPES[4], 256), (SHAPES[5], 128),
                                       (SHAPES[6], 128), (SHAPES[7], 64), (SHAPES[7], 256), (SHAPES[8], 128),
                                       (SHAPES[9], 128), (SHAPES[10], 128), (SHAPES[11], 128),
                                       (SHAPES[12], 128)])
def test_exact_flops_match_torch_flop_counter(shape, seq):
    model = _model(shape)
    ids = torch.randint(0, shape.vocab, (2, seq))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    model_flops, _ = metrics.training_flops_per_sequence(shape, seq, recompute=False)
    assert counter.get_total_flops() == pytest.approx(2 * model_flops, rel=0.01)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant (default)", "reentrant"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s.family}-h{s.hidden}-f{s.ffn_size}-d{s.head_size}")
def test_hardware_flops_with_checkpointing_match_torch_flop_counter(shape, reentrant):
    """HFU's numerator, checked against what torch counts when activation checkpointing really recomputes: a
    forward + backward with transformers' gradient checkpointing on, as the Trainer enables it (its default is
    torch's non-reentrant checkpoint, whose early stop never recomputes the MLP's output projection)."""
    seq = 64
    model = _model(shape)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.train()
    ids = torch.randint(0, shape.vocab, (2, seq))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    model_flops, hardware_flops = metrics.training_flops_per_sequence(shape, seq, recompute=True,
                                                                      full_recompute=reentrant)
    assert counter.get_total_flops() == pytest.approx(2 * hardware_flops, rel=0.01)
    assert hardware_flops > 1.1 * model_flops  # the recomputation is really there, and counted


def test_bigscience_worked_example():
    # ../shared/PRODUCT.md: 64 GPUs, 52B params, seq 1024, GBS 1024, 125 s/iteration, checkpointing -> 54.5 TFLOPs
    tflops = metrics.bigscience_tflops_per_gpu(52e9, 1024, 1024, 125, 64, checkpointing=True)
    assert round(tflops, 1) == 54.5
    assert metrics.bigscience_tflops_per_gpu(52e9, 1024, 1024, 125, 64, checkpointing=False) == pytest.approx(tflops * 3 / 4)


def test_days_from_throughput_reproduce_the_megatron_papers_gpt3_estimate():
    """Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", sec.
    5.1): GPT-3 175B (96 layers, hidden 12288, seq 2048, vocabulary 51200) at 140 TFLOPs per GPU on 1024 A100s trains
    300B tokens in "about 34 days", counting FLOPs with full activation recomputation (their eq. 3: 96·B·s·l·h²·(1 +
    s/6h + V/16lh) per iteration). hfscale's hardware FLOPs with the reentrant (full) recompute, its tokens/s and its
    days must give the same."""
    shape = ModelShape("gpt2", 96, 12288, 96, 51200, 2048)
    _, hardware = metrics.training_flops_per_sequence(shape, 2048, recompute=True, full_recompute=True)
    per_token = 96 * 96 * 12288**2 * (1 + 2048 / (6 * 12288) + 51200 / (16 * 96 * 12288))  # their eq. 3, B·s = 1
    assert hardware / 2048 == pytest.approx(per_token, rel=1e-3)
    tokens_per_s = 1024 * 140e12 / (hardware / 2048)
    days, gpu_days = metrics.days_to_train(300e9, tokens_per_s, 1024)
    assert days == pytest.approx(34, rel=0.03) and gpu_days == pytest.approx(34 * 1024, rel=0.03)
    # the same through one step's figures (2048 sequences per step here): 140 TFLOPs of hardware FLOPs, 34 days
    fig = metrics.step_figures(shape, s_per_iter=2048 * hardware / (1024 * 140e12), per_device_train_batch_size=2,
                               gradient_accumulation_steps=1, data_parallel_size=1024, gpus=1024, seq_len=2048,
                               activation_checkpointing=True, token_budget=300e9, peak_tflops=312.0,
                               full_recompute=True)
    assert fig.tflops_per_gpu_hardware == pytest.approx(140) and fig.days_to_budget == pytest.approx(days)


def test_step_figures_are_consistent():
    shape = PRESETS["gpt2-124m"]
    fig = metrics.step_figures(shape, s_per_iter=2.0, per_device_train_batch_size=4, gradient_accumulation_steps=8,
                               data_parallel_size=8, gpus=8, seq_len=1024, activation_checkpointing=True,
                               token_budget=1e11, peak_tflops=312.0)
    assert fig.tokens_per_s == 4 * 8 * 8 * 1024 / 2.0
    assert fig.tokens_per_s_per_gpu * 8 == pytest.approx(fig.tokens_per_s)
    assert fig.mfu == pytest.approx(fig.tflops_per_gpu_model / 312.0)
    assert fig.hfu > fig.mfu
    # With seq << 6h the exact count and the BigScience 8N-per-token (4 x 2N) convention are close.
    assert fig.tflops_per_gpu_hardware == pytest.approx(fig.tflops_per_gpu_bigscience, rel=0.2)


@pytest.mark.parametrize("strategy,world,per_node,dp", [
    ("ddp", 8, 8, 8), ("zero3", 16, 8, 16), ("fsdp_hybrid", 16, 8, 16), ("tp", 8, 8, 1), ("fsdp_tp", 32, 8, 4)])
def test_a_plans_figures_count_its_data_parallel_ranks(strategy, world, per_node, dp):
    """The batch of a step is MBS x GAS x DP: the ranks of a tensor-parallel group share one, so a tp run on one node
    of 8 steps 8x fewer tokens than ddp on the same node. The FLOPs per GPU and the GPU-days divide by every GPU."""
    from hfscale.parallel.optimizers import get_optimizer
    from hfscale.parallel.strategies import get_strategy
    from hfscale.runplan import RunPlan

    plan = RunPlan(get_strategy(strategy), get_optimizer("adamw"), PRESETS["gpt2-350m"], seq_len=1024,
                   per_device_train_batch_size=4, gradient_accumulation_steps=2, world_size=world,
                   processes_per_node=per_node)
    assert plan.data_parallel_size == dp
    fig = plan.step_figures(0.5, token_budget=1e11, peak_tflops=100.0)
    assert fig.tokens_per_s * 0.5 == plan.tokens_per_step == 4 * 2 * dp * 1024
    assert fig.samples_per_s * 0.5 == plan.global_batch_size
    assert fig.tokens_per_s_per_gpu * world == pytest.approx(fig.tokens_per_s)
    model_flops, _ = metrics.training_flops_per_sequence(plan.shape, 1024, recompute=False)
    assert fig.tflops_per_gpu_model == pytest.approx(model_flops * 4 * 2 * dp / (0.5 * world * 1e12))
    assert fig.gpu_days_to_budget == pytest.approx(fig.days_to_budget * world)


def test_peak_table_never_claims_a_cpu_peak():
    from hfscale.formulas.peaks import table_peak

    assert table_peak("NVIDIA A100-SXM4-80GB", "bf16") == 312.0
    assert table_peak("NVIDIA H100 PCIe", "bf16") == 756.0
    assert table_peak("Intel(R) Xeon(R) CPU", "fp32") is None


@pytest.mark.parametrize("name,dtype,peak", [
    ("NVIDIA B200", "bf16", 2250.0), ("NVIDIA H800", "bf16", 989.0), ("NVIDIA H100 80GB HBM3", "bf16", 989.0),
    ("NVIDIA H100 NVL", "bf16", 835.5), ("NVIDIA H100 PCIe", "tf32", 378.0), ("NVIDIA A800-SXM4-80GB", "bf16", 312.0),
    ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "bf16", 312.0 * 3 / 7), ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "bf16", 989.0 / 7),
    ("NVIDIA L4", "bf16", 121.0), ("NVIDIA L40S", "bf16", 362.0), ("AMD Instinct MI300X", "bf16", 1307.0),
    ("Tesla V100-SXM2-16GB", "fp16", 120.0), ("Tesla V100-SXM2-32GB", "fp16", 125.0),
    ("NVIDIA RTX A1000", "bf16", None), ("NVIDIA GeForce RTX 4090", "bf16", None), ("NVIDIA RTX 6000 Ada Generation", "bf16", None),
])
def test_peak_table_matches_device_names_exactly(name, dtype, peak):
    from hfscale.formulas.peaks import table_peak

    assert table_peak(name, dtype) == (pytest.approx(peak) if peak else None)


def test_an_unknown_gpu_gets_no_mfu_and_says_why():
    from types import SimpleNamespace

    from hfscale.run.record import peak_tflops
    from hfscale.run.results import EnvironmentRecord

    args = SimpleNamespace(measure_peak=False, peak_tflops=None, local_process_index=0, process_index=0)
    perf = peak_tflops(args, EnvironmentRecord(device_type="cuda", device_name="NVIDIA RTX 6000 Ada Generation"), "bf16")
    assert perf.peak_tflops is None and perf.measured_peak_tflops is None
    assert "unknown device" in perf.peak_source and "--peak_tflops" in perf.peak_source
    perf = peak_tflops(args, EnvironmentRecord(device_type="cuda", device_name="NVIDIA H100 NVL"), "bf16")
    assert perf.peak_tflops == 835.5 and perf.peak_source.startswith("datasheet")


def test_only_the_main_process_measures_the_peak(monkeypatch):
    """Its results, console and TensorBoard are the only readers of the peak; another rank's probe is CPU wasted."""
    from types import SimpleNamespace

    from hfscale.run import record
    from hfscale.run.results import EnvironmentRecord

    probes = []
    monkeypatch.setattr(record, "measure_peak_tflops", lambda device, *a, **k: probes.append(device) or 1.5)
    cpu = EnvironmentRecord(device_type="cpu", device_name="CPU (x86_64, 1 threads/process)")
    gpu = EnvironmentRecord(device_type="cuda", device_name="NVIDIA H100 80GB HBM3")
    for rank, measure_peak, env in [(0, False, cpu), (1, False, cpu), (1, True, gpu), (0, True, gpu)]:
        args = SimpleNamespace(measure_peak=measure_peak, peak_tflops=None, local_process_index=rank, process_index=rank)
        perf = record.peak_tflops(args, env, "bf16")
        if rank:
            assert perf.measured_peak_tflops is None and perf.peak_source in ("measured by the main process",
                                                                              "datasheet NVIDIA H100 80GB HBM3 bf16")
    assert probes == ["cpu", "cuda:0"]
    assert perf.peak_tflops == 989.0 and perf.measured_peak_tflops == 1.5  # rank 0, GPU: the datasheet's, and its own


def test_tflops_label_one_decimal_always_and_never_zero_for_a_real_figure():
    from hfscale.formulas.metrics import tflops_label

    assert [tflops_label(x) for x in (40, 40.04, 148.96, 1.0)] == ["40.0", "40.0", "149.0", "1.0"]
    assert tflops_label(0.0352) == "0.035" and tflops_label(None) == ""


def test_peak_refuses_matrices_the_device_cannot_hold():
    """`hfscale peak --size N` holds three N x N matrices: 8192 in bf16 is 0.4 GB on a GPU with 80 free, 100,000 in
    fp32 is 120 GB; the GPU route passes its free memory, the CPU route the host's available."""
    from hfscale.formulas.peaks import matmul_memory_refusal

    assert matmul_memory_refusal(8192, "bf16", 80e9, "the GPU's free") is None
    assert matmul_memory_refusal(8192, "bf16", 3 * 8192 ** 2 * 2, "the GPU's free") is None  # exactly enough
    message = matmul_memory_refusal(100_000, "fp32", 80e9, "the GPU's free")
    assert message == ("--size 100000 needs 120.0 GB for its three fp32 matrices, more than the GPU's free 80.0 GB: "
                       "give a smaller --size")
    assert matmul_memory_refusal(100_000, "bf16", 80e9, "the GPU's free") is None  # 60 GB in two-byte elements


def test_measure_peak_leaves_no_trace_on_a_faked_gpu(monkeypatch):
    """On a GPU the probe flips TF32 for its own GEMMs and allocates two 8k matrices: afterwards the run's TF32 setting
    is what it was and the allocator's peak no longer holds the probe (faked device: CPU tensors, recorded calls)."""
    import torch

    from hfscale.formulas.peaks import measure_peak_tflops

    calls = []
    real_randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *shape, device=None, dtype=None: real_randn(*shape, dtype=dtype))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append(("reset", device)))
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    try:
        matmul.fp32_precision = "ieee"
        assert measure_peak_tflops("cuda:0", "tf32", size=64, seconds=0.01) > 0
        assert matmul.fp32_precision == "ieee"
    finally:
        matmul.fp32_precision = before
    assert calls == ["empty_cache", ("reset", "cuda:0")]


def test_measure_peak_times_at_least_one_round_when_descheduled_past_its_deadline(monkeypatch):
    """On a loaded machine the probe's process can be descheduled longer than its whole budget between setting the
    deadline and the first check: it still times one round (a peak of 0 would be recorded as measured and give no MFU).
    The clock is faked: every reading is 1 s after the previous one."""
    from hfscale.formulas import peaks

    clock = iter(range(1000))
    monkeypatch.setattr(peaks.time, "perf_counter", lambda: float(next(clock)))
    assert peaks.measure_peak_tflops("cpu", "fp32", size=64, seconds=0.2) == pytest.approx(4 * 2 * 64**3 / 1e12)


def test_the_whole_run_figures_are_the_steady_state_after_the_first_logging_interval(monkeypatch):
    """A one-off cost after the warm-up (one H200 paid 0.2-0.4 s in steps 3-5 of every run, benchmarks/results/
    h200_2026-11-25/) stays in the first logging interval and out of the whole-run figures; with no log before the
    last step, or --perf_warmup_steps 0, the clock runs from the warm-up's end (or the first step) as before."""
    import time

    from hfscale.models import PRESETS
    from hfscale.parallel.optimizers import get_optimizer
    from hfscale.parallel.strategies import get_strategy
    from hfscale.run.measure import Meter
    from hfscale.runplan import RunPlan

    plan = RunPlan(get_strategy("ddp"), get_optimizer("adamw"), PRESETS["tiny"], 64, world_size=1, device_type="cpu")

    def run(warmup: int, logging_steps: int, steps: int = 20, one_off: float = 0.4, pause_at: int = 12):
        clock = [0.0]
        monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
        meter, intervals = Meter(plan, token_budget=1e9, peak_tflops=None, warmup_steps=warmup), []
        meter.begin(0)
        for step in range(1, steps + 1):
            meter.step_begin()
            clock[0] += 0.1 + (one_off if step == 3 else 0.0) + (1.0 if step <= 2 else 0.0)  # compile, then a one-off
            meter.step_end(step, last=step == steps, pause_follows=step == pause_at)
            if step % logging_steps == 0:
                figures = meter.interval(step)
                intervals.append(figures and figures.s_per_iter)
            if step == pause_at:  # a checkpoint save: excluded from training time
                meter.mark_paused()
                clock[0] += 5.0
        figures, measured = meter.whole_run()
        return figures.s_per_iter, measured, meter.timed_from, intervals

    s_per_iter, measured, start, intervals = run(warmup=2, logging_steps=5)
    assert (s_per_iter, measured, start) == (pytest.approx(0.1), 15, 5)  # from step 5's log: 15 steady steps
    assert intervals == pytest.approx([0.1 + 0.4 / 3, 0.1, 0.1, 0.1])  # the one-off stays in the first interval
    s_per_iter, measured, start, _ = run(warmup=2, logging_steps=1)  # a log at the warm-up's own end
    assert (measured, start) == (18, 2) and s_per_iter == pytest.approx(0.1 + 0.4 / 18)
    s_per_iter, measured, start, _ = run(warmup=2, logging_steps=20)  # the only log is the last step's
    assert (measured, start) == (18, 2) and s_per_iter == pytest.approx(0.1 + 0.4 / 18)
    s_per_iter, measured, start, _ = run(warmup=0, logging_steps=5)  # everything timed, compilation included
    assert (measured, start) == (20, 0) and s_per_iter == pytest.approx(0.1 + 0.4 / 20 + 2.0 / 20)


def test_a_one_step_run_does_not_compare_its_step_with_the_steady_estimate():
    """The first optimizer step creates the gradients and the optimizer states inside it (torch's AdamW: 12 of the 16
    bytes per parameter), so a run of one step measured 2.52 GB above the states where the steady step holds 0.61 (a
    153M model, ddp, CPU). The summary says why it has no figure to compare; from the second step on it compares."""
    from hfscale.run.memory import StepMemory
    from hfscale.run.summary import memory_line
    from hfscale.run.results import Results

    meter = StepMemory(on_cuda=False)
    meter.steps = [(1, 0.6e9, 3.12e9)]  # (step, before, peak): the first step, states created inside it
    results = Results(estimate={"model_states": 2.45e9, "step_peak": 0.61e9})
    results.memory.step_per_rank = [meter.summary(), meter.summary()]
    line = memory_line(results)
    assert "step peak above the states 0.610 / n/a (the run's only step created" in line
    meter.steps.append((2, 2.45e9, 3.0e9))
    results.memory.step_per_rank = [meter.summary()]
    assert "step peak above the states 0.610 / 0.550 GB" in memory_line(results)


def test_a_run_whose_windowed_layers_saw_less_than_its_sequence_says_the_estimate_left_that_out():
    """The summary names what the step-peak estimate leaves out where the model's windowed layers were shorter than the
    sequence under SDPA (formulas/activations.window_caveat); at the window's length it says nothing of it."""
    from hfscale.run.results import Results
    from hfscale.run.summary import format_summary

    gemma = {"name": "gemma3-1b", "params_model": 1e9, "family": "gemma3", "n_layer": 26, "hidden": 1152, "n_head": 4,
             "n_kv_head": 1, "vocab": 262144, "positions": 32768, "ffn": 6912, "tied": True, "head_dim": 256,
             "sliding_window": 512}

    def summary(seq, attention="sdpa"):
        return format_summary(Results.from_dict({
            "status": "ok", "run_name": "r", "model": gemma, "config": {"world_size": 1, "seq_len": seq,
                                                                         "token_budget": 1e11},
            "estimate": {"model_states": 1e9, "step_peak": 1e9, "attention": attention}}))

    assert "its step peak estimate: 22 of the 26 layers attend over a 512-token window" in summary(1024)
    assert "window" not in summary(512) and "window" not in summary(1024, "eager")


def test_the_run_peak_outlives_the_per_step_resets():
    """StepMemory resets the process's peaks at every step (the kernel's high-water mark here, the allocator's peak
    statistics on CUDA); the run's peak in results.json is still the largest of the run, not the last step's. A
    200 MB tensor held through one step and freed: the last step's peak forgets it, the run's does not."""
    from hfscale.formulas.metrics import GB
    from hfscale.run.memory import StepMemory, _proc_status_bytes, memory_now

    steps = StepMemory(on_cuda=False)
    assert steps.available  # Linux, with /proc/self/clear_refs: what CI runs on
    steps.begin()
    held = torch.ones(50_000_000)  # 200 MB, every page touched
    level = _proc_status_bytes("VmRSS") / GB
    steps.end(1)
    del held
    steps.begin()  # the next step: the high-water mark reset to the level after the free
    steps.end(2)
    assert memory_now(False)["peak_rss_gb"] < level - 0.15  # what the run read before: its last step's peak
    assert memory_now(False, steps)["peak_rss_gb"] > level - 0.01  # (ru_maxrss and VmRSS count a few pages apart)


def test_the_build_window_opens_with_the_freed_heap_handed_back():
    """What a rank freed before the build (the first run's tokenizing and packing) but glibc still holds would be
    reused by the build without growing the resident set: the window would show that much less than the model.
    ConstructionMemory.start hands it back first (release_freed_memory)."""
    from hfscale.run.memory import _proc_status_bytes, release_freed_memory

    chunks, pins = [], []
    for _ in range(2000):
        chunks.append(b"\x01" * 40_000)  # written, so resident; below glibc's mmap threshold, so from its heap
        # one as large above each chunk (too large for the holes an earlier test left): the chunks never reach the
        # heap's top or one another, so free() alone returns nothing
        pins.append(b"\x02" * 40_000)
    held = _proc_status_bytes("RssAnon")
    del chunks
    freed = _proc_status_bytes("RssAnon")
    release_freed_memory()
    released = _proc_status_bytes("RssAnon")
    assert held - freed < 20e6, (held, freed)  # 80 MB freed, still resident
    assert freed - released > 50e6, (freed, released)
    del pins


def test_tf32_is_stored_as_fp32_in_one_place():
    """A run's precision names how its matmuls compute; its tensors are fp32 under TF32 and the engines must hold
    that dtype (the start-up proof reads torch's name of it)."""
    from hfscale.formulas.precision import PRECISIONS, storage_dtype, torch_dtype_name

    assert [storage_dtype(p) for p in PRECISIONS] == ["fp32", "fp32", "bf16", "fp16"]
    assert [torch_dtype_name(p) for p in PRECISIONS] == ["float32", "float32", "bfloat16", "float16"]


def test_a_cpu_step_measured_through_glibcs_reused_heap_says_so(monkeypatch):
    """On a CPU the step's figure is the resident set's high-water mark; with glibc keeping freed tensors in its heap a
    step can show more or less than it holds (a tp run: 0.108 GB against an estimate of 0.070, and 0.068 with the
    allocator following the tensors). The summary says which it measured, and how to measure the tensors."""
    from hfscale.run.memory import StepMemory
    from hfscale.run.results import Results
    from hfscale.run.summary import memory_line

    results = Results(estimate={"model_states": 2e6, "step_peak": 7.0e7})
    for env, noted in ((None, True), ("65536", False)):
        if env is None:
            monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
        else:
            monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", env)
        meter = StepMemory(on_cuda=False)
        meter.steps = [(1, 0, 9e7), (2, 1e7, 8e7), (3, 1e7, 8e7)]
        results.memory.step_per_rank = [meter.summary()]
        assert ("heap reuse" in memory_line(results)) == noted
    meter = StepMemory(on_cuda=True)
    meter.steps = [(1, 0, 9e7), (2, 1e7, 8e7)]
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    results.memory.step_per_rank = [meter.summary()]
    assert "heap reuse" not in memory_line(results)  # the CUDA allocator counts tensors


def test_each_engine_holds_computes_and_reduces_in_the_dtypes_the_plan_says():
    """One typed value per run (RunPlan.dtypes): DDP's fp32 masters under autocast reduce fp32 gradients; DeepSpeed and
    FSDP2 hold and reduce the compute dtype, DeepSpeed in its JSON's communication_data_type where it names one; the
    projection's bytes moved follow it."""
    from hfscale.formulas.precision import Dtypes
    from hfscale.models import PRESETS
    from hfscale.parallel.optimizers import get_optimizer
    from hfscale.parallel.strategies import get_strategy
    from hfscale.plan.projection import pattern_of
    from hfscale.runplan import RunPlan

    def plan(strategy, precision="bf16", deepspeed=None):
        return RunPlan(get_strategy(strategy), get_optimizer("adamw"), PRESETS["tiny"], 64, world_size=4,
                       precision=precision, deepspeed_config=deepspeed)

    assert plan("ddp").dtypes == Dtypes("fp32", "bf16", "fp32") == plan("tp").dtypes
    assert plan("fsdp").dtypes == Dtypes("bf16", "bf16", "bf16") == plan("zero2").dtypes
    assert plan("zero3", "tf32").dtypes == Dtypes("fp32", "fp32", "fp32")
    fp32_reduce = {**get_strategy("zero2").deepspeed_settings(), "communication_data_type": "fp32"}
    assert plan("zero2", deepspeed=fp32_reduce).dtypes == Dtypes("bf16", "bf16", "fp32")
    def sent(p):
        return pattern_of(p).bytes_per_step(grad_accum=1, ranks=4)

    assert sent(plan("zero2", deepspeed=fp32_reduce)) > sent(plan("zero2"))  # its gradients reduced in 4 bytes, not 2
    assert sent(plan("ddp")) == sent(plan("ddp", "fp32"))  # autocast: fp32 gradients whatever the compute dtype
    assert sent(plan("fsdp")) == pytest.approx(sent(plan("fsdp", "fp32")) / 2, rel=0.01)  # but the clip's fp32 norms
