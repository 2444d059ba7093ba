"""Baseline for measure_overhead.py: the same model, data and TrainingArguments through HF's plain `Trainer`.

No hfscale Trainer subclass, no start-up proofs, no measurement; writes `{"train_runtime": s}` to
<output_dir>/plain.json. Run it as `python benchmarks/plain_trainer.py --model tiny --max_steps 100 ...`.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from transformers import HfArgumentParser, Trainer, TrainingArguments, default_data_collator, set_seed  # noqa: E402

from hfscale.run.args import DataArguments, ModelArguments  # noqa: E402
from hfscale.files import atomic_write_text  # noqa: E402
from hfscale.models import resolve_seq_len  # noqa: E402
from hfscale.run.construction import build, load_data  # noqa: E402


def main() -> None:
    model_args, data_args, args = HfArgumentParser((ModelArguments, DataArguments, TrainingArguments)).parse_args_into_dataclasses()
    if args.deepspeed and args.use_cpu:  # DeepSpeed's CPU accelerator would JIT-build an inference-only kernel
        from hfscale.parallel.distributed import skip_deepspeed_shm_kernel  # (~35 s); hfscale's CPU route skips it too

        skip_deepspeed_shm_kernel()
    shape = model_args.shape()
    seq_len = resolve_seq_len(shape, data_args.seq_len)
    set_seed(args.seed)
    tokenizer, blocks, _ = load_data(model_args, data_args, args, shape.vocab, seq_len, validation=None)
    model = build(model_args, args, shape, tokenizer)
    trainer = Trainer(model=model, args=args, train_dataset=blocks, data_collator=default_data_collator)
    metrics = trainer.train().metrics
    atomic_write_text(os.path.join(args.output_dir, "plain.json"), json.dumps(metrics))


if __name__ == "__main__":
    main()
