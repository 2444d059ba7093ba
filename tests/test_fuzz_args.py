"""Fuzz the training command line: whatever argv a user types, hfscale either accepts it or refuses it with an
HfscaleError (one line, exit 2) - never another exception, which would reach the user as a traceback."""

from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import REPO, restored_environment
from hfscale.errors import HfscaleError

NAMES = {
    "--strategy": ["ddp", "ddp_powersgd", "fsdp", "fsdp_offload", "zero1", "zero2", "zero2_offload", "zero3",
                   "zero3_offload"],
    "--optim": ["adamw", "adafactor", "adamw_8bit", "adamw_torch", "sgd"],
    "--model": ["tiny", "tiny-bloom", "tiny-llama", "tiny-qwen3", "gpt2-124m", "bloom-560m", "bigscience-104b", "gpt5"],
    "--lr_scheduler_type": ["linear", "cosine", "constant", "bogus"],
    "--resume_from_checkpoint": ["latest", "/nonexistent/checkpoint-3"],
    "--deepspeed": ["ds_configs/zero1.json", "ds_configs/zero3.json", "/nonexistent.json"],
    "--train_files": ["/nonexistent/a.txt", "README.md"],
    "--model_name_or_path": ["/nonexistent/model"],
    "--report_to": ["none", "tensorboard", "tensorboard,none"],
}
NUMBERS = ["--n_layer", "--hidden_size", "--n_head", "--num_key_value_heads", "--head_dim", "--ffn_hidden_size",
           "--vocab_size", "--seq_len",
           "--per_device_train_batch_size", "--gradient_accumulation_steps", "--global_batch_size", "--max_steps",
           "--powersgd_rank", "--powersgd_warmup_steps", "--logging_steps", "--save_steps", "--perf_warmup_steps",
           "--token_budget", "--peak_tflops", "--learning_rate", "--dropout", "--default_tokenizer_vocab"]
SWITCHES = ["--bf16", "--fp16", "--activation_checkpointing", "--measure", "--record_batches", "--overwrite_output_dir",
            "--count_host_syncs"]

# Mostly well-formed values, so that most command lines get past the parser into the checks behind it (sizes,
# pairs, files); some malformed ones and stray tokens for the parser itself.
number = st.one_of(st.integers(-2, 8), st.integers(-2, 8), st.integers(-3, 5000),
                   st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True)).map(str)
value_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12)


def sometimes_junk(values):
    return st.one_of(*[values] * 5, value_text)


@st.composite
def argv(draw) -> list[str]:
    out: list[str] = []
    for _ in range(draw(st.integers(0, 7))):
        kind = draw(st.sampled_from(["name"] * 3 + ["number"] * 4 + ["switch"] * 2 + ["junk"]))
        if kind == "name":
            flag = draw(st.sampled_from(sorted(NAMES)))
            out += [flag, draw(sometimes_junk(st.sampled_from(NAMES[flag])))]
        elif kind == "number":
            out += [draw(st.sampled_from(NUMBERS)), draw(sometimes_junk(number))]
        elif kind == "switch":
            out += [draw(st.sampled_from(SWITCHES)), *draw(st.sampled_from([[], [], ["true"], ["false"], ["maybe"]]))]
        else:
            out.append(draw(value_text.filter(lambda t: t not in ("-h", "--help"))))
    return out


