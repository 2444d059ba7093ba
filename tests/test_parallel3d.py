"""3D layouts (tensor x pipeline x data parallelism) in the planners: the Megatron formulas against the papers' own
figures and against hfscale's independently checked counts, and `hfscale estimate` / `project` weighing them."""

import json
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest
from conftest import load_benchmark

from hfscale.errors import HfscaleError
from hfscale.formulas import parallel3d as p3d
from hfscale.formulas.comm import Links
from hfscale.formulas.metrics import ModelShape, param_count, training_flops_per_sequence
from hfscale.models import PRESETS
from hfscale.plan import estimate, project
from hfscale.plan.grid import GridPlan, grid_layouts
from hfscale.plan.projection import grid_model_error

TABLE = json.loads((Path(__file__).parent / "data" / "published_3d_throughput.json").read_text())
FAST = Links(intra_bw=1e30, inter_bw=1e30, intra_latency_s=0, inter_latency_s=0)


# ---- activations: Korthikanti et al. 2022, Table 2 -------------------------------------------------------------------

@pytest.mark.parametrize("s,b,h,a", [(2048, 1, 12288, 96), (1024, 4, 2048, 16), (2048, 2, 20480, 128)])
def test_activation_formulas_are_the_papers_table(s, b, h, a):
    per = lambda t=1, sp=False, r="none": p3d.activation_bytes_per_layer(s, b, h, a, t, sp, r)  # noqa: E731
    assert per() == pytest.approx(s * b * h * (34 + 5 * a * s / h))  # no parallelism
    for t in (2, 4, 8):
        assert per(t) == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))  # tensor parallel
        assert per(t, True) == pytest.approx(s * b * h / t * (34 + 5 * a * s / h))  # + sequence parallel
        assert per(t, False, "selective") == pytest.approx(s * b * h * (10 + 24 / t))  # + selective recompute
        assert per(t, True, "selective") == pytest.approx(34 * s * b * h / t)  # all three
        assert per(t, False, "full") == 2 * s * b * h and per(t, True, "full") == pytest.approx(2 * s * b * h / t)
        # a fused (flash) attention kernel keeps no scores: what selective recomputation leaves
        flash = p3d.activation_bytes_per_layer(s, b, h, a, t, False, "none", flash_attention=True)
        assert flash == per(t, False, "selective")


def test_layer_terms_follow_the_models_widths():
    """Korthikanti et al. count a GPT layer tensor by tensor; the same count at other widths: Llama's SwiGLU keeps
    three ffn-wide tensors where GeLU keeps two, grouped-query attention's keys and values are kv_hidden wide, Qwen3's
    queries and attention output q_hidden wide (its own head width), and a model trained without dropout keeps no
    masks and no dropped-out scores."""
    gpt = PRESETS["gpt2-1.3b"]
    assert p3d.layer_activation_terms(gpt) == p3d.GPT_LAYER_TERMS == (10, 24, 5)  # the paper's 34sbh + 5as^2b
    assert p3d.layer_activation_terms(gpt, dropout=False) == (8, 24, 2)
    llama = PRESETS["llama-3.1-70b"]  # h 8192, ffn 28672 = 3.5h, 8 of 64 heads' keys and values
    # split: Q 2 + K, V 2 x 2 x 1/8 + attention output 2 + 3 x 2 x 3.5 of SwiGLU
    assert p3d.layer_activation_terms(llama, dropout=False) == (8, 2 + 0.5 + 2 + 21, 2)
    qwen3 = PRESETS["qwen3-0.6b"]  # h 1024, 16 heads of 128: queries and the attention output 2h wide, k and v h
    assert p3d.layer_activation_terms(qwen3, dropout=False) == (8, 2 * 2 + 2 * 2 * 1 + 2 * 2 + 3 * 2 * 3, 2)
    s, b, t = 4096, 1, 8
    run = p3d.GridRun(llama, p3d.Grid(t, 4, 2), s, b, 8, "bf16", dropout=False)
    kept = p3d.stage_memory(run, 1).activations  # a middle stage: its layers alone, 3 micro-batches in flight
    layers = p3d.stage_layers(llama, run.grid)
    scores = 3 * layers * 2 * llama.n_head * s * s * b / t  # the softmax outputs (eager: no fused attention)
    assert kept == int(3 * layers * s * b * llama.hidden * (8 + 25.5 / t) + scores)
    masks = p3d.stage_memory(replace(run, dropout=True), 1).activations - kept
    assert masks == pytest.approx(3 * layers * (2 * s * b * llama.hidden + 3 * llama.n_head * s * s * b / t), rel=1e-9)


def test_selective_recompute_and_sequence_parallelism_cut_activations_about_5x():
    """The paper's abstract: the two techniques reduce activation memory by 5x (its 530B model, TP 8)."""
    m = TABLE["selective_recompute"]["model"]
    baseline = p3d.activation_bytes_per_layer(2048, 1, m["hidden"], m["heads"], m["tp"])
    both = p3d.activation_bytes_per_layer(2048, 1, m["hidden"], m["heads"], m["tp"], True, "selective")
    assert 4.5 < baseline / both < 5.5


