"""hfscale's tensor-parallel plan (hfscale/parallel/tensor_parallel.py) on a real 2-process TP mesh (gloo): the split
models train exactly as the whole ones, every parameter is the DTensor the plan says, and each rank holds what the plan's
table (formulas/tensors.tp_local_tensors) and the 3D memory formula (formulas/parallel3d.stage_parameters) count. Then
the strategies that run it through the Trainer, tp and fsdp_tp: parity with ddp, the start-up proof, exact resume."""

import json
from pathlib import Path

import pytest

from conftest import assert_figures_count_the_loaders, assert_trains_as, probe, shared_run
from hfscale.formulas import parallel3d as p3d
from hfscale.models import PRESETS
from hfscale.formulas.tensors import tp_local_tensors
from hfscale.models import FAMILIES
from hfscale.parallel.tensor_parallel import tp_refusal

pytestmark = pytest.mark.multiprocess


@pytest.fixture()
def parity() -> dict:
    """The probe's 2-process TP world, run once per session by whichever pytest-xdist worker asks first."""
    return shared_run("tensor-parallel-probe", lambda folder: probe("tensor_parallel_parity")["ranks"])


@pytest.mark.parametrize("family,preset", [("gpt2", "tiny"), ("bloom", "tiny-bloom"), ("llama", "tiny-llama"),
                                           ("qwen2", "tiny-qwen2"), ("qwen3", "tiny-qwen3"),
                                           ("gemma3", "tiny-gemma3"), ("olmo2", "tiny-olmo2")])
def test_the_split_model_trains_as_the_whole_one(parity, family, preset):
    for rank in parity:
        got = rank[family]
        whole, split = got["losses"]
        assert split == pytest.approx(whole, abs=1e-5)  # 3 AdamW steps with clipping, the same batches
        # the weights: at most steps x lr x grad_diff / Adam's eps apart (the probe says why its eps is 1e-3)
        assert got["grad_diff"] < 1e-6 and got["weight_diff"] < 3 * 1e-2 * 1e-6 / 1e-3
        assert got["norms"][1] == pytest.approx(got["norms"][0], rel=1e-4)  # clipping sees every shard once
    # each rank holds 1/TP of the split matrices and all of the rest: what the 3D memory formula counts
    shape = PRESETS[preset]
    assert parity[0][family]["local_numel"] == sum(t.numel for t in tp_local_tensors(shape, 2))
    # Megatron's count (formulas.parallel3d) but for GPT-2's c_attn bias, which hfscale keeps whole (3h per block)
    kept_whole = shape.n_layer * 3 * shape.hidden // 2 if family == "gpt2" else 0
    assert parity[0][family]["local_numel"] == p3d.stage_parameters(shape, p3d.Grid(tp=2), 0) + kept_whole
    assert parity[0][family]["local_numel"] < parity[0][family]["whole_numel"]


