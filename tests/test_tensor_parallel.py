"""hfscale's tensor-parallel plan (hfscale/parallel/tensor_parallel.py) on a real 2-process TP mesh (gloo): the split
models train exactly as the whole ones, every parameter is the DTensor the plan says, and each rank holds what the 3D
memory formula (formulas/parallel3d.stage_parameters) counts."""

import pytest

from conftest import probe
from hfscale.formulas import parallel3d as p3d
from hfscale.models import PRESETS
from hfscale.parallel.tensor_parallel import PLANS, tp_refusal

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def parity() -> dict:
    return probe("tensor_parallel_parity")["ranks"]


@pytest.mark.parametrize("family,preset", [("gpt2", "tiny"), ("bloom", "tiny-bloom")])
def test_the_split_model_trains_as_the_whole_one(parity, family, preset):
    for rank in parity:
        got = rank[family]
        whole, split = got["losses"]
        assert split == pytest.approx(whole, abs=1e-5)  # 3 AdamW steps with clipping, the same batches
        assert got["grad_diff"] < 1e-6 and got["weight_diff"] < 1e-4
        assert got["norms"][1] == pytest.approx(got["norms"][0], rel=1e-4)  # clipping sees every shard once
    # each rank holds 1/TP of the split matrices and all of the rest: what the 3D memory formula counts
    shape = PRESETS[preset]
    assert parity[0][family]["local_numel"] == p3d.stage_parameters(shape, p3d.Grid(tp=2), 0)
    assert parity[0][family]["local_numel"] < parity[0][family]["whole_numel"]


@pytest.mark.parametrize("family", ["gpt2", "bloom"])
def test_every_parameter_is_the_dtensor_the_plan_says(parity, family):
    placements = parity[0][family]
    placements = placements["placements"]
    split = {name: style for name, style in PLANS[family].items()}
    for name, placed in placements.items():
        module = next((m for m in split if f".{m}." in name), None)
        if name.endswith(("wte.weight", "word_embeddings.weight")):
            assert placed == "(Shard(dim=0),)", name  # by vocabulary rows, with the LM head tied to it
        elif module is None:
            assert placed == "(Replicate(),)", name  # position table, LayerNorms
        elif name.endswith(".bias") and split[module] == "rowwise":
            assert placed == "(Replicate(),)", name  # added once, after the partial sums are reduced
        elif split[module] == "colwise_fused3":  # GPT-2's [q | k | v]: each of the three split, [q_r | k_r | v_r]
            assert "_StridedShard" in placed and "sf=3" in placed, name
        else:
            assert placed.startswith("(Shard(dim="), name
    # GPT-2's Conv1D is [in, out], so its column split is dim 1; BLOOM's nn.Linear is [out, in]: dim 0
    out_dim = 1 if family == "gpt2" else 0
    first = "mlp.c_fc" if family == "gpt2" else "mlp.dense_h_to_4h"
    assert placements[f"transformer.h.0.{first}.weight"] == f"(Shard(dim={out_dim}),)"


def test_tp_refuses_a_split_that_cuts_a_head():
    assert "does not divide the 4 attention heads" in tp_refusal(PRESETS["tiny"], 3)
    assert tp_refusal(PRESETS["tiny"], 4) is None and tp_refusal(PRESETS["bloom-7b1"], 8) is None