# ---- states ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["gpt2-350m", "bloom-7b1"])
def test_the_stages_hold_the_whole_model_once_plus_the_tied_heads_copy(name):
    shape = PRESETS[name]
    padded = replace(shape, vocab=p3d.padded_vocab(shape.vocab, 1))
    for pp in (1, 2, 4):
        if shape.n_layer % pp:
            continue
        held = sum(p3d.stage_parameters(shape, p3d.Grid(1, pp), k) for k in range(pp))
        copy = padded.vocab * shape.hidden if pp > 1 else 0  # Megatron's last stage keeps its own LM-head weights
        assert held == param_count(padded) + copy
    # TP splits everything but the 6h of LayerNorms and row-parallel biases per block (and GPT-2's position table)
    t = 4
    padded = replace(shape, vocab=p3d.padded_vocab(shape.vocab, t))
    replicated = 6 * shape.hidden * shape.n_layer + 2 * shape.hidden + (
        shape.positions * shape.hidden if shape.family == "gpt2" else 2 * shape.hidden)
    assert t * p3d.stage_parameters(shape, p3d.Grid(t, 1), 0) == param_count(padded) + (t - 1) * replicated
    assert p3d.padded_vocab(50257, 8) == 51200 and p3d.padded_vocab(250880, 4) == 250880


