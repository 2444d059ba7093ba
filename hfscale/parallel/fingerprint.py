"""What parity and export compare: every weight's fingerprint, gathered from whatever shards it, and the logits of a
fixed probe input. Collective where the model is sharded (every rank must call them)."""


def weights_fingerprint(model, engine: str) -> dict:
    """{parameter name: [sum, L1 norm, L2 norm]} of the full (gathered) weights, identical on every rank.

    Collective: every rank must call it. Used to prove that strategies end with the same weights.
    """
    import contextlib

    import torch

    params = list(model.named_parameters())
    gather = contextlib.nullcontext()
    if engine == "deepspeed" and any(hasattr(p, "ds_tensor") for _, p in params):
        import deepspeed

        gather = deepspeed.zero.GatheredParameters([p for _, p in params])
    out = {}
    with gather, torch.no_grad():
        for name, p in params:
            full = (p.full_tensor() if hasattr(p, "full_tensor") else p).double()
            out[name] = [full.sum().item(), full.abs().sum().item(), full.norm().item()]
    return out


PROBE_TOKENS = 16


def probe_ids(vocab: int):
    """A fixed input for comparing a training model with its exported copy."""
    import torch

    return (torch.arange(PROBE_TOKENS) * 7919 % vocab).unsqueeze(0)


def probe_logits(model, vocab: int, device) -> list[float]:
    """Logits of the first 4 positions x 8 vocabulary entries for probe_ids, in fp32. Collective under ZeRO-3/FSDP
    (every rank must call it: the forward gathers the sharded parameters)."""
    import torch

    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=probe_ids(vocab).to(device)).logits
    model.train(was_training)
    return logits[0, :4, :8].float().flatten().tolist()
