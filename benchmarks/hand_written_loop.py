"""Baseline for measure_overhead.py: the same model, data and optimizer trained by a loop written by hand.

No Trainer, no accelerate, no hfscale code in the loop: a torch DataLoader over the same packed blocks (the Trainer's
collator, sequential order), torch's AdamW with the TrainingArguments' values and their schedule, gradient
clipping, zero_grad(set_to_none), and the forward hfscale's training step runs (no KV cache). What hfscale's run
takes per step beyond it is host work (the Trainer's loop, accelerate's wrappers, hfscale's callbacks, the data
path): the part a host-bound GPU step (350M compiled on an H100, benchmarks/results/h100_2026-11-26b/record.md) pays
in full. Writes `{"train_runtime": s}` (the
loop over max_steps, as the Trainer times its own) to <output_dir>/hand.json.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from transformers import HfArgumentParser, TrainingArguments, default_data_collator, get_scheduler, set_seed  # noqa: E402

from hfscale.files import atomic_write_text  # noqa: E402
from hfscale.models import resolve_seq_len  # noqa: E402
from hfscale.run.args import DataArguments, ModelArguments  # noqa: E402
from hfscale.run.construction import build, load_data  # noqa: E402


def main() -> None:
    model_args, data_args, args = HfArgumentParser((ModelArguments, DataArguments, TrainingArguments)).parse_args_into_dataclasses()
    shape = model_args.shape()
    seq_len = resolve_seq_len(shape, data_args.seq_len)
    set_seed(args.seed)
    tokenizer, blocks, _ = load_data(model_args, data_args, args, shape.vocab, seq_len, validation=None)
    model = build(model_args, args, shape, tokenizer)
    model.train()
    loader = torch.utils.data.DataLoader(blocks, batch_size=args.per_device_train_batch_size, shuffle=False,
                                         collate_fn=default_data_collator, drop_last=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2),
                                  eps=args.adam_epsilon, weight_decay=args.weight_decay)
    scheduler = get_scheduler(args.lr_scheduler_type, optimizer, num_warmup_steps=args.get_warmup_steps(args.max_steps),
                              num_training_steps=args.max_steps)
    step, start = 0, time.perf_counter()
    while step < args.max_steps:
        for batch in loader:
            loss = model(**batch, use_cache=False).loss
            loss.backward()
            if args.max_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step == args.max_steps:
                break
    runtime = time.perf_counter() - start
    os.makedirs(args.output_dir, exist_ok=True)
    atomic_write_text(os.path.join(args.output_dir, "hand.json"), json.dumps({"train_runtime": runtime,
                                                                              "last_loss": loss.detach().item()}))


if __name__ == "__main__":
    main()