def test_state_bytes_per_parameter_and_zero1_over_dp():
    shape = PRESETS["gpt2-350m"]
    run = p3d.GridRun(shape, p3d.Grid(1, 1, 8), 1024, 1, 8, "bf16")
    n = p3d.stage_parameters(shape, run.grid, 0)
    mem = p3d.stage_memory(run, 0)
    assert mem.model_states == 18 * n  # bf16 weights, fp32 gradients, fp32 masters, Adam's two fp32 states
    sharded = p3d.stage_memory(replace(run, grid=replace(run.grid, zero1=True)), 0)
    assert sharded.parameters + sharded.gradients == 6 * n
    assert sharded.master_weights + sharded.optimizer_states == 12 * -(-n // 8)
    assert p3d.stage_memory(replace(run, precision="fp16"), 0).gradients == 2 * n


def test_the_first_stage_keeps_pp_micro_batches_in_flight():
    shape = PRESETS["bloom-7b1"]  # 30 layers
    grid = p3d.Grid(2, 5, 1)
    per_layer = p3d.activation_bytes_per_layer(2048, 1, shape.hidden, shape.n_head, 2)
    for m, flight in ((16, 5), (3, 3)):
        run = p3d.GridRun(shape, grid, 2048, 1, m, "bf16")
        embedding_mask = flight * 2048 * shape.hidden
        assert p3d.stage_memory(run, 0).activations == int(flight * 6 * per_layer + embedding_mask)
        assert p3d.stage_memory(run, 4).activations > 6 * per_layer  # one in flight, plus the LM head's fp32 logits
    stage, _ = p3d.busiest_stage(p3d.GridRun(shape, grid, 2048, 1, 16, "bf16"))
    assert stage == 0


# ---- time ------------------------------------------------------------------------------------------------------------

def test_hardware_flops_under_full_recompute_are_the_ones_torch_counted():
    """Full recomputation reruns the blocks' forward: hfscale's reentrant-checkpoint FLOPs, which tests/test_metrics.py
    checks against torch's FlopCounterMode."""
    shape = PRESETS["gpt2-350m"]
    model, full = training_flops_per_sequence(shape, 1024, True, full_recompute=True)
    assert p3d.hardware_flops_per_sequence(shape, 1024, "full") == full
    assert p3d.hardware_flops_per_sequence(shape, 1024, "none") == model
    assert model < p3d.hardware_flops_per_sequence(shape, 1024, "selective") < 1.1 * model


def test_the_bubble_is_pp_minus_one_slots_of_m_plus_pp_minus_one():
    shape = PRESETS["bloom-7b1"]
    for pp, m in ((1, 8), (5, 8), (5, 64), (10, 4)):
        run = p3d.GridRun(shape, p3d.Grid(1, pp, 1), 2048, 1, m, "bf16")
        st = p3d.grid_step_time(run, flops_per_s=1e14, links=FAST, gpus_per_node=8)
        compute = p3d.hardware_flops_per_sequence(shape, 2048, "none") / pp / 1e14
        assert st.total_s == pytest.approx((m + pp - 1) * compute)
        assert st.bubble_s / st.total_s == pytest.approx((pp - 1) / (m + pp - 1))


def test_interleaving_cuts_the_bubble_v_times_for_v_times_the_sends():
    """Narayanan et al. 2021, section 2.2.2: V model chunks a GPU make the bubble (P - 1)/V slots and send each
    micro-batch's activations V times as often; with free links the step is (M + (P - 1)/V) slots."""
    shape = PRESETS["bloom-7b1"]  # 30 layers
    compute = p3d.hardware_flops_per_sequence(shape, 2048, "none") / 5 / 1e14
    for vp, m in ((1, 8), (2, 8), (3, 64), (6, 5)):
        run = p3d.GridRun(shape, p3d.Grid(1, 5, 1, vp=vp), 2048, 1, m, "bf16")
        st = p3d.grid_step_time(run, flops_per_s=1e14, links=FAST, gpus_per_node=8)
        assert st.total_s == pytest.approx((m + 4 / vp) * compute) and st.bubble_s == pytest.approx(4 / vp * compute)
    slow = Links(intra_bw=100e9, inter_bw=10e9, intra_latency_s=0, inter_latency_s=0)
    sends = {vp: p3d.grid_step_time(p3d.GridRun(shape, p3d.Grid(2, 5, 1, vp=vp), 2048, 1, 8, "bf16"), flops_per_s=1e14,
                                    links=slow, gpus_per_node=8) for vp in (1, 3)}
    assert sends[3].p2p_s == pytest.approx(3 * sends[1].p2p_s) and sends[1].p2p_s > 0
    assert sends[3].comm_bytes - sends[1].comm_bytes == pytest.approx(8 * 2 * 2 * 2048 * shape.hidden * 2 / 2)


def test_interleaving_keeps_megatrons_warm_up_in_flight():
    """The first stage holds what Megatron-Core's interleaved warm-up leaves in flight - 2 (P - 1) + (V - 1) P chunk
    forwards, then one more before the first backward, each through L/(PV) layers - which is 1 + (P - 1)/(PV) of
    1F1B's P micro-batches (Korthikanti et al. 2022, section 4.2.3); the last stage holds V chunks' worth less."""
    shape = ModelShape("gpt2", 48, 2048, 16, 51200, 2048)
    for pp, vp in ((4, 2), (4, 3), (8, 2), (3, 4)):
        interleaved = p3d.GridRun(shape, p3d.Grid(1, pp, 1, vp=vp), 2048, 1, 64, "bf16")
        plain = replace(interleaved, grid=p3d.Grid(1, pp, 1))
        assert interleaved.in_flight(0) == pytest.approx(plain.in_flight(0) * (1 + (pp - 1) / (pp * vp)))
        assert interleaved.in_flight(pp - 1) == pytest.approx(((vp - 1) * pp + 1) / vp)
        per_layer = p3d.activation_bytes_per_layer(2048, 1, 2048, 16)
        extra = p3d.stage_memory(interleaved, 0).activations - p3d.stage_memory(plain, 0).activations
        assert extra == pytest.approx((interleaved.in_flight(0) - pp) * 48 / pp * per_layer, abs=1)
    few = p3d.GridRun(shape, p3d.Grid(1, 4, 1, vp=3), 2048, 1, 2, "bf16")  # all M V chunk forwards fit the warm-up
    assert few.in_flight(0) == 2


def test_context_parallelism_splits_each_sequence_and_reduces_over_dp_x_cp():
    """CP 2 on twice the GPUs computes what DP 2 does on them, at the same global batch: half of every sequence a GPU
    instead of half of the sequences; its activations hold half the tokens (attention scores: half the queries
    against every key); its gradients are reduced, and ZeRO-1's states sharded, over DP x CP. The key/value ring is
    charged only where the attention it overlaps does not hide it."""
    shape = PRESETS["llama-3.1-8b"]
    cp = p3d.GridRun(shape, p3d.Grid(2, 1, 2, cp=2, zero1=True), 8192, 1, 16, "bf16")
    dp = replace(cp, grid=p3d.Grid(2, 1, 4, zero1=True), micro_batches=8)
    assert cp.grid.gpus == dp.grid.gpus == 8 and cp.global_batch == dp.global_batch == 32
    time = lambda run, links=FAST: p3d.grid_step_time(run, flops_per_s=4e14, links=links, gpus_per_node=8)  # noqa: E731
    assert time(cp).compute_s == pytest.approx(time(dp).compute_s) and time(cp).cp_comm_s == 0
    assert p3d.stage_memory(cp, 0).optimizer_states == p3d.stage_memory(dp, 0).optimizer_states
    s, h, a = 8192, shape.hidden, shape.n_head
    assert p3d.activation_bytes_per_layer(s, 1, h, a, 2, cp=2) == pytest.approx(s / 2 * h * (10 + 24 / 2)
                                                                               + 5 * a * s / 2 * s / 2)
    slow = Links(intra_bw=200e9, inter_bw=1e9, intra_latency_s=0, inter_latency_s=0)
    assert time(cp, slow).dp_comm_s == pytest.approx(time(dp, slow).dp_comm_s)  # the same 4-GPU reduction
    # across nodes (TP 8 x CP 2 spans two) on a link too thin for the attention to hide it, the ring is all exposed:
    # a layer's forward sends one GPU's keys and values once, its backward them and their gradients
    wide = p3d.GridRun(shape, p3d.Grid(8, 1, 1, cp=2), 8192, 1, 4, "bf16")
    kv = 2 * 8192 / 2 * shape.kv_hidden / 8 * 2  # one GPU's keys and values of its half, bf16
    st = time(wide, Links(intra_bw=200e9, inter_bw=1e6, intra_latency_s=0, inter_latency_s=0))
    assert st.cp_comm_s == pytest.approx(4 * shape.n_layer * 3 * kv / 1e6, rel=1e-3)


def test_a_stage_steps_the_adam_states_its_memory_holds_once_a_step():
    """The Adam step of the busiest stage reads and writes what stage_memory says that GPU holds - its fp32 masters and
    Adam's two states, 1/DP of them under ZeRO-1 - at fused AdamW's traffic per element (the gradient in main_grad's
    dtype, the 16-bit weight written back), once per step at any accumulation; memory_bw 0 leaves it out."""
    shape = PRESETS["bloom-7b1"]
    for zero1, precision in ((False, "bf16"), (True, "bf16"), (False, "fp32"), (True, "fp16")):
        grid = p3d.Grid(2, 2, 4, zero1=zero1)
        for m in (1, 16):
            run = p3d.GridRun(shape, grid, 2048, 1, m, precision)
            n = max(p3d.stage_parameters(shape, grid, k) for k in (0, 1))
            mem = max((p3d.stage_memory(run, k) for k in (0, 1)), key=lambda x: x.optimizer_states)
            elements = mem.optimizer_states // 8  # exp_avg + exp_avg_sq, fp32
            assert elements == (-(-n // 4) if zero1 else n)
            # the fp32 weight read and written, main_grad read, both states read and written, the 16-bit copy written
            per_element = {"bf16": 8 + 4 + 16 + 2, "fp16": 8 + 2 + 16 + 2, "fp32": 8 + 4 + 16}[precision]
            assert p3d.stage_optimizer_bytes(grid, n, precision) == elements * per_element
            timed = p3d.grid_step_time(run, flops_per_s=1e14, links=FAST, gpus_per_node=8, memory_bw=2e12)
            plain = p3d.grid_step_time(run, flops_per_s=1e14, links=FAST, gpus_per_node=8)
            assert timed.optimizer_s == pytest.approx(elements * per_element / 2e12) and plain.optimizer_s == 0
            assert timed.total_s == pytest.approx(plain.total_s + timed.optimizer_s)


def test_tp_all_reduces_four_times_per_block_and_six_under_full_recompute():
    shape = PRESETS["bloom-7b1"]
    links = Links(intra_bw=100e9, inter_bw=10e9, intra_latency_s=0, inter_latency_s=0)
    for recompute, n in (("none", 4), ("full", 6)):
        run = p3d.GridRun(shape, p3d.Grid(4, 1, 1), 2048, 2, 3, "bf16", recompute)
        st = p3d.grid_step_time(run, flops_per_s=1e14, links=links, gpus_per_node=8)
        message = 2 * 2048 * shape.hidden * 2  # b x s x h bf16
        assert st.tp_comm_s == pytest.approx(3 * shape.n_layer * n * 2 * 3 / 4 * message / 100e9)


def _table_run(row, mbs=1) -> p3d.GridRun:
    shape = ModelShape("gpt2", row["layers"], row["hidden"], row["heads"], 51200, 2048)
    grid = p3d.Grid(row["tp"], row["pp"], row["gpus"] // (row["tp"] * row["pp"]))
    return p3d.GridRun(shape, grid, 2048, mbs, row["global_batch"] // (mbs * grid.dp), "fp16", "full")


@cache
def _selene() -> Links:
    """Selene's links as the published record gives them (one home: its rows and these are checked at the same)."""
    record = load_benchmark("published_record")
    return record.links_of(json.loads(record.DATA.read_text())["systems"]["selene-a100"])


def _tflops(row, rate) -> float:
    run = _table_run(row)
    st = p3d.grid_step_time(run, flops_per_s=rate, links=_selene(), gpus_per_node=8)
    return p3d.hardware_flops_per_sequence(run.shape, 2048, "full") * run.global_batch / st.total_s / row["gpus"] / 1e12


def test_megatron_2021_throughput_from_one_calibrated_row():
    """Projected from the 145.6B row's throughput alone, every other GPT configuration of Narayanan et al. 2021 lands
    within 25% of its published TFLOPs per GPU, and within the band `hfscale project` draws around 3D layouts (the
    published record's 3D rows, these among them: tests/test_published_record.py)."""
    rows = TABLE["rows"]
    for row in rows:  # the transcription is consistent: shape -> parameters, TFLOPs x GPUs -> aggregate
        shape = ModelShape("gpt2", row["layers"], row["hidden"], row["heads"], 51200, 2048)
        assert param_count(shape) / 1e9 == pytest.approx(float(row["params_b"]), rel=0.03)  # 1.65 is printed 1.7
        assert row["tflops_per_gpu"] * row["gpus"] / 1e3 == pytest.approx(row["aggregate_pflops"], rel=0.01)
    calibration = next(r for r in rows if r["params_b"] == TABLE["calibration_row"])
    lo, hi = 1e12, 1e16
    for _ in range(200):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if _tflops(calibration, mid) < calibration["tflops_per_gpu"] else (lo, mid)
    ratios = [_tflops(r, mid) / r["tflops_per_gpu"] for r in rows]
    low, high = grid_model_error()
    assert low - 0.005 <= min(ratios) and max(ratios) <= high + 0.005
    assert max(abs(r - 1) for r in ratios) < 0.25


def test_selective_recompute_with_sequence_parallelism_is_as_much_faster_as_published():
    """Korthikanti et al.: 530B on 2240 A100s, 54.2% MFU against 42.1% with full recomputation (1.29x)."""
    ref = TABLE["selective_recompute"]
    m = ref["model"]
    shape = ModelShape("gpt2", m["layers"], m["hidden"], m["heads"], 51200, 2048)
    dp = m["gpus"] // (m["tp"] * m["pp"])
    micro = ref["global_batch_assumed"] // (ref["micro_batch_assumed"] * dp)
    full = p3d.GridRun(shape, p3d.Grid(m["tp"], m["pp"], dp), 2048, 1, micro, "bf16", "full")
    both = p3d.GridRun(shape, p3d.Grid(m["tp"], m["pp"], dp, True), 2048, 1, micro, "bf16", "selective")
    time = lambda run: p3d.grid_step_time(run, flops_per_s=2e14, links=_selene(), gpus_per_node=8).total_s  # noqa: E731
    assert time(full) / time(both) == pytest.approx(ref["mfu_selective_sp"] / ref["mfu_full"], rel=0.05)


# ---- the planners ---------------------------------------------------------------------------------------------------

def test_layouts_searched_are_the_ones_megatron_accepts():
    shape = PRESETS["bloom-7b1"]  # 32 heads, 30 layers
    layouts = grid_layouts(shape, 64, 8)
    assert (8, 2, 1) in layouts and (1, 1, 1) in layouts and (4, 15, 1) not in layouts  # 4 x 15 does not divide 64
    assert all(t <= 8 and 32 % t == 0 and 30 % p == 0 and 64 % (t * p) == 0 and c == 1 for t, p, c in layouts)
    # interleaved over 5 chunks: PP 2, 3 and 6 cut 30 layers into 5 equal chunks a stage; PP 1 (nothing to
    # interleave), 5 (6 layers a stage) and 15 (2) do not; on 64 GPUs only PP 2 divides the GPUs
    interleaved = grid_layouts(shape, 64, 8, vp=5)
    assert {p for _, p, _ in interleaved} == {2} and all(30 % (p * 5) == 0 for _, p, _ in interleaved)
    assert {p for _, p, _ in grid_layouts(shape, 480, 8, vp=5)} == {2, 3, 6}
    # context parallelism multiplies into the replica: TP x PP x CP divides the GPUs
    assert (4, 2, 2) in grid_layouts(shape, 64, 8, cps=[2]) and (8, 2, 4) not in grid_layouts(shape, 48, 8, cps=[4])
    # Megatron-DeepSpeed cuts stages unevenly (BLOOM: 70 layers on 12 stages); its busiest stage holds ceil(L / PP)
    bloom = PRESETS["bigscience-176b"]
    assert (4, 12, 1) in grid_layouts(bloom, 384, 8, uneven_stages=True)
    assert (4, 12, 1) not in grid_layouts(bloom, 384, 8)
    uneven = p3d.Grid(4, 12, 8, uneven_stages=True)
    assert p3d.stage_layers(bloom, uneven) == 6 and p3d.grid_refusal(bloom, uneven, 8) is None
    assert "does not divide the 70 layers" in p3d.grid_refusal(bloom, replace(uneven, uneven_stages=False), 8)
    plan = GridPlan("megatron", "adamw", shape, 2048, tp=3, pp=1, dp=1)
    assert "does not divide the 32 attention heads" in plan.refusal()
    assert "not a Megatron optimizer" in plan.but(tp=1, optimizer="adamw_8bit").refusal()
    assert "PP 1 has none" in plan.but(tp=1, vp=2).refusal()
    assert "does not cut each of the PP 2 stages' 15 layers" in plan.but(tp=1, pp=2, vp=2).refusal()
    assert "seq 2047 does not divide" in plan.but(tp=1, cp=2, seq_len=2047).refusal()
    deepspeed = plan.but(family="megatron-deepspeed", tp=1, pp=2)
    assert "no context parallelism" in deepspeed.but(cp=2).refusal()
    assert "no interleaved schedule" in deepspeed.but(vp=3).refusal()
    assert plan.but(tp=1, pp=2, vp=3, cp=2).refusal() is None and plan.but(tp=4, pp=2, vp=3, cp=2).name == \
        "megatron-tp4-pp2-vp3-cp2"
    with pytest.raises(HfscaleError, match="unknown 3D layout family 'megatron-lm'"):
        GridPlan("megatron-lm", "adamw", shape, 2048)


def test_estimate_weighs_3d_layouts_beside_the_strategies(capsys):
    estimate.main(["--model", "bloom-7b1", "--strategy", "zero1,megatron,megatron-deepspeed", "--tp", "1,4,16",
                   "--pp", "1,2", "--gpus", "16", "--bf16", "--seq_len", "2048", "--activation_checkpointing",
                   "--gradient_accumulation_steps", "8", "--json"])
    rows = json.loads(capsys.readouterr().out)["rows"]
    by = {r["strategy"]: r for r in rows}
    assert {"zero1", "megatron-tp4-pp2", "megatron-deepspeed-tp1-pp1", "megatron-tp16-pp2"} <= set(by)
    assert "spans more than one node" in by["megatron-tp16-pp1"]["refused"]
    assert "TP x PP = 32 does not divide --gpus 16" in by["megatron-tp16-pp2"]["refused"]
    # Megatron-LM keeps Adam whole on every DP rank: 7.1B on one GPU cannot fit 80 GB; TP 4 x PP 2 can, and
    # ZeRO-1 over DP (megatron-deepspeed) divides the masters and states 16 ways
    assert not by["megatron-tp1-pp1"]["fits"] and by["megatron-tp4-pp2"]["fits"]
    plain, zero1 = by["megatron-tp1-pp1"]["memory"], by["megatron-deepspeed-tp1-pp1"]["memory"]
    assert zero1["optimizer_states"] == pytest.approx(plain["optimizer_states"] / 16, rel=1e-6)
    assert by["megatron-tp4-pp2"]["memory"]["parameters"] < plain["parameters"] / 6  # 1/8, and the embedding
    with pytest.raises(HfscaleError, match="add megatron or megatron-deepspeed to --strategy"):
        estimate.main(["--model", "bloom-7b1", "--strategy", "zero1", "--pp", "2"])


def test_project_all_includes_the_fastest_3d_layout_that_fits(capsys):
    argv = ["--model", "bloom-7b1", "--tflops_per_gpu", "150", "--seq_len", "2048", "--per_device_train_batch_size",
            "1", "--gradient_accumulation_steps", "16", "--bf16", "--device", "A100-80GB", "--activation_checkpointing",
            "--gpus", "8,64,512", "--inter_bw", "25", "--intra_bw", "230", "--json"]
    project.main([*argv, "--strategy", "all"])
    report = json.loads(capsys.readouterr().out)
    grid = [p for p in report["points"] if p["strategy"] == "megatron-deepspeed"]
    assert [p["gpus"] for p in grid] == [8, 64, 512] and all(p["layout"] and p["fits"] for p in grid)
    assert any("megatron* layouts" in a for a in report["assumptions"])
    # the same global batch as the data-parallel strategies at each count
    zero1 = {p["gpus"]: p for p in report["points"] if p["strategy"] == "zero1"}
    assert all(p["global_batch_size"] == zero1[p["gpus"]]["global_batch_size"] for p in grid)
    # one fixed layout is its own series; on a 40 GB device a 7.1B model only fits split 8 ways by TP x PP
    project.main([*argv, "--strategy", "megatron", "--tp", "1,8", "--pp", "1", "--device", "A100-40GB"])
    fixed = json.loads(capsys.readouterr().out)
    series = {p["strategy"]: p for p in fixed["points"] if p["gpus"] == 64}
    assert series["megatron-tp1-pp1"]["fits"] is False and series["megatron-tp8-pp1"]["fits"]
    assert fixed["best_that_fits"]["64"].startswith("megatron-tp8-pp1")
    with pytest.raises(HfscaleError, match="add megatron or megatron-deepspeed to --strategy"):
        project.main([*argv, "--strategy", "zero1", "--tp", "2"])
    with pytest.raises(HfscaleError, match="no 3D layout of this model for --gpus 8,64,512"):
        project.main([*argv, "--strategy", "megatron", "--pp", "7"])  # 30 layers


def test_the_planners_weigh_interleaved_and_context_parallel_layouts(capsys):
    """--vp interleaves every megatron layout (its first stage holding 1 + (PP - 1)/(PP V) of 1F1B's activations, its
    bubble 1/V), --cp splits each sequence; both are refused one line where they cannot be laid out."""
    argv = ["--model", "llama-3.1-70b", "--strategy", "megatron", "--tp", "4", "--pp", "4", "--gpus", "64", "--bf16",
            "--seq_len", "8192", "--gradient_accumulation_steps", "64", "--per_device_train_batch_size", "1", "--json"]
    estimate.main(argv)
    plain = {r["strategy"]: r for r in json.loads(capsys.readouterr().out)["rows"]}["megatron-tp4-pp4"]
    estimate.main([*argv, "--vp", "5", "--cp", "1,2"])
    rows = {r["strategy"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    interleaved, split = rows["megatron-tp4-pp4-vp5"]["memory"], rows["megatron-tp4-pp4-vp5-cp2"]["memory"]
    assert "interleaved (VP 5): 4.6 micro-batch(es) in flight" in interleaved["activation_calibration"]
    assert interleaved["activations"] > plain["memory"]["activations"] * (1 + 3 / 20) * 0.999
    assert split["activations"] == pytest.approx(interleaved["activations"] / 2, rel=1e-6)  # every term: half the
    # tokens
    assert split["parameters"] == interleaved["parameters"]
    estimate.main([*argv, "--vp", "3"])  # 20 layers a stage do not cut into 3 chunks
    refused = json.loads(capsys.readouterr().out)["rows"][0]["refused"]
    assert "VP 3 does not cut each of the PP 4 stages' 20 layers" in refused
    with pytest.raises(HfscaleError, match="--cp describes Megatron-LM layouts"):
        estimate.main([*argv[:3], "megatron-deepspeed", *argv[4:], "--cp", "2"])
    with pytest.raises(HfscaleError, match="--vp must be at least 1"):
        estimate.main([*argv, "--vp", "0"])
    # Megatron-LM's default dropout keeps each layer's masks and dropped-out scores (eager; hfscale's runs train
    # without)
    for extra in ([], ["--dropout", "0.1"]):
        estimate.main([*argv, "--attn_implementation", "eager", *extra])
        sizes = json.loads(capsys.readouterr().out)["rows"][0]["memory"]
        if extra:
            s, b, t, layers, a = 8192, 1, 4, 20, 64
            masks = 4 * layers * (2 * s * b * 8192 + 3 * a * s * s * b / t) + 4 * s * b * 8192  # 4 in flight; embedding
            assert sizes["activations"] - eager_plain == pytest.approx(masks, rel=1e-6)
        eager_plain = sizes["activations"]
    # NVIDIA's recipe for it (TP 4, PP 4, VP 5, CP 2, MBS 1 on 64 H100 80GB) runs with sequence parallelism, a fused
    # attention and Megatron's distributed optimizer (NeMo's defaults): so it fits 80 GB; with Adam whole on every
    # GPU it would not, and with the attention's scores kept (eager) it would not by far
    recipe = [*argv, "--vp", "5", "--cp", "2", "--sequence_parallel", "--device", "H100-80GB"]
    sizes = {}
    eager = ["--use_distributed_optimizer", "--attn_implementation", "eager"]
    for extra in (["--use_distributed_optimizer"], [], eager):
        estimate.main([*recipe, *extra])
        row = json.loads(capsys.readouterr().out)["rows"][0]
        sizes[" ".join(extra)] = row["memory"]
        assert row["fits"] is (extra == ["--use_distributed_optimizer"]), (extra, row["memory"]["device_total"])
    sharded, whole = sizes["--use_distributed_optimizer"], sizes[""]
    assert sharded["optimizer_states"] == pytest.approx(whole["optimizer_states"] / 4, rel=1e-6)  # over DP 2 x CP 2
    # (without dropout an eager attention keeps its softmax's 2as^2b, no mask or dropout output)
    assert sizes["--use_distributed_optimizer --attn_implementation eager"]["activations"] > 4 * sharded["activations"]
    flags = ["--tflops_per_gpu", "400", "--device", "H100-80GB", "--gpus", "64,128", "--inter_bw", "40", "--intra_bw",
             "360", "--json"]
    project.main([*argv[:8], "--seq_len", "8192", "--per_device_train_batch_size", "1", "--gradient_accumulation_steps",
                  "2", *flags, "--vp", "5", "--cp", "2"])
    points = json.loads(capsys.readouterr().out)["points"]
    assert {p["strategy"] for p in points} == {"megatron-tp4-pp4-vp5-cp2"}
    assert [p["layout"] for p in points] == ["tp4-pp4-vp5-cp2-dp2", "tp4-pp4-vp5-cp2-dp4"]


# ---- projecting from a Megatron log (hfscale import-logs, then hfscale project) ------------------------------------------

LOG = """using world size: 16, data-parallel-size: 4, tensor-model-parallel size: 2, pipeline-model-parallel size: 2
using torch.bfloat16 for parameters ...
------------------------ arguments ------------------------
  checkpoint_activations .......................... True
  deepspeed ....................................... True
  global_batch_size ............................... 256
  hidden_size ..................................... 2048
  micro_batch_size ................................ 2
  num_attention_heads ............................. 16
  num_layers ...................................... 24
  seq_length ...................................... 2048
-------------------- end of arguments ---------------------
> padded vocab (size: 50257) with 431 dummy tokens (new size: 50688)
""" + "".join(f" iteration {10 * i:>8}/  100000 | consumed samples: {2560 * i:>12} | elapsed time per iteration (ms): "
              f"{ms} | global batch size:   256 | lm loss: 7.0E+00 |\n" for i, ms in enumerate([9000.0, 6100.0, 5900.0], 1))


def test_a_megatron_log_projects_from_the_throughput_its_own_layout_achieved(tmp_path, capsys):
    from hfscale.compare import megatron

    (tmp_path / "1B3-megatron-log.out").write_text(LOG)
    megatron.main([str(tmp_path / "1B3-megatron-log.out"), "--out", str(tmp_path / "imported")])
    capsys.readouterr()
    results = tmp_path / "imported" / "1B3-megatron-log" / "results.json"
    logged = json.loads(results.read_text())
    assert logged["model"]["n_head"] == 16 and logged["model"]["vocab"] == 50688 and logged["config"]["precision"] == "bf16"
    links = ["--intra_bw", "230", "--inter_bw", "25", "--gpus_per_node", "8", "--json"]
    project.main([str(results), "--gpus", "16,32", *links])
    report = json.loads(capsys.readouterr().out)
    own = {p["gpus"]: p for p in report["points"]}
    assert set(own) == {16, 32} and all(p["strategy"] == "megatron-deepspeed-tp2-pp2" for p in own.values())
    # its own layout at its own GPU count and global batch is the logged step, exactly: the rate was solved from it
    assert own[16]["s_per_iter"] == pytest.approx(logged["perf"]["s_per_iter"], rel=1e-6)
    # twice the GPUs, the same global batch: half the micro-batches per pipeline, the same bubble - under 2x faster
    assert own[16]["s_per_iter"] / 2 < own[32]["s_per_iter"] < own[16]["s_per_iter"]
    assert any("TFLOPs per GPU of compute by the 3D model" in a for a in report["assumptions"])
    project.main([str(results), "--gpus", "16", "--strategy", "zero1,megatron-deepspeed", *links])
    both = {p["strategy"] for p in json.loads(capsys.readouterr().out)["points"]}
    assert both == {"zero1", "megatron-deepspeed"}
    (tmp_path / "7B-megatron-noshape.out").write_text(LOG.replace("  num_attention_heads", "  unrelated_flag"))
    megatron.main([str(tmp_path / "7B-megatron-noshape.out"), "--out", str(tmp_path / "imported")])
    with pytest.raises(HfscaleError, match="the log states no GPT-2/BLOOM/Llama model shape"):
        project.main([str(tmp_path / "imported" / "7B-megatron-noshape" / "results.json"), "--gpus", "16"])
    # half a Llama (SwiGLU alone) is no model the formulas know: no shape is recorded for it
    (tmp_path / "7B-megatron-swiglu.out").write_text(LOG.replace("  seq_length", "  swiglu ... True\n  seq_length"))
    megatron.main([str(tmp_path / "7B-megatron-swiglu.out"), "--out", str(tmp_path / "imported")])
    swiglu = json.loads((tmp_path / "imported" / "7B-megatron-swiglu" / "results.json").read_text())
    assert swiglu["model"]["n_head"] is None and swiglu["status"] == "ok"
    # a Llama (rotary positions, SwiGLU, RMSNorm, no biases, 4 query groups, an untied head) is the llama family, and
    # projects as one: its parameters the Llama model's
    llama_args = ("  disable_bias_linear ... True\n  group_query_attention ... True\n  normalization ... RMSNorm\n"
                  "  num_query_groups ... 4\n  position_embedding_type ... rope\n  swiglu ... True\n"
                  "  untie_embeddings_and_output_weights ... True\n  ffn_hidden_size ... 5632\n  seq_length")
    (tmp_path / "1B-megatron-llama.out").write_text(LOG.replace("  seq_length", llama_args))
    megatron.main([str(tmp_path / "1B-megatron-llama.out"), "--out", str(tmp_path / "imported")])
    capsys.readouterr()
    imported = tmp_path / "imported" / "1B-megatron-llama" / "results.json"
    model = json.loads(imported.read_text())["model"]
    assert (model["family"], model["n_kv_head"], model["tied"], model["ffn"]) == ("llama", 4, False, 5632)
    project.main([str(imported), "--gpus", "16,32", *links])
    assert {p["gpus"] for p in json.loads(capsys.readouterr().out)["points"]} == {16, 32}
    # Megatron's Qwen2 recipes put the q/k/v biases back (add_qkv_bias): the qwen2 family, and projected as one
    (tmp_path / "1B-megatron-qwen2.out").write_text(LOG.replace("  seq_length", f"  add_qkv_bias ... True\n{llama_args}"))
    megatron.main([str(tmp_path / "1B-megatron-qwen2.out"), "--out", str(tmp_path / "imported")])
    capsys.readouterr()
    imported = tmp_path / "imported" / "1B-megatron-qwen2" / "results.json"
    qwen2 = json.loads(imported.read_text())["model"]
    assert (qwen2["family"], qwen2["n_kv_head"], qwen2["tied"], qwen2["ffn"]) == ("qwen2", 4, False, 5632)
    assert {k: v for k, v in qwen2.items() if k != "family"} == {k: v for k, v in model.items() if k != "family"}
    project.main([str(imported), "--gpus", "16", *links])
    assert [p["gpus"] for p in json.loads(capsys.readouterr().out)["points"]] == [16]
    # its Qwen3 recipes: per-head q/k norms (qk_layernorm) and a head width of their own (kv_channels 256 on 16 heads
    # of a 2048-wide model); a Llama with such heads (Mistral-Nemo's recipe) is a Llama whose queries are 4096 wide,
    # a Qwen2 with them no model hfscale knows
    (tmp_path / "1B-megatron-qwen3.out").write_text(
        LOG.replace("  seq_length", f"  qk_layernorm ... True\n  kv_channels ... 256\n{llama_args}"))
    (tmp_path / "1B-megatron-wide.out").write_text(LOG.replace("  seq_length", f"  kv_channels ... 256\n{llama_args}"))
    (tmp_path / "1B-megatron-wide-qwen2.out").write_text(
        LOG.replace("  seq_length", f"  add_qkv_bias ... True\n  kv_channels ... 256\n{llama_args}"))
    megatron.main([str(tmp_path / f"1B-megatron-{n}.out") for n in ("qwen3", "wide", "wide-qwen2")]
                  + ["--out", str(tmp_path / "imported")])
    capsys.readouterr()
    qwen3 = json.loads((tmp_path / "imported" / "1B-megatron-qwen3" / "results.json").read_text())["model"]
    assert (qwen3["family"], qwen3["head_dim"], qwen3["n_kv_head"], qwen3["ffn"]) == ("qwen3", 256, 4, 5632)
    wide = json.loads((tmp_path / "imported" / "1B-megatron-wide" / "results.json").read_text())["model"]
    assert (wide["family"], wide["head_dim"], wide["n_kv_head"]) == ("llama", 256, 4)
    assert json.loads((tmp_path / "imported" / "1B-megatron-wide-qwen2" / "results.json").read_text())["model"][
        "n_head"] is None
    for name in ("qwen3", "wide"):
        project.main([str(tmp_path / "imported" / f"1B-megatron-{name}" / "results.json"), "--gpus", "16", *links])
        assert [p["gpus"] for p in json.loads(capsys.readouterr().out)["points"]] == [16]


def test_megatron_layouts_projected_from_a_run_keep_its_dropout_masks(tmp_path, capsys):
    """A run records its model's dropout (results.json model.dropout: hfscale's runs train without); the 3D layouts
    projected from it keep dropout masks only where it had them (--dropout overrides)."""
    from conftest import parity_runs

    run = parity_runs()["runs"]["ddp"]
    assert run["model"]["dropout"] == 0.0
    sizes = {}
    for dropout in (0.0, 0.1):
        folder = tmp_path / f"dropout-{dropout}"
        folder.mkdir()
        record = json.loads((Path(run["output_dir"]) / "results.json").read_text())
        record["model"]["dropout"] = dropout
        (folder / "results.json").write_text(json.dumps(record))
        project.main([str(folder / "results.json"), "--strategy", "megatron", "--tp", "2", "--gpus", "2", "--json"])
        sizes[dropout] = json.loads(capsys.readouterr().out)["points"][0]["total_per_gpu"]
    assert sizes[0.1] > sizes[0.0]
    project.main([str(tmp_path / "dropout-0.1" / "results.json"), "--strategy", "megatron", "--tp", "2", "--gpus",
                  "2", "--dropout", "0", "--json"])
    assert json.loads(capsys.readouterr().out)["points"][0]["total_per_gpu"] == sizes[0.0]
