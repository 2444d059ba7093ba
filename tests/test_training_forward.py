"""hfscale's training forward (hfscale/run/forward.py): no KV cache, and the fused linear cross-entropy - transformers'
own loss and gradients, under an engine that shards the tied head, without the b x s x vocab logits."""

import copy
from pathlib import Path

import pytest
import torch
from transformers.loss.loss_utils import ForCausalLMLoss

from conftest import parity_runs, train
from hfscale.formulas.activations import chunk_tokens
from hfscale.models import PRESETS, build_model
from hfscale.run.forward import causal_lm_loss, use_training_forward

# (weights' dtype, autocast to bf16, relative tolerance of the gradients): float32 to the rounding of a sum in another
# order; bf16 to bf16's own rounding of the logits' gradient, which both sides round
PRECISIONS = [(torch.float32, False, 1e-5), (torch.float32, True, 2e-2), (torch.bfloat16, False, 2e-2)]


@pytest.mark.parametrize("dtype,autocast,tol", PRECISIONS)
@pytest.mark.parametrize("num_items_in_batch", [None, 200])
def test_the_fused_loss_and_its_gradients_are_transformers(dtype, autocast, tol, num_items_in_batch):
    """Against the logits' path the Trainer runs (the head's matmul, then ForCausalLMLoss): labels shifted, -100
    ignored, mean or sum / num_items_in_batch; over many chunks (vocab / hidden = 32 of them)."""
    torch.manual_seed(0)
    b, s, h, v = 4, 64, 32, 1000
    assert chunk_tokens(b * s, v, h) < b * s  # the loop runs over several chunks
    hidden = torch.randn(b, s, h, dtype=dtype, requires_grad=True)
    weight = torch.randn(v, h, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, v, (b, s))
    labels[0, :10] = labels[2, 30:] = -100
    nib = None if num_items_in_batch is None else torch.tensor(num_items_in_batch)
    results = []
    for loss_of in (lambda: ForCausalLMLoss(hidden @ weight.t(), labels, v, num_items_in_batch=nib),
                    lambda: causal_lm_loss(hidden, weight, labels, nib)):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_of()
        results.append((loss.detach(), *torch.autograd.grad(loss, (hidden, weight))))
    (ref, ref_h, ref_w), (got, got_h, got_w) = results
    assert got.item() == pytest.approx(ref.item(), rel=1e-6)  # the loss itself is fp32 on both sides
    assert got_h.dtype == ref_h.dtype and got_w.dtype == ref_w.dtype
    for mine, theirs in ((got_h, ref_h), (got_w, ref_w)):
        assert ((mine - theirs).abs().max() / theirs.abs().max()).item() < tol


def test_evaluation_computes_the_loss_alone():
    torch.manual_seed(0)
    hidden, weight = torch.randn(2, 16, 8, requires_grad=True), torch.randn(300, 8, requires_grad=True)
    labels = torch.randint(0, 300, (2, 16))
    with torch.no_grad():  # the Trainer's evaluation: parameters that require gradients, no autograd
        assert causal_lm_loss(hidden, weight, labels).item() == pytest.approx(
            ForCausalLMLoss(hidden @ weight.t(), labels, 300).item(), rel=1e-6)


@pytest.mark.parametrize("preset", ["tiny", "tiny-bloom", "tiny-llama"])
def test_the_training_forward_keeps_no_kv_cache_and_generation_is_unchanged(preset):
    """With labels: the model's own loss and gradients, without the cache transformers builds by default (and with
    the fused loss, no logits - its head Llama's own, untied); without labels (generation) the model's own forward,
    cache included."""
    torch.manual_seed(0)
    model = build_model(PRESETS[preset], seed=0, attn_implementation="eager")
    ids = torch.randint(0, PRESETS[preset].vocab, (2, 48))
    plain, fused = use_training_forward(copy.deepcopy(model)), use_training_forward(copy.deepcopy(model), True)
    outputs = [m(input_ids=ids, labels=ids) for m in (model, plain, fused)]
    assert outputs[0].cache is not None  # transformers' default: a cache in every forward, training included
    assert outputs[1].cache is None and outputs[2].cache is None
    assert outputs[0].logits is not None and outputs[1].logits is None and outputs[2].logits is None  # the loss alone
    for out in outputs:
        out.loss.backward()
    assert outputs[1].loss.item() == outputs[0].loss.item()
    assert outputs[2].loss.item() == pytest.approx(outputs[0].loss.item(), rel=1e-6)
    for other in (plain, fused):
        for (name, p), q in zip(model.named_parameters(), other.parameters()):
            assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-7), name
    model.eval(), plain.eval(), fused.eval()
    with torch.no_grad():  # evaluation with labels: the model's own output, logits included
        assert torch.equal(plain(input_ids=ids, labels=ids).logits, model(input_ids=ids, labels=ids).logits)
    prompt = ids[:1, :8]
    assert torch.equal(fused.generate(prompt, max_new_tokens=6, do_sample=False),
                       model.generate(prompt, max_new_tokens=6, do_sample=False))
    assert fused.config.use_cache == model.config.use_cache  # a saved model generates as before