@pytest.mark.parametrize("family", ["gpt2", "bloom", "llama", "qwen2", "qwen3", "gemma3", "olmo2"])
def test_every_parameter_is_the_dtensor_the_plan_says(parity, family):
    placements = parity[0][family]
    placements = placements["placements"]
    split = dict(FAMILIES[family].tp_plan)
    for name, placed in placements.items():
        module = next((m for m in split if f".{m}." in name), None)
        if name.endswith(("wte.weight", "word_embeddings.weight", "embed_tokens.weight", "lm_head.weight")):
            assert placed == "(Shard(dim=0),)", name  # by vocabulary rows: the embedding, and the head (tied or not)
        elif module is None or split[module] == "per_head":
            assert placed == "(Replicate(),)", name  # position table, LayerNorms, Qwen3's per-head q/k norms
        elif name.endswith(".bias") and split[module] in ("rowwise", "colwise_fused3"):
            assert placed == "(Replicate(),)", name  # added once, after the partial sums are reduced; GPT-2's c_attn
        elif split[module] == "colwise_fused3":  # GPT-2's [q | k | v]: each of the three split, [q_r | k_r | v_r]
            assert "_StridedShard" in placed and "sf=3" in placed, name
        else:
            assert placed.startswith("(Shard(dim="), name
    # GPT-2's Conv1D is [in, out], so its column split is dim 1; BLOOM's and Llama's nn.Linear is [out, in]: dim 0
    out_dim = 1 if family == "gpt2" else 0
    first = {"gpt2": "transformer.h.0.mlp.c_fc", "bloom": "transformer.h.0.mlp.dense_h_to_4h",
             "llama": "model.layers.0.mlp.gate_proj", "qwen2": "model.layers.0.mlp.gate_proj",
             "qwen3": "model.layers.0.mlp.gate_proj", "gemma3": "model.layers.0.mlp.gate_proj",
             "olmo2": "model.layers.0.mlp.gate_proj"}[family]
    assert placements[f"{first}.weight"] == f"(Shard(dim={out_dim}),)"
    if family in ("llama", "qwen2", "qwen3"):  # grouped-query attention: the key/value heads split like the query heads, an
        assert placements["model.layers.0.self_attn.k_proj.weight"] == "(Shard(dim=0),)"  # untied head
        assert placements["lm_head.weight"] == "(Shard(dim=0),)" and "model.embed_tokens.weight" in placements
    if family == "qwen2":  # each q/k/v bias split with its weight's rows: a rank adds its own heads' biases
        assert all(placements[f"model.layers.0.self_attn.{p}_proj.bias"] == "(Shard(dim=0),)" for p in "qkv")
    if family in ("qwen3", "gemma3"):  # the per-head norms whole on every rank (their gradients summed over the group:
        # the parity test above fails if each rank steps on its own heads' share), the projections at the query width
        # split; Gemma's four block norms whole too, its head tied to the vocabulary-split embedding
        assert {placements[f"model.layers.0.self_attn.{n}_norm.weight"] for n in "qk"} == {"(Replicate(),)"}
        assert placements["model.layers.0.self_attn.o_proj.weight"] == "(Shard(dim=1),)"
    if family == "gemma3":
        assert {placements[f"model.layers.0.{n}.weight"] for n in FAMILIES[family].block_norms} == {"(Replicate(),)"}
        assert placements["model.layers.0.self_attn.k_proj.weight"] == "(Shard(dim=0),)"
        assert "lm_head.weight" not in placements and placements["model.embed_tokens.weight"] == "(Shard(dim=0),)"
    if family == "olmo2":  # the q/k norms span all heads: each rank holds its heads' slice (the parity test above fails
        # if a rank normalises by its own slice's mean square); the norms after each sublayer stay whole
        assert {placements[f"model.layers.0.self_attn.{n}_norm.weight"] for n in "qk"} == {"(Shard(dim=0),)"}
        assert {placements[f"model.layers.0.{n}.weight"] for n in FAMILIES[family].block_norms} == {"(Replicate(),)"}


@pytest.mark.parametrize("name", ["gpt2-fp8", "llama-fp8"])
def test_the_split_float8_model_computes_as_the_whole_one(parity, name):
    """--fp8 under TP: the blocks' layers converted to torchao's Float8Linear before the split (run/float8.convert),
    then split as the plan says. With the same weights the first step's gradients equal the whole float8 model's: each
    float8 cast's scale is the whole tensor's (torchao reduces a sharded tensor's amax over the TP group), where a
    shard's own scale would move them by float8's rounding (~1e-2). Later steps stay within float8's rounding, which
    turns weights one fp32 ulp apart into neighbouring float8 values."""
    for rank in parity:
        got = rank[name]
        whole, split = got["losses"]
        assert got["float8_layers"] == ["Float8Linear"] and split[0] == whole[0] and got["grad_diff"] < 1e-6
        assert split == pytest.approx(whole, rel=1e-4)
        assert split != rank[name.removesuffix("-fp8")]["losses"][1]  # the casts are real (emulated: no speedup)
    # converted for fsdp_tp's float8 all-gather, every split weight keeps torchao's float8-gathering subclass - GPT-2's
    # fused QKV (a _StridedShard) too, which distribute_tensor alone hands back plain (tensor_parallel._distribute)
    gathering = parity[0][name]["float8_gathering"]
    assert len(gathering) == 4 * 2 and set(gathering) == {"WeightWithDynamicFloat8CastTensor"}
    spec = FAMILIES[name.removesuffix("-fp8")]
    for param, placed in parity[0][name]["placements"].items():  # the plan's split, in nn.Linear's layout (GPT-2's too)
        dim = spec.tp_split_dim(param, conv1d=False)
        assert placed == "(Replicate(),)" if dim is None else f"dim={dim}" in placed, param