@pytest.fixture()
def offline_parser(monkeypatch):
    """check_args (pure), then the TrainingArguments built from what it returns - without the process-group set-up
    that only a launched run needs - so transformers' own checks of the values are fuzzed too."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.chdir(REPO)  # the relative ds_configs/ paths above
    from hfscale.run.args import build_training_arguments
    from hfscale.train import check_args

    def parse_and_build(argv):
        with restored_environment():  # transformers exports FSDP_* while building FSDP arguments: each example
            _, _, training, _ = check_args(argv)  # starts from the same environment, whatever the one before drew
            return build_training_arguments(training)

    return parse_and_build


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=argv())
def test_any_command_line_is_accepted_or_refused_in_one_line(offline_parser, args):
    try:
        offline_parser([*args, "--output_dir", "/tmp/hfscale-fuzz-never-written"])
    except HfscaleError as err:
        message = str(err)
        assert message and "\n" not in message and "Traceback" not in message


yaml_scalar = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**6), st.floats(allow_nan=True), value_text,
                        st.sampled_from(["ddp", "zero3", "adamw", "adafactor", "--model tiny", "--strategy ddp", "'"]))
yaml_value = st.one_of(yaml_scalar, st.lists(yaml_scalar, max_size=3), st.dictionaries(value_text, yaml_scalar, max_size=2))
SWEEP_KEYS = ["strategy", "optim", "num_processes", "per_device_train_batch_size", "gradient_accumulation_steps",
              "activation_checkpointing", "train_args", "timeout", "out", "batch", "strategies", "grad_accum"]


@settings(max_examples=200, deadline=None)
@given(spec=st.dictionaries(st.sampled_from(SWEEP_KEYS), yaml_value, max_size=5))
def test_any_sweep_spec_is_accepted_or_refused_in_one_line(tmp_path_factory, spec):
    import yaml

    from hfscale.compare.sweep import parse_sweep

    path = tmp_path_factory.mktemp("spec") / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    try:
        parse_sweep(["--spec", str(path)])
    except HfscaleError as err:
        assert str(err) and "\n" not in str(err)


hyper = st.one_of(st.sampled_from([0.0, 1.0, 0.999, 1e-8, -1e-8, 2.0, -0.5]), st.floats(-2, 2, allow_nan=False),
                  st.floats(allow_nan=True, allow_infinity=True))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(optim=st.sampled_from(["adamw", "adafactor", "adamw_8bit"]),
       values=st.dictionaries(st.sampled_from(["--learning_rate", "--adam_beta1", "--adam_beta2", "--adam_epsilon",
                                               "--weight_decay", "--max_grad_norm", "--warmup_steps"]), hyper, max_size=4))
def test_optimizer_values_are_refused_up_front_or_work(offline_parser, optim, values):
    """Whatever optimizer and scheduler values a user passes, either hfscale refuses them in one line before anything
    is written, or the optimizer the Trainer builds from them (torch / bitsandbytes / transformers), its scheduler and
    gradient clipping really run a step - never a library error inside a launched run."""
    import torch
    from transformers import Trainer
    from transformers.optimization import get_scheduler

    argv = ["--optim", optim, "--max_steps", "10", *[f"{k}={v}" for k, v in values.items()]]
    try:
        args = offline_parser([*argv, "--output_dir", "/tmp/hfscale-fuzz-never-written"])
    except HfscaleError as err:
        assert str(err) and "\n" not in str(err)
        return
    model = torch.nn.Linear(4, 4)
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    optimizer = cls(model.parameters(), **kwargs)
    scheduler = get_scheduler(args.lr_scheduler_type, optimizer, num_warmup_steps=args.get_warmup_steps(10),
                              num_training_steps=10, scheduler_specific_kwargs=args.lr_scheduler_kwargs)
    model(torch.ones(2, 4)).sum().backward()
    if args.max_grad_norm:
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
    optimizer.step()
    scheduler.step()


json_value = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=30)),
                          lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                          max_leaves=6)
record = st.one_of(json_value, st.fixed_dictionaries({"text": st.one_of(st.text(max_size=200), json_value)}))


@st.composite
def data_file(draw) -> tuple[str, bytes]:
    suffix = draw(st.sampled_from([".txt", ".jsonl", ".json", ".parquet"]))
    kind = draw(st.sampled_from(["bytes", "text", "records", "records"]))
    if kind == "bytes":
        content = draw(st.binary(min_size=1, max_size=400))
    elif kind == "text":
        content = draw(st.text(max_size=400)).encode("utf-8", errors="surrogatepass")
    else:
        import json

        rows = draw(st.lists(record, min_size=1, max_size=6))
        content = "\n".join(json.dumps(r) for r in rows).encode()
    return suffix, content


@settings(max_examples=40, deadline=None)
@given(file=data_file())
def test_any_data_file_is_read_or_refused_in_one_line(tmp_path_factory, file):
    """Random bytes, text and JSON of every shape under every suffix: hfscale refuses the file in one line when the
    run is parsed (before anything is launched or written), or tokenizes and packs it - or refuses there in one
    line (too little text for a block) - never a library traceback."""
    from hfscale.run import data
    from hfscale.run.args import DataArguments

    suffix, content = file
    tmp = tmp_path_factory.mktemp("data")
    path = tmp / f"corpus{suffix}"
    path.write_bytes(content)
    try:
        args = DataArguments(train_files=[str(path)], seq_len=8, cache_dir=str(tmp / "cache"),
                             default_tokenizer_vocab=300)
        raw = data.load_raw_text(args)
        tokenizer = data.load_tokenizer(args, None, 300, raw, False)
        data.packed_dataset(args, tokenizer, raw, 8)
    except HfscaleError as err:
        assert str(err) and "\n" not in str(err)


# The planning commands' numeric flags (each command's own parser lists them), their comma-separated number lists,
# and the names they take
PLANNER_NUMBERS = {
    "estimate": ["--n_layer", "--hidden_size", "--n_head", "--head_dim", "--ffn_hidden_size", "--vocab_size", "--seq_len",
                 "--gradient_accumulation_steps", "--gpus", "--gpus_per_node", "--device_memory_gb",
                 "--host_memory_gb"],
    "project": ["--tokens_per_s_per_gpu", "--tflops_per_gpu", "--n_layer", "--hidden_size", "--n_head",
                "--ffn_hidden_size", "--vocab_size", "--seq_len", "--per_device_train_batch_size",
                "--gradient_accumulation_steps", "--global_batch_size", "--device_memory_gb", "--gpus_per_node",
                "--intra_latency_us", "--inter_latency_us", "--token_budget", "--gain_threshold"],
    "tune": ["--n_layer", "--hidden_size", "--n_head", "--head_dim", "--ffn_hidden_size", "--vocab_size", "--seq_len",
             "--num_processes", "--global_batch_size", "--device_memory_gb", "--token_budget", "--timeout",
             "--time_budget"],
    "slurm": ["--nodes", "--gpus_per_node", "--cpus_per_task", "--port", "--requeue"],
}
PLANNER_LISTS = {"estimate": ["--per_device_train_batch_size", "--tp", "--pp"],
                 "project": ["--tp", "--pp", "--gpus", "--intra_bw", "--inter_bw"],
                 "tune": ["--per_device_train_batch_size"], "slurm": []}
PLANNER_NAMES = {"--model": ["tiny", "gpt2-1.3b", "bloom-7b1", "bigscience-176b", "qwen3-8b", "gpt5"],
                 "--strategy": ["ddp", "zero3", "fsdp_hybrid", "tp", "megatron", "zero9", "all"],
                 "--optim": ["adamw", "adafactor", "adamw_8bit", "all", "adam9"],
                 "--device": ["A100-80GB", "H100-80GB", "V100-16GB", "TPU-v9"]}
integer = st.one_of(st.integers(1, 64), st.integers(-3, 5000), st.integers(-2**70, 2**70)).map(str)


@st.composite
def planner_argv(draw) -> list[str]:
    command = draw(st.sampled_from(sorted(PLANNER_NUMBERS)))
    out = [command]
    if command == "slurm":
        out += ["--nodes", "2", "--gpus_per_node", "8"]
    if command == "project":
        out += ["--model", "gpt2-1.3b", "--tflops_per_gpu", "150"]  # what it projects from (a measured speed)
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["number"] * 4 + ["list"] * 2 + ["name"] * 2))
        if kind == "name" and command != "slurm":
            flag = draw(st.sampled_from(sorted(PLANNER_NAMES)))
            value = draw(st.sampled_from(PLANNER_NAMES[flag]))
        elif kind == "list" and PLANNER_LISTS[command]:
            flag = draw(st.sampled_from(PLANNER_LISTS[command]))
            value = ",".join(draw(st.lists(st.one_of(integer, number), min_size=1, max_size=3)))
        else:
            flag = draw(st.sampled_from(PLANNER_NUMBERS[command]))
            value = draw(sometimes_junk(st.one_of(integer, integer, number)))
        out.append(f"{flag}={value}")  # `=`: a negative number reaches the flag's own check, not argparse's
    if command == "slurm":
        out += ["--", "--output_dir", "runs/x"]
    return out


@contextmanager
def memory_cap(extra_gb: int = 4):
    """This process may map `extra_gb` more than it has now: a runaway allocation is a MemoryError in the test, not
    the kernel's OOM killer taking the whole CI run. The limit is put back after."""
    import resource

    import psutil

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = psutil.Process().memory_info().vms + extra_gb * 2**30
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=planner_argv())
# a model the formulas cannot walk: each took all 24 GB of this host before its shape was bounded (models.SHAPE_BOUNDS)
@example(args=["estimate", "--n_layer=100000000"])
@example(args=["project", "--model", "gpt2-1.3b", "--tflops_per_gpu", "150", "--n_layer=1180591620717411303424"])
@example(args=["tune", "--n_layer=100000000", "--hidden_size=64", "--n_head=1"])
@example(args=["estimate", "--hidden_size=4194304", "--n_head=16"])
def test_any_planning_command_line_is_accepted_or_refused_in_one_line(hfscale_cli, monkeypatch, tmp_path, args):
    """estimate, project, tune and slurm with any numbers (0, negatives, 2^70, NaN, infinities, junk) under their
    numeric flags: each either answers (exit 0; a tune gets as far as its first trial, which is not launched here)
    or refuses in one line with exit 2 - never a traceback, never an infinite or NaN figure taken as an answer."""
    from conftest import ReachedLaunch
    from hfscale import launching as launch

    monkeypatch.setattr(launch, "run_training", lambda *a, **k: (_ for _ in ()).throw(ReachedLaunch("a trial")))
    try:
        with memory_cap():
            proc = hfscale_cli(args, cwd=tmp_path)
    except ReachedLaunch:
        return
    lines = proc.stderr.strip().splitlines()
    if proc.returncode == 0:
        assert "nan" not in proc.stdout.lower().split(), proc.stdout[-2000:]
        return
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("hfscale: error:"), proc.stderr[-2000:]