def test_a_compiled_training_step_hands_its_backward_no_logits_gradient():
    """What a bf16 run on a GPU compiles: the training forward under accelerate's mixed precision, which converts every
    output of the model to fp32. An output the loss does not use still gets a gradient under torch.compile (AOTAutograd
    passes the backward a zero tensor of its shape); with the model's logits returned that was a b x s x V fp32 tensor
    per step, read by the backward's first kernel (2 ms of a 58 ms 350M step on an H200). The training forward returns
    the loss alone: the backward's only incoming gradient is the loss's."""
    import types

    from accelerate.utils import convert_outputs_to_fp32
    from torch._dynamo.backends.common import aot_autograd

    torch.manual_seed(0)
    shape = PRESETS["tiny"]
    b, s = 2, 32
    model = use_training_forward(build_model(shape, seed=0, attn_implementation="sdpa"))
    model.train()
    autocast = torch.autocast("cpu", dtype=torch.bfloat16)  # as accelerate's prepare_model wraps it, then compiles
    model.forward = types.MethodType(convert_outputs_to_fp32(autocast(model.forward.__func__)), model)
    incoming = []

    def backward_compiler(graph, example_inputs):
        incoming.extend(tuple(n.meta["val"].shape) for n in graph.graph.nodes
                        if n.op == "placeholder" and n.name.startswith("tangents"))
        return graph.forward

    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend=aot_autograd(fw_compiler=lambda g, _: g.forward,
                                                            bw_compiler=backward_compiler))
        ids = torch.randint(0, shape.vocab, (b, s))
        compiled(input_ids=ids, labels=ids).loss.backward()
    finally:
        torch._dynamo.reset()
    assert incoming == [()], incoming  # the loss's gradient alone: no (b, s, V) tensor
    assert all(p.grad is not None for p in model.parameters())


def test_the_fused_loss_trains_zero3_as_the_unfused_head_does(tmp_path):
    """Two ZeRO-3 processes, the tied head partitioned and gathered by DeepSpeed's hooks for the loss: the same 20
    losses and final weights as the parity check's zero3 run (the same flags without the fused loss), to parity's own
    tolerance."""
    from hfscale.compare.parity import compare
    from hfscale.run.results import read_results

    reference = parity_runs()
    fused = train(tmp_path / "fused", "zero3", "--include_num_input_tokens_seen", "true", "--fingerprint_weights",
                  "--fused_linear_cross_entropy", steps=20)
    assert fused["config"]["fused_linear_cross_entropy"] is True and fused["run_name"].endswith("-flce")
    verdict = compare(read_results(Path(reference["folder"]) / "zero3"), read_results(tmp_path / "fused"), "zero3",
                      "adamw", tolerance=1e-4, lossy_tolerance=None)
    assert verdict.verdict == "pass" and verdict.steps == 20, verdict


@pytest.mark.parametrize("strategy", ["tp", "fsdp_tp"])
def test_tensor_parallel_refuses_the_fused_loss_up_front(strategy, monkeypatch):
    """Their head splits the vocabulary (and hfscale gathers their logits for the loss): refused before anything runs,
    in the run and in the planners."""
    from hfscale.errors import HfscaleError
    from hfscale.parallel.optimizers import get_optimizer
    from hfscale.parallel.strategies import get_strategy
    from hfscale.runplan import RunPlan
    from hfscale.train import check_args

    nodes = 2 if strategy == "fsdp_tp" else 1
    monkeypatch.setenv("WORLD_SIZE", str(2 * nodes))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # 2 processes per node, as a launcher sets them
    with pytest.raises(HfscaleError, match="--fused_linear_cross_entropy is not built for a tensor-parallel head"):
        check_args(["--strategy", strategy, "--fused_linear_cross_entropy"])
    plan = RunPlan(get_strategy(strategy), get_optimizer("adamw"), PRESETS["tiny"], 64, world_size=2 * nodes,
                   processes_per_node=2, fused_linear_cross_entropy=True)
    assert "tensor-parallel head" in plan.refusal()
