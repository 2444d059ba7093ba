"""How long building a preset's freshly initialised model takes: hfscale's build_model (transformers' initialisation,
each weight drawn once) against the model class's own constructor (the constructors' draws, then post_init's, the
tied head's too), alternated in one process so both see the same machine.

    python benchmarks/model_build.py --model gpt2-350m,gpt2-1.3b,bloom-560m --repeats 2
"""

import argparse
import gc
import time

import torch
from transformers import BloomForCausalLM, GPT2LMHeadModel

from hfscale.models import PRESETS, build_model, hf_config


def constructed(shape, seed):
    torch.manual_seed(seed)
    return (GPT2LMHeadModel if shape.family == "gpt2" else BloomForCausalLM)(hf_config(shape))


def seconds(build, shape) -> float:
    gc.collect()
    start = time.perf_counter()
    model = build(shape, 0)
    elapsed = time.perf_counter() - start
    del model
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2-350m,bloom-560m", help="comma-separated presets")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    print(f"torch threads: {torch.get_num_threads()}")
    print("| model | layers x hidden | constructor (s) | build_model (s) | saved |\n|---|---|---|---|---|")
    for name in args.model.split(","):
        shape = PRESETS[name]
        times = {"constructor": [], "build_model": []}
        for _ in range(args.repeats):
            times["constructor"].append(seconds(constructed, shape))
            times["build_model"].append(seconds(build_model, shape))
        old, new = min(times["constructor"]), min(times["build_model"])
        print(f"| {name} | {shape.n_layer}x{shape.hidden} | {old:.2f} | {new:.2f} | {1 - new / old:.0%} |", flush=True)


if __name__ == "__main__":
    main()
