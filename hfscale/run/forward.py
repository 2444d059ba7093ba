"""The model's forward in training: no KV cache, and optionally the fused linear cross-entropy.

**No KV cache.** transformers' GPT-2, BLOOM and Llama build a key/value cache in every forward unless told not to (their
config's `use_cache` is true for generation): every layer's keys and values are copied into it, 2·b·s·h elements
per layer that nothing in training reads, about 7% of what a GPT-2 step keeps. A training forward here passes
`use_cache=False` (the model's config is untouched: a saved or exported model generates with its cache as before).

**The loss alone.** A training forward with labels returns the loss and nothing else: the Trainer reads only the
loss, and the b·s·V logits the model also returns cost twice over. accelerate's mixed precision converts every
floating output of the model to fp32 (`convert_outputs_to_fp32`: a 4-byte copy of the logits, 1.65 GB at 350M,
micro-batch 8); and under torch.compile an output the loss does not use still gets a gradient - AOTAutograd hands the
backward a zero tensor of its shape, which the first backward kernel reads. With the loss alone, hfscale's compiled
step costs the device what the same step written by hand does (docs/metrics.md; benchmarks/results/h200_2026-11-27/).
Evaluation (the model in eval mode) and calls without labels get the model's own output, logits included.

**The fused linear cross-entropy** (`--fused_linear_cross_entropy`): the language-model head and its loss in one step
that never holds the whole logits. HF's GPT-2/BLOOM compute logits = hidden @ W^T for every token (b·s·V, GPT-2's V =
50257, BLOOM's 250880), upcast them to fp32 and keep log-softmax's fp32 output for the backward; the backward's first
op then holds the logits' fp32 gradient beside it. At BLOOM's vocabulary that is the largest activation of the step.
Here the tokens are taken a chunk at a time in the forward: a chunk's logits, their log-sum-exp, and at once their
gradient (softmax minus the target's one-hot), multiplied into the hidden states' and the head's gradients. The
backward only scales those two by the incoming gradient. The same matmuls as the unfused head (no recomputation);
what stays between the forward and the backward is the hidden states' gradient (b·s·h) and the head's (V·h, fp32),
not b·s·V. This is the method of Liger-Kernel's FusedLinearCrossEntropy (Hsu et al. 2024), written with torch ops so
that it runs on every device and under every engine hfscale drives but tensor parallelism (its head splits the
vocabulary). The loss is transformers' ForCausalLMLoss: labels shifted left, -100 ignored, the sum over the
micro-batch's tokens divided by the Trainer's `num_items_in_batch` when it passes one, else the mean.
"""

import functools
import types

import torch
from transformers.modeling_outputs import CausalLMOutputWithCrossAttentions

from ..formulas.activations import chunk_tokens

IGNORE_INDEX = -100


def _compute_dtype(device_type: str, dtype: torch.dtype) -> torch.dtype:
    """What the head's matmul computes in: autocast's dtype when autocast is on (as nn.Linear would), else the
    weights' own."""
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else dtype


class LinearCrossEntropy(torch.autograd.Function):
    """sum over tokens t with target[t] != -100 of cross_entropy(hidden[t] @ weight^T, target[t]), with the gradients
    of `hidden` and `weight` computed chunk by chunk in the forward."""

    @staticmethod
    def forward(ctx, hidden, weight, target, chunk, train):
        compute = _compute_dtype(hidden.device.type, weight.dtype)
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(compute)
            grad_hidden = torch.empty(hidden.shape if train else 0, dtype=compute, device=hidden.device)
            grad_weight = torch.zeros(weight.shape if train else 0, dtype=torch.float32, device=weight.device)
            loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
            for start in range(0, hidden.shape[0], chunk):
                h, t = hidden[start:start + chunk].to(compute), target[start:start + chunk]
                logits = (h @ w.t()).float()
                keep = t != IGNORE_INDEX
                safe = torch.where(keep, t, 0).unsqueeze(1)
                lse = torch.logsumexp(logits, dim=1)
                loss += ((lse - logits.gather(1, safe).squeeze(1)) * keep).sum()
                if not train:
                    continue
                grad = logits.sub_(lse.unsqueeze(1)).exp_()  # softmax, in the logits' own storage
                grad.scatter_add_(1, safe, torch.full_like(safe, -1, dtype=grad.dtype))
                grad = grad.mul_(keep.unsqueeze(1)).to(compute)
                grad_hidden[start:start + chunk] = grad @ w
                if compute == torch.float32:
                    grad_weight.addmm_(grad.t(), h)
                else:  # torch has no bf16 x bf16 -> fp32 addmm on every device: the product, then the fp32 sum
                    grad_weight.add_(grad.t() @ h)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.dtypes = hidden.dtype, weight.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = ctx.saved_tensors
        hidden_dtype, weight_dtype = ctx.dtypes
        return (grad_hidden * grad_loss).to(hidden_dtype), (grad_weight * grad_loss).to(weight_dtype), None, None, None


def causal_lm_loss(hidden, weight, labels, num_items_in_batch=None):
    """transformers' ForCausalLMLoss of the logits hidden @ weight^T, without the logits: hidden (b, s, h), labels
    (b, s) unshifted."""
    target = torch.nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:].reshape(-1)
    flat = hidden.reshape(-1, hidden.shape[-1])
    # evaluation (no autograd) computes the loss alone: no gradient buffers
    train = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    total = LinearCrossEntropy.apply(flat, weight, target, chunk_tokens(flat.shape[0], weight.shape[0], weight.shape[1]),
                                     train)
    if num_items_in_batch is not None:
        return total / (num_items_in_batch.to(total.device) if torch.is_tensor(num_items_in_batch) else num_items_in_batch)
    return total / (target != IGNORE_INDEX).sum()


def _head_forward(head, hidden, labels=None, num_items_in_batch=None):
    """The head's forward: its logits (its class's own forward), or with `labels` the fused loss. The loss runs inside
    the head's own call so that every engine's hooks on it run as for the logits (ZeRO-3 gathers the tied weight)."""
    if labels is None:
        return type(head).forward(head, hidden)
    return causal_lm_loss(hidden, head.weight, labels, num_items_in_batch)


def use_training_forward(model, fused_linear_cross_entropy: bool = False):
    """Make `model` (a GPT-2 or BLOOM causal LM) compute its loss without a KV cache, and with the fused linear
    cross-entropy if asked; in training, return the loss alone. A call without labels (generation, a request for
    logits) is the model's own forward.
    The forward keeps the model's signature (the Trainer reads it). Returns the model."""
    own = type(model).forward
    if fused_linear_cross_entropy:
        head = model.get_output_embeddings()
        if head is None or head.bias is not None:
            raise ValueError(f"{type(model).__name__}: the fused loss needs a bias-free language-model head")
        head.forward = types.MethodType(_head_forward, head)

    @functools.wraps(own)
    def forward(self, *args, labels=None, **kwargs):
        if labels is None:
            return own(self, *args, **kwargs)
        kwargs["use_cache"] = False
        if not fused_linear_cross_entropy:
            out = own(self, *args, labels=labels, **kwargs)
            return CausalLMOutputWithCrossAttentions(loss=out.loss) if self.training else out  # the loss alone
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        kwargs.pop("logits_to_keep", None)
        hidden = self.base_model(*args, **kwargs)[0]
        return CausalLMOutputWithCrossAttentions(loss=self.get_output_embeddings()(hidden, labels, num_items_in_batch))

    model.forward = types.MethodType(forward, model)
    return model