@pytest.mark.parametrize("name", ["gpt2", "bloom", "llama", "qwen2", "qwen3", "gemma3", "olmo2", "gpt2-fp8",
                                  "llama-fp8"])
def test_a_split_models_whole_state_dict_reloads_into_its_slices(parity, name):
    """What tp and fsdp_tp checkpoints and resumes go through (full_state_dict, load_full_state_dict) restores every
    slice exactly - GPT-2 in float8 too, whose nn.Linear weights its state dict shows in Conv1D's layout."""
    assert all(rank[name]["reloaded_diff"] == 0.0 for rank in parity)


def test_fsdp_tp_gathers_and_reloads_a_weight_sharded_twice_along_one_dimension():
    """fsdp_tp's checkpoints on a 2 x 2 mesh (4 processes): GPT-2 in float8 keeps its fused QKV weight as nn.Linear's,
    split by TP and again by FSDP2 along its dimension 0. Its whole state dict equals the unsharded model's and reloads
    into the split slices exactly (tensor_parallel gathers one mesh dimension at a time: DTensor's one-call gather
    scrambled this weight, 0.1 off)."""
    got = probe("fsdp_tp_state_dict")
    assert got["qkv_placements"] == "(_StridedShard(dim=0, sf=2), _StridedShard(dim=0, sf=3))"
    assert got["saved_diff"] == 0.0 and got["reloaded_diff"] == 0.0


def test_tp_refuses_a_split_that_cuts_a_head():
    assert "does not divide the 4 attention heads" in tp_refusal(PRESETS["tiny"], 3)
    assert tp_refusal(PRESETS["tiny"], 4) is None and tp_refusal(PRESETS["bloom-7b1"], 8) is None
    # grouped-query attention: 8 key/value heads split over 8, not 16; 4 of TinyLlama's over 4 only
    assert tp_refusal(PRESETS["llama-3.1-8b"], 8) is None
    assert "does not divide the 8 key/value heads" in tp_refusal(PRESETS["llama-3.1-8b"], 16)
    assert "does not divide the 4 key/value heads" in tp_refusal(PRESETS["tinyllama-1.1b"], 8)


# ---- the strategies: tp and fsdp_tp through the Trainer --------------------------------------------------------------

def _losses(res) -> list[float]:
    return [h["loss"] for h in res["loss_history"]]


def _parity_with_ddp(res) -> None:
    """The same model as the parity suite's ddp run (same 8 samples a step), over PARITY_STEPS fp32 steps."""
    from conftest import PARITY_STEPS, parity_runs

    assert_trains_as(res, parity_runs()["runs"]["ddp"], PARITY_STEPS)


def _proves_the_plan(res, world: int, tp: int) -> None:
    """The start-up proof: every parameter the DTensor the plan's table says (none mismatched, all checked), the
    ranks of a TP group on one batch and the data-parallel groups on different ones, each rank's parameters the
    plan's TP slices (sharded further over the nodes under fsdp_tp)."""
    from hfscale.formulas.tensors import tp_local_tensors

    check = res["strategy_check"]
    assert check["world_size_torch"] == world and check["tensor_parallel"]["tp"] == tp
    assert check["tensor_parallel"]["mismatches"] == [] and check["tensor_parallel"]["checked"] == 28
    batches = [tuple(b) for b in check["first_batch_per_rank"]]
    groups = [batches[i:i + tp] for i in range(0, world, tp)]
    assert all(len(set(g)) == 1 for g in groups) and len({g[0] for g in groups}) == world // tp
    slices = sum(t.numel for t in tp_local_tensors(PRESETS["tiny"], tp))
    assert check["tensor_parallel"]["elements_tp_slices"] == slices
    local = check["parameters"]["elements_local"]
    assert local == slices if world == tp else slices / (world // tp) <= local <= 1.1 * slices / (world // tp)


def test_tp_in_float8_trains_as_ddp_and_proves_its_plan():
    """tp on one node of 2 processes, GPT-2 in float8 (--fp8, emulated: its Conv1D projections swapped for nn.Linear,
    converted, then split by the plan in nn.Linear's layout): each rank holds half of every split matrix, both see
    the same batch, every block layer trains in float8, and the run stays within 1e-3 of fp32 ddp (2 ranks x 4
    samples) over 20 steps, apart from it by float8's rounding. Tight fp32 parity under TP is test_llama's (tp) and
    fsdp_tp's below; the split float8 model's gradients equal the whole one's in the probe above."""
    from conftest import PARITY_STEPS, parity_runs, tp_fp8_run

    res = tp_fp8_run()
    assert res["strategy"] == "tp" and res["config"]["world_size"] == 2
    _proves_the_plan(res, world=2, tp=2)
    assert_figures_count_the_loaders(res)  # one TP group of 2 ranks: DP 1, the 8 samples of one batch per step
    assert res["config"]["dp"] == 1 and "  DP 1 · TP 2 · MBS 8" in res["_stdout"]
    proof = res["strategy_check"]["float8"]
    assert proof["float8_linears"] == res["model"]["n_layer"] * 4 and proof["high_precision"] == ["lm_head"]
    assert not proof["float8_all_gather"] and res["config"]["float8"] == "tensorwise"
    ours = _losses(res)
    theirs = _losses(parity_runs()["runs"]["ddp"])
    assert len(ours) == len(theirs) == PARITY_STEPS
    gaps = [abs(a / b - 1) for a, b in zip(ours, theirs)]
    assert max(gaps) < 1e-3 and max(gaps) > 1e-6, gaps


def test_fsdp_tp_on_two_nodes_trains_as_ddp_and_proves_its_plan():
    """fsdp_tp on 2 "nodes" x 2 processes: TP inside a node, FSDP2 sharding each TP slice over the nodes; the job
    matches ddp within 1e-4 over 20 fp32 steps."""
    from conftest import fsdp_tp_job

    res = fsdp_tp_job()
    assert res["strategy"] == "fsdp_tp" and res["environment"]["nodes"] == 2
    _proves_the_plan(res, world=4, tp=2)
    assert_figures_count_the_loaders(res)
    assert res["config"]["dp"] == 2
    _parity_with_ddp(res)


def test_a_fsdp_tp_run_projects_as_fsdp_tp_at_its_tp_degree(capsys):
    """`hfscale project` of the 2-node fsdp_tp job: FSDP2's collectives run over the data-parallel ranks (one a node) and
    move each rank's TP slices; TP's own all-reduces stay in the measured micro-batch, so the run projects only as TP
    strategies at its own TP degree (a node's processes) - its own point coming back as measured - and anything else
    is refused in one line."""
    from conftest import fsdp_tp_job
    from hfscale.errors import HfscaleError
    from hfscale.formulas.memory import DTYPE_BYTES
    from hfscale.plan import project
    from hfscale.plan.baseline import baseline_from_results
    from hfscale.plan.projection import pattern_of

    res = fsdp_tp_job()
    results = Path(res["output_dir"]) / "results.json"
    base = baseline_from_results(results)
    plan = base.plan
    assert (plan.tp, plan.data_parallel_size, plan.shard_ranks) == (2, 2, 2)
    # the blocks' gathers per micro-batch are the TP slices FSDP2 shards: what the estimate (checked against the live
    # engine, test_multiprocess.py) holds per rank, times the data-parallel ranks
    gathers = [c for c in pattern_of(plan).collectives if c.kind == "all_gather" and c.per == "micro"]
    element = DTYPE_BYTES[plan.dtypes.parameters]
    gathered = sum(c.size_bytes for c in gathers if "backward" not in c.what) / element  # blocks and root units
    assert gathered == pytest.approx(plan.memory().parameters / element * plan.data_parallel_size, rel=0.02)
    project.main([str(results), "--gpus", "2,4,8,16", "--gpus_per_node", "2", "--json"])
    points = {p["gpus"]: p for p in json.loads(capsys.readouterr().out)["points"]}
    assert set(points) == {4, 8, 16} and {p["strategy"] for p in points.values()} == {"fsdp_tp"}  # 2: below 2 nodes
    assert points[4]["s_per_iter"] == pytest.approx(res["perf"]["s_per_iter"], rel=1e-6)
    assert points[16]["tokens_per_s"] / 16 < points[4]["tokens_per_s"] / 4  # more ranks to gather from
    project.main([str(results), "--gpus", "4,8", "--gpus_per_node", "2", "--strategy", "all", "--json"])
    everything = json.loads(capsys.readouterr().out)["points"]
    assert {p["strategy"] for p in everything if not p["layout"]} == {"fsdp_tp"}  # and the megatron layouts
    with pytest.raises(HfscaleError, match="^ddp from a fsdp_tp run: its micro-batch holds TP's split compute"):
        project.main([str(results), "--gpus", "4,8", "--gpus_per_node", "2", "--strategy", "ddp,fsdp_tp"])
    with pytest.raises(HfscaleError, match="TP degree is its 2 processes per node.*--gpus_per_node 2$"):
        project.main([str(results), "--gpus", "8,16"])


@pytest.mark.parametrize("strategy", ["tp", "fsdp_tp"])
def test_tp_checkpoint_resumes_exactly(tmp_path, strategy):
    """A run resumed from its step-10 checkpoint (whole weights and optimizer states, each rank taking its slices
    again) continues with exactly the losses of the uninterrupted one, and ends on the same weights. tp's is the
    float8 run: GPT-2's converted layers hold nn.Linear weights that its checkpoint keeps in Conv1D's layout, the
    fused QKV one a _StridedShard (test_llama.py resumes a killed tp run in fp32)."""
    from conftest import PARITY_STEPS, TINY, TP_SAVE_STEP, fake_slurm_bin, fsdp_tp_job, slurm_train, tp_fp8_run, train

    if strategy == "tp":
        full = tp_fp8_run()
        checkpoint = f"{full['output_dir']}/checkpoint-{TP_SAVE_STEP}"
        resumed = train(tmp_path / "resumed", "tp", "--fp8", "--fp8_emulate", "--per_device_train_batch_size", "8",
                        "--fingerprint_weights", "--resume_from_checkpoint", checkpoint, steps=PARITY_STEPS)
    else:
        full = fsdp_tp_job()
        checkpoint = f"{full['output_dir']}/checkpoint-{TP_SAVE_STEP}"
        resumed = slurm_train(fake_slurm_bin(tmp_path / "bin"), tmp_path, "fsdp_tp", 2, 2,
                              [*TINY, "--max_steps", str(PARITY_STEPS), "--output_dir", str(tmp_path / "resumed"),
                               "--resume_from_checkpoint", checkpoint])
    assert resumed["resumed_from"] == checkpoint
    assert [p["step"] for p in resumed["loss_history"]] == list(range(1, PARITY_STEPS + 1))
    assert _losses(resumed) == _losses(full)
    if strategy == "tp":
        assert resumed["final_weights"] == full["final_weights"]


def test_tp_refuses_phi3s_fused_projections_while_megatrons_layouts_plan_them():
    """hfscale's TP splits whole projections; Phi-3's fused q/k/v and gate/up would split per part, so tp and fsdp_tp
    refuse it in one line before anything starts, while a Megatron layout (its fused QKV split by heads) plans it, each
    rank holding 1/TP of those matrices."""
    phi4 = PRESETS["phi-4"]
    assert tp_refusal(phi4, 1) is None
    assert tp_refusal(phi4, 2).startswith("Phi-3: its fused qkv_proj and gate_up_proj would split per part")
    assert p3d.grid_refusal(phi4, p3d.Grid(tp=2, dp=4), 8) is None
    whole = {t.name: t.numel for t in tp_local_tensors(phi4, 1)}
    split = {t.name: t.numel for t in tp_local_tensors(phi4, 2)}
    for name in ("model.layers.0.self_attn.qkv_proj.weight", "model.layers.0.mlp.gate_up_proj.weight"):
        assert split[name] * 2 == whole[name]
