"""Bad input: one line naming the problem, exit code 2, no traceback, nothing written to the output directory."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO, ReachedLaunch, run


CASES = {
    "unknown strategy": (["--strategy", "zero4"], "unknown strategy 'zero4'; choose one of: ddp"),
    "unknown optimizer": (["--optim", "sgd"], "unknown optimizer 'sgd'; choose one of: adamw, adafactor, adamw_8bit"),
    "unknown preset": (["--model", "gpt5"], "unknown model preset 'gpt5'; choose one of: tiny"),
    "a directory as data file": (["--train_files", "."], ". is a directory, not a data file"),
    "a file as cache folder": (["--cache_dir", f"{REPO / 'README.md'}/cache"], f"{REPO / 'README.md'} is a file, not a folder"),
    "states beyond the host": (["--model", "bigscience-176b"], "the model states alone need 2,820.0 GB on this CPU node"),
    # each would be a traceback in every launched rank (numpy's seed, torch's dropout) or a negative MFU
    "negative seed": (["--seed", "-1"], "--seed must be in [0, 2**32) (numpy's seed range), got -1"),
    "negative dropout": (["--dropout", "-0.1"], "--dropout must be in [0, 1), got -0.1"),
    "negative peak": (["--peak_tflops", "-1"], "--peak_tflops must be positive, got -1.0"),
    "unknown report_to": (["--report_to", "tensorboard,wandbx"], "unknown --report_to integration 'wandbx'; choose one of: all, none"),
    "unknown compile mode": (["--torch_compile_mode", "fastest"], "unknown --torch_compile_mode 'fastest'; choose one of: default"),
    "zero epochs": (["--max_steps", "-1", "--num_train_epochs", "0"], "--num_train_epochs must be positive when --max_steps is not set, got 0"),
    "missing tokenizer directory": (["--tokenizer_name", "./no/tokenizer"], "--tokenizer_name ./no/tokenizer: no such directory"),
    # transformers raises these only as each launched rank builds its model
    "unknown attention": (["--attn_implementation", "flash_attention_9"],
                          "unknown attention implementation 'flash_attention_9'; choose one of: eager, "),
    "attention the model lacks": (["--model", "tiny-bloom", "--attn_implementation", "sdpa"],
                                  "BloomForCausalLM has no 'sdpa' attention in transformers; choose one of: eager"),
    "a Hub kernel the model cannot take": (["--model", "tiny-bloom", "--attn_implementation", "org/kernel"],
                                           "BloomForCausalLM has no 'org/kernel' attention"),
    "incompatible pair": (["--strategy", "zero2_offload", "--optim", "adamw_8bit"], "cannot use optimizer 'adamw_8bit'"),
    # the Trainer follows the new name; the plan (estimate, HFU, run name) had read either as on
    "checkpointing flags that disagree": (
        ["--gradient_checkpointing", "true", "--activation_checkpointing", "false"],
        "--activation_checkpointing false and --gradient_checkpointing true disagree"),
    # transformers 5.24's checkpointing options the plan does not model: its estimate and HFU would be wrong
    "checkpointing some layers": (["--activation_checkpointing", "--activation_checkpointing_kwargs",
                                   '{"every_n_layers": 2}'], "--activation_checkpointing_kwargs every_n_layers 2: "
                                                             "hfscale's plan does not model checkpointing only some"),
    "checkpointed inputs on the host": (
        ["--gradient_checkpointing", "true", "--gradient_checkpointing_kwargs", '{"offload": true}'],
        "--gradient_checkpointing_kwargs offload: hfscale's plan does not model the checkpointed inputs held in host"),
    # the Trainer's KeyError at the first evaluation, after training up to it
    "a best-model metric no evaluation reports": (
        ["--load_best_model_at_end", "true", "--eval_strategy", "steps", "--save_strategy", "steps",
         "--metric_for_best_model", "accuracy"],
        "unknown --metric_for_best_model 'accuracy': an evaluation reports loss, perplexity, tokens_evaluated"),
    # keyword arguments that are not an object: the scheduler's ** raised in every rank
    "scheduler keywords that are not an object": (["--lr_scheduler_kwargs", "5"], "--lr_scheduler_kwargs must be a "
                                                  "JSON object of keyword arguments ('{\"name\": value}'), got '5'"),
    # a run file's mapping was checked, the command line's JSON text was not
    "min_lr_rate above 1 on the command line": (["--lr_scheduler_kwargs", '{"min_lr_rate": 5}'],
                                                "--lr_scheduler_kwargs min_lr_rate must be in [0, 1], got 5"),
    # transformers reads --optim_args for none of adamw, adafactor and bitsandbytes' AdamW8bit: ignored without a word
    "optimizer arguments nothing reads": (["--optim_args", "beta1=0.5"], "--optim_args: adamw (adamw_torch here) "
                                          "reads none of them, and they would be ignored; its settings are "
                                          "--learning_rate, --adam_beta1"),
    # each TypeError (ValueError for min_lr) in every rank as the Trainer built its scheduler, or ignored without a word
    "a scheduler argument missing": (["--lr_scheduler_type", "warmup_stable_decay"],
                                     "--lr_scheduler_kwargs for warmup_stable_decay: missing a required argument: "
                                     "'num_decay_steps'"),
    "a scheduler argument the schedule does not take": (
        ["--lr_scheduler_type", "linear", "--lr_scheduler_kwargs", '{"power": 2}'],
        "--lr_scheduler_kwargs for linear: got an unexpected keyword argument 'power' (it takes none)"),
    "the minimum learning rate twice": (["--lr_scheduler_kwargs", '{"min_lr": 1e-5, "min_lr_rate": 0.1}'],
                                        "--lr_scheduler_kwargs for cosine_with_min_lr: give one of min_lr or "
                                        "min_lr_rate"),
    "scheduler arguments a constant schedule ignores": (
        ["--lr_scheduler_type", "constant", "--lr_scheduler_kwargs", '{"num_cycles": 2}'],
        "--lr_scheduler_kwargs: the constant schedule takes none"),
    # a TypeError in every rank; torch's ValueError at the first forward; ignored; per-device figures made wrong
    "an unknown accelerate setting": (["--accelerator_config", '{"split_batch": true}'],
                                      "--accelerator_config: unknown setting 'split_batch'; accelerate's are "
                                      "split_batches, dispatch_batches"),
    "an accelerate settings file that is not there": (["--accelerator_config", "/nonexistent/accelerate.json"],
                                                      "/nonexistent/accelerate.json: file not found"),
    "batches split across the processes": (["--accelerator_config", '{"split_batches": true}'],
                                           "--accelerator_config split_batches: each process would take a share of "
                                           "one --per_device_train_batch_size batch"),
    "an unknown checkpointing setting": (["--activation_checkpointing", "--activation_checkpointing_kwargs",
                                          '{"use_reentrent": false}'],
                                         "--activation_checkpointing_kwargs: unknown setting 'use_reentrent'; torch's "
                                         "checkpoint and the Trainer take use_reentrant"),
    "target modules no optimizer of hfscale's reads": (["--optim_target_modules", "attn"],
                                                       "--optim_target_modules: read by the Trainer's low-rank "
                                                       "optimizers (GaLore, APOLLO) alone"),
    "optimizer arguments without their =": (["--optim_args", "beta1"], "--optim_args 'beta1': give key=value pairs"),
    "a torchao block size the estimate does not model": (
        ["--strategy", "fsdp", "--optim", "adamw_8bit", "--optim_args", "block_size=128"],
        "--optim_args block_size: not with hfscale: the memory estimate models torchao's default 256-element blocks"),
    "heads not dividing hidden": (["--n_head", "5"], "heads (5) must divide hidden size (64)"),
    "key/value heads not dividing the heads": (["--model", "tiny-llama", "--num_key_value_heads", "3"],
                                               "3 key/value heads do not divide the 4 attention heads"),
    "key/value heads for BLOOM": (["--model", "tiny-bloom", "--num_key_value_heads", "2"],
                                  "BLOOM has one key/value head per query head (4); --num_key_value_heads is for "
                                  "Llama"),
    "a Llama sequence beyond its positions": (["--model", "tiny-llama", "--seq_len", "512"],
                                              "--seq_len 512 is longer than the model's 256 positions; choose at "
                                              "most 256"),
    "zero layers": (["--n_layer", "0"], "n_layer must be positive"),
    "seq_len beyond positions": (["--seq_len", "4096"], "longer than the model's 256 positions"),
    "negative seq_len": (["--seq_len", "-3"], "--seq_len must be positive"),
    "one-token samples": (["--seq_len", "1"], "--seq_len 1 leaves nothing to predict"),
    "a vocabulary below the default tokenizer's": (["--vocab_size", "10"],
                                                   "--vocab_size 10 is below the default tokenizer's 257 tokens"),
    "missing data file": (["--train_files", "/nonexistent/corpus.txt"], "data file not found: /nonexistent/corpus.txt"),
    "batch not dividing": (["--per_device_train_batch_size", "4", "--global_batch_size", "6"],
                           "not a positive multiple of --per_device_train_batch_size x processes = 4 x 1"),
    "zero batch": (["--per_device_train_batch_size", "0"], "--per_device_train_batch_size must be positive"),
    # ~100 TB of activations (at 100,000: ~1 TB, and the kernel's OOM killer took the run without a word)
    "micro-batch beyond the host": (["--per_device_train_batch_size", "10000000"],
                                    "the model states and the steps' activations need at least"),
    "collectives of step 1": (["--count_collectives", "1"], "--count_collectives takes an optimizer step from 2 to"),
    "profile past the run": (["--profile_step", "9"], "--profile_step takes an optimizer step from 2 to --max_steps"),
    "two profilers": (["--profile_step", "3", "--count_collectives", "3"], "only one can run at a time"),
    "no steps": (["--max_steps", "0"], "--max_steps must be positive (or -1"),
    # TrainingArguments' own checks of how flags combine, made before launch (before: in every rank, after its
    # process group started)
    "best model of another schedule": (["--load_best_model_at_end", "true"], "--load_best_model_at_end requires the "
                                       "save and eval strategy to match"),
    "plateau schedule without evaluation": (["--lr_scheduler_type", "reduce_lr_on_plateau"],
                                            "lr_scheduler_type reduce_lr_on_plateau requires an eval strategy"),
    "keep the best of no metric": (["--save_strategy", "best"], "--save_strategy best keeps the checkpoint of the best "
                                   "evaluation: name its --metric_for_best_model"),  # the Trainer's, in every rank
    "unknown compile backend": (["--torch_compile_backend", "bogus"], "unknown --torch_compile_backend 'bogus'; "
                                "choose one of: no, eager, aot_eager, inductor"),  # accelerate's, in every rank
    "malformed JSON object": (["--lr_scheduler_kwargs", "{min_lr_rate: 0.1}"], "--lr_scheduler_kwargs is not a JSON "
                              "object (Expecting property name enclosed in double quotes, character 1): {min_lr_rate"),
    "a glob that matches nothing": (["--train_files", "/nonexistent/*.jsonl"], "--train_files '/nonexistent/*.jsonl' "
                                                                               "matches no file"),
    "negative steps other than -1": (["--max_steps", "-5"], "--max_steps must be positive (or -1: train"),
    "a fractional interval above 1": (["--save_steps", "1.5"], "--save_steps must be a whole number of steps (or a "
                                      "fraction of the run below 1), got 1.5"),
    "unknown flag": (["--not_a_flag", "1"], "unknown flag --not_a_flag; `hfscale train --help` lists every flag"),
    "misspelled flag": (["--lerning_rate", "0.1"], "unknown flag --lerning_rate (did you mean --learning_rate?)"),
    "shortened flag": (["--max_step", "3"], "unknown flag --max_step (did you mean --max_steps?)"),  # no abbreviations
    "flag of several": (["--lr", "3"], "unknown flag --lr (did you mean --lr_scheduler_kwargs or --lr_scheduler_type?)"),
    "stray word": (["zero1"], "unexpected argument zero1: hfscale train takes --flags, or one run file"),
    "powersgd on one process": (["--strategy", "ddp_powersgd"], "launch 2 or more processes"),
    "deepspeed json for fsdp": (["--strategy", "fsdp", "--deepspeed", "ds_configs/zero1.json"], "--deepspeed is for the zero* strategies"),
    "deepspeed json of another stage": (["--strategy", "zero1", "--deepspeed", "ds_configs/zero3.json"],
                                        "zero_optimization.stage is 3, but strategy 'zero1' is ZeRO-1"),
    "fsdp with adafactor": (["--strategy", "fsdp", "--optim", "adafactor"], "strategy 'fsdp' cannot use optimizer 'adafactor'"),
    "malformed fsdp_config": (["--strategy", "fsdp", "--fsdp_config", '{"version": 2,'], "--fsdp_config is not a JSON "
                              "object (Expecting property name enclosed in double quotes, character 14)"),
    "missing fsdp_config file": (["--strategy", "fsdp", "--fsdp_config", "/nonexistent/fsdp.json"],
                                 "/nonexistent/fsdp.json: file not found"),
    "hsdp on one process": (["--strategy", "fsdp_hybrid"], "needs 2+ nodes with 2+ processes each"),
    "zero vocabulary": (["--vocab_size", "0"], "model vocab must be positive"),
    "zero accumulation": (["--gradient_accumulation_steps", "0"], "--gradient_accumulation_steps must be positive"),
    "negative token budget": (["--token_budget", "-1"], "--token_budget must be positive"),
    "fp16 on a CPU machine": (["--fp16"], "--fp16 needs a GPU"),
    "tf32 on a CPU machine": (["--tf32", "true"], "--tf32 is a GPU's matmul mode (Ampere or newer): a CPU run has "
                                                  "none"),
    "infinite logging interval": (["--logging_steps", "inf"], "--logging_steps must be a finite number, got inf"),
    "NaN token budget": (["--token_budget", "nan"], "--token_budget must be a finite number, got nan"),
    "resume from nothing": (["--resume_from_checkpoint", "/nonexistent/checkpoint-4"], "no such checkpoint directory"),
    "resume from a file": (["--resume_from_checkpoint", str(REPO / "README.md")],
                           f"is a file, not a checkpoint directory: give the folder that holds it ({REPO})"),
    "validation share of everything": (["--validation_split_percentage", "100"],
                                       "--validation_split_percentage must be between 0 and 100, got 100"),
    # a flag of another strategy: the Trainer would ignore it without a word
    "powersgd rank without powersgd": (["--powersgd_rank", "4"], "--powersgd_rank is for ddp_powersgd; 'ddp' compresses nothing"),
    "fsdp config for ddp": (["--fsdp_config", '{"version": 2}'], "--fsdp_config is for the fsdp strategies; 'ddp' is ddp"),
    "ddp buckets for zero1": (["--strategy", "zero1", "--ddp_bucket_cap_mb", "50"],
                              "--ddp_bucket_cap_mb is read by DDP only; 'zero1' is deepspeed (its buckets: reduce_bucket_size"),
    "compile mode with compile off": (["--torch_compile", "false", "--torch_compile_mode", "max-autotune"],
                                      "--torch_compile_mode max-autotune compiles the model"),
    "no validation share": (["--eval_strategy", "steps", "--validation_split_percentage", "0"],  # read as not given
                            "--validation_split_percentage must be between 0 and 100, got 0"),
    # another source's flag: each was ignored, the run trained on other text than the command line said
    "hub split of the embedded corpus": (["--dataset_split", "test"], "--dataset_split is read only for a Hub --dataset"),
    "two sources": (["--dataset", "wikitext", "--train_files", "a.txt"], "give --dataset wikitext or --train_files, not both"),
    "streamed embedded corpus": (["--streaming"], "--streaming streams a Hub --dataset or --train_files"),
    "two validation sources": (["--validation_split_percentage", "5", "--validation_split", "validation"],
                               "give one of --validation_files, --validation_split, --validation_split_percentage"),
    "hub split of local text": (["--eval_strategy", "steps", "--validation_split", "validation"],
                                "--validation_split names a split of a Hub --dataset"),
    "missing validation file": (["--validation_files", "/nonexistent/val.txt"], "data file not found: /nonexistent/val.txt"),
    "negative learning rate": (["--learning_rate=-0.001"], "--learning_rate must be >= 0, got -0.001"),
    "beta2 of one": (["--adam_beta2", "1.0"], "--adam_beta2 must be in [0, 1), got 1.0"),
    "negative epsilon": (["--adam_epsilon=-1e-8"], "--adam_epsilon must be >= 0"),
    "adafactor with negative decay": (["--optim", "adafactor", "--weight_decay=-0.1"], "--weight_decay must be >= 0"),
    "negative clipping": (["--max_grad_norm=-1"], "--max_grad_norm must be >= 0"),
    "negative warmup": (["--warmup_steps=-5"], "--warmup_steps must be >= 0"),
}

# Files whose *content* is wrong (built in the test's folder): (file name, bytes, flag, expected message)
BAD_FILES = {
    "random bytes as text": ("corpus.txt", bytes(range(128, 256)) * 4, "--train_files", "is not UTF-8 text"),
    "UTF-16 text": ("corpus.txt", "text".encode("utf-16"), "--train_files", "is not UTF-8 text"),
    "blank text": ("corpus.txt", b"  \n\n \n", "--train_files", "holds no text (only blank lines)"),
    "numbers in the text column": ("corpus.jsonl", b'{"text": 1}\n{"text": 2}\n', "--train_files", "'text' is int, not text"),
    "broken JSON lines": ("corpus.jsonl", b'{"text": "a"\n{', "--train_files", "is not JSON lines or JSON"),
    "JSON without the column": ("corpus.json", b'[{"body": "a"}]', "--train_files", "has no text column 'text'"),
    "not parquet": ("corpus.parquet", b"PAR1 not really", "--train_files", "is not a parquet file"),
    "bad validation file": ("val.txt", b"\xff\xfe", "--validation_files", "is not UTF-8 text"),
    "a file as tokenizer": ("tok.json", b"{}", "--tokenizer_name", "is not a tokenizer directory"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_file_content_is_one_line(case, tmp_path, hfscale_cli):
    name, content, flag, expected = BAD_FILES[case]
    (tmp_path / name).write_bytes(content)
    out = tmp_path / "out"
    proc = hfscale_cli(["train", flag, str(tmp_path / name), "--max_steps", "1", "--output_dir", str(out)])
    _check_refused(proc, expected, out)


def test_missing_incomplete_or_foreign_model_directories_are_one_line(tmp_path, hfscale_cli):
    foreign, half = tmp_path / "foreign", tmp_path / "half"
    foreign.mkdir()
    (foreign / "config.json").write_text('{"hidden": 3}')
    half.mkdir()
    (half / "config.json").write_text('{"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4}')
    odd = tmp_path / "odd"  # a config transformers reads without complaint and cannot build
    odd.mkdir()
    (odd / "config.json").write_text('{"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 5}')
    (odd / "model.safetensors").write_bytes(b"")
    mistyped = tmp_path / "mistyped"  # huggingface_hub's validation traceback
    mistyped.mkdir()
    (mistyped / "config.json").write_text('{"model_type": "gpt2", "n_layer": "two", "n_embd": 64, "n_head": 4}')
    # families hfscale does not serve, or shapes it cannot train, named before their missing weights
    configs = {"opt": '{"model_type": "opt"}', "qwen3-moe": '{"model_type": "qwen3_moe"}',
               "gemma3-vision": '{"model_type": "gemma3"}',
               "olmo": '{"model_type": "olmo"}', "biased-olmo2": '{"model_type": "olmo2", "attention_bias": true}',
               "partial-phi3": '{"model_type": "phi3", "partial_rotary_factor": 0.75}',
               "gelu-qwen2": '{"model_type": "qwen2", "hidden_act": "gelu"}',
               "biased-qwen3": '{"model_type": "qwen3", "attention_bias": true}',
               "gqa": '{"model_type": "llama", "num_attention_heads": 32, "num_key_value_heads": 5}',
               "biased": '{"model_type": "llama", "attention_bias": true}',
               "odd-heads": '{"model_type": "mistral", "hidden_size": 1024, "num_attention_heads": 8, '
                            '"head_dim": 75}',
               "wide-qwen2": '{"model_type": "qwen2", "hidden_size": 1024, "num_attention_heads": 8, '
                             '"head_dim": 256}',
               # torch's nn.Dropout would refuse it in every rank
               "loose-dropout": '{"model_type": "bloom", "n_layer": 2, "hidden_size": 64, "n_head": 4, '
                                '"attention_dropout": 1.5}'}
    for name, text in configs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(text)
    # weights but no tokenizer: transformers 5 would make an empty tokenizer of the config, every text encoding to []
    untokenized = tmp_path / "untokenized"
    from hfscale.models import PRESETS, build_model

    build_model(PRESETS["tiny"], seed=0).save_pretrained(untokenized)
    run_dir = tmp_path / "a-run"  # a run's output folder given as the model (before: transformers' "Should have a
    (run_dir / "checkpoint-4").mkdir(parents=True)  # `model_type` key in its config.json" of a folder with none)
    for path, expected in ((tmp_path / "missing", "no such directory"),  # not sent to the Hub as a repo id
                           (run_dir, "no config.json in it (a run's folder: `hfscale export RUN OUT` makes a model"),
                           (foreign, "Unrecognized model"), (half, "has a config but no weights"),
                           (odd, "its config's heads (5) must divide hidden size (64)"),
                           (mistyped, "its config.json: Validation error for field 'n_layer': TypeError: Field "
                                      "'n_layer' expected int, got str (value: 'two')"),
                           (tmp_path / "opt", "its config's model type 'opt' is not supported; hfscale knows: gpt2, "
                                              "bloom, llama, mistral, qwen2, qwen3, smollm3, gemma3_text, "
                                              "olmo2, olmo3"),
                           (tmp_path / "partial-phi3", "its phi3 config differs from the Phi-3 shape hfscale trains: "
                                                       "partial_rotary_factor=0.75 (needs 1.0"),
                           (tmp_path / "olmo", "model type 'olmo' is not served: the first OLMo's non-parametric "
                                               "LayerNorms before each sublayer"),
                           (tmp_path / "biased-olmo2", "its olmo2 config differs from the OLMo 2 shape hfscale trains: "
                                                       "attention_bias=True (needs False)"),
                           (tmp_path / "gemma3-vision", "model type 'gemma3' is not served: Gemma 3's image-text "
                                                        "checkpoint (a vision tower beside the text model"),
                           (tmp_path / "qwen3-moe", "model type 'qwen3_moe' is not served: a mixture of experts in "
                                                    "place of each block's MLP"),
                           (tmp_path / "biased-qwen3", "its qwen3 config differs from the Qwen3 shape hfscale trains: "
                                                       "attention_bias=True (needs False)"),
                           (tmp_path / "gelu-qwen2", "its qwen2 config differs from the Qwen2 shape hfscale trains: "
                                                     "hidden_act='gelu' (needs 'silu')"),
                           (tmp_path / "gqa", "its config's 5 key/value heads do not divide the 32 attention heads"),
                           (tmp_path / "biased", "its llama config differs from the Llama shape hfscale trains: "
                                                 "attention_bias=True (needs False)"),
                           (tmp_path / "odd-heads", "RoPE requires an even rotary dimension, but got `head_dim`=75"),
                           (tmp_path / "wide-qwen2", "its qwen2 config differs from the Qwen2 shape hfscale trains: "
                                                     "head_dim=256 (needs hidden_size / num_attention_heads = 128)"),
                           (tmp_path / "loose-dropout", "its config's attention_dropout 1.5 is not a dropout "
                                                        "probability (0 to 1)"),
                           (untokenized, "has no tokenizer files (tokenizer.json or tokenizer_config.json)")):
        out = tmp_path / f"out-{path.name}"
        proc = hfscale_cli(["train", "--model_name_or_path", str(path), "--max_steps", "1", "--output_dir", str(out)])
        _check_refused(proc, expected, out)


def test_liger_kernels_asked_for_where_the_package_is_missing_are_one_line(tmp_path, hfscale_cli, monkeypatch):
    """The Trainer imports liger-kernel in every rank (an ImportError traceback each); missing (faked here, whatever
    this machine has installed) it is refused before launch."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "liger_kernel" else
                        find_spec(name, *a))
    out = tmp_path / "out"
    proc = hfscale_cli(["train", "--max_steps", "1", "--use_liger_kernel", "true", "--output_dir", str(out)])
    _check_refused(proc, "--use_liger_kernel needs the liger-kernel package, which is not installed here", out)


@pytest.mark.parametrize("attention", ["flash_attention_2", "flash_attention_3"])
def test_flash_attention_where_it_cannot_run_is_one_line(attention, tmp_path, hfscale_cli, monkeypatch):
    """FlashAttention needs its package and a CUDA GPU (transformers' is_flash_attn_N_available, faked here both
    ways): without them transformers raised an ImportError in every rank as it built the model; with them the run
    goes on (only the check is faked: the run itself is refused later for the GPU this machine lacks)."""
    import transformers.utils

    from hfscale.run.planning import check_flash_attention

    version = attention[-1]
    monkeypatch.setattr(transformers.utils, f"is_flash_attn_{version}_available", lambda: False)
    out = tmp_path / "out"
    proc = hfscale_cli(["train", "--max_steps", "1", "--attn_implementation", attention, "--output_dir", str(out)])
    _check_refused(proc, f"--attn_implementation {attention} needs a CUDA GPU and the FlashAttention {version} "
                         "package, which this machine lacks: use sdpa", out)
    monkeypatch.setattr(transformers.utils, f"is_flash_attn_{version}_available", lambda: True)
    check_flash_attention(attention)
    check_flash_attention("sdpa")
    check_flash_attention(None)


def test_a_reporting_integration_that_is_not_installed_is_one_line(tmp_path, hfscale_cli, monkeypatch):
    """transformers knows wandb, and its callback raises in every rank when the package is missing (mlflow's: an
    AttributeError); refused before launch. Installed ones are faked here, whatever this machine has."""
    from transformers.integrations import integration_utils

    monkeypatch.setattr(integration_utils, "get_available_reporting_integrations", lambda: ["tensorboard"])
    out = tmp_path / "out"
    proc = hfscale_cli(["train", "--max_steps", "1", "--report_to", "tensorboard,wandb", "--output_dir", str(out)])
    _check_refused(proc, "--report_to wandb: its package is not installed here (installed: tensorboard)", out)
    monkeypatch.setattr(integration_utils, "get_available_reporting_integrations", lambda: ["tensorboard", "wandb"])
    from hfscale.run.planning import check_integrations

    check_integrations(["tensorboard", "wandb"])  # installed: taken


def _check_refused(proc, expected: str, out_dir):
    err_lines = [l for l in proc.stderr.splitlines() if l.startswith("hfscale: error:")]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert len(err_lines) == 1 and expected in err_lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not out_dir.exists(), "a refused run must write nothing"


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line(case, tmp_path, hfscale_cli):
    flags, expected = CASES[case]
    out = tmp_path / "out"
    _check_refused(hfscale_cli(["train", "--max_steps", "1", *flags, "--output_dir", str(out)]), expected, out)


@pytest.mark.parametrize("case", ["unknown strategy", "incompatible pair", "missing data file", "resume from nothing"])
def test_the_console_script_refuses_in_one_line_too(case, tmp_path):
    """The same refusals from a real `python -m hfscale train` process: exit code 2, one line, no traceback."""
    flags, expected = CASES[case]
    out = tmp_path / "out"
    _check_refused(run([sys.executable, "-m", "hfscale", "train", *flags, "--output_dir", str(out)]), expected, out)


def test_the_ranks_of_one_launch_say_the_same_refusal_once():
    """Every rank of a launch meets the same bad input: the first on the node says it, the others leave quietly (the
    whole launch: test_multiprocess's contradicting launcher config). A rank alone, another message, the launcher's
    next restart or a process outside a launch says its own."""
    from hfscale import errors

    rank = {"LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "0"}
    claims = list(errors._claims)
    try:
        assert errors.first_to_say("bad input", rank)
        assert not errors.first_to_say("bad input", rank)  # another rank of the same launcher (this process's parent)
        assert errors.first_to_say("other input", rank)
        assert errors.first_to_say("bad input", {**rank, "TORCHELASTIC_RESTART_COUNT": "1"})
        assert errors.first_to_say("bad input", {**rank, "LOCAL_WORLD_SIZE": "1"})
        assert errors.first_to_say("bad input", {})
    finally:
        for claim in errors._claims[len(claims):]:
            claim.close()
        errors._claims[:] = claims


@pytest.mark.parametrize("command", [
    ["sweep", "--strategy", "ddp", "--num_processes", "1", "--", "--model", "tiny", "--max_steps", "1"],
    ["tune", "--model", "tiny", "--num_processes", "1", "--", "--max_steps", "1"],
    ["parity", "--strategy", "zero1", "--max_steps", "1", "--", "--model", "tiny"]], ids=lambda c: c[0])
def test_a_sweep_tune_or_parity_into_a_folder_in_use_is_refused_before_it_launches(tmp_path, command):
    """Two sweeps (tunes, parity checks) into one --out recorded each other's runs: the second wrote its outcome over
    the first's running results.json and truncated its launch log. The one that comes second is refused, naming
    what holds the folder; the holder's files are untouched."""
    import subprocess

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "sweep.json").write_text("{}")
    holder = subprocess.Popen([sys.executable, "-c", "import time\nfrom hfscale.files import exclusive_dir\n"
                               f"with exclusive_dir({str(busy)!r}, '--out', 'sweep'):\n    print('held', flush=True)\n"
                               "    time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = {p.name: p.read_bytes() for p in busy.iterdir()}
        proc = run([sys.executable, "-m", "hfscale", command[0], "--out", str(busy), *command[1:]], timeout=120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
        assert f"--out {busy} is in use by a running sweep (pid {holder.pid} on " in lines[0], lines
        assert {p.name: p.read_bytes() for p in busy.iterdir()} == before
    finally:
        holder.kill()
        holder.wait()


def test_a_folder_in_use_by_a_running_run_is_refused_and_a_late_refusal_leaves_no_folder(tmp_path):
    """Rank 0 holds its --output_dir for the run (files.exclusive_dir): a second run into it (the same command started
    twice, a requeued job while the first still runs) is refused in one line, the first run's files untouched. A
    refusal made once the run holds its folder (here: the text yields no block of --seq_len) leaves no folder."""
    import subprocess

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "results.json").write_text('{"status": "running"}')
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom hfscale.files import exclusive_dir\n"
                               f"with exclusive_dir({str(busy)!r}, 'x'):\n    print('held', flush=True)\n    time.sleep(600)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = {p.name: p.read_bytes() for p in busy.iterdir()}
        proc = run([sys.executable, "-m", "hfscale", "train", "--max_steps", "1", "--output_dir", str(busy)])
        err_lines = [l for l in proc.stderr.splitlines() if l.startswith("hfscale: error:")]
        assert proc.returncode == 2 and len(err_lines) == 1, proc.stderr[-2000:]
        assert f"--output_dir {busy} is in use by a running run (pid {holder.pid} on " in err_lines[0]
        assert {p.name: p.read_bytes() for p in busy.iterdir()} == before
    finally:
        holder.kill()
        holder.wait()
    short = tmp_path / "short.txt"
    short.write_text("a few words, far fewer than one block of 256 tokens\n" * 3)
    out = tmp_path / "out"
    proc = run([sys.executable, "-m", "hfscale", "train", "--max_steps", "1", "--train_files", str(short),
                "--output_dir", str(out)], cwd=tmp_path)
    _check_refused(proc, "the dataset yields no full block of seq_len 256 tokens", out)


def test_a_finished_runs_folder_is_not_trained_over(tmp_path):
    """A finished run's results stay unless --overwrite_output_dir says otherwise; asked to resume, the line says what
    that flag then does (trains on from the last checkpoint). A real process: the folder is taken once the process
    group is up."""
    done = tmp_path / "done"
    done.mkdir()
    (done / "results.json").write_text('{"status": "ok"}')
    proc = run([sys.executable, "-m", "hfscale", "train", "--max_steps", "1", "--output_dir", str(done),
                "--resume_from_checkpoint", "latest"])
    err_lines = [l for l in proc.stderr.splitlines() if l.startswith("hfscale: error:")]
    assert proc.returncode == 2 and len(err_lines) == 1, proc.stderr[-2000:]
    assert err_lines[0] == (f"hfscale: error: {done} already holds the results of a finished run; choose another "
                            "--output_dir or pass --overwrite_output_dir (with --resume_from_checkpoint: to train on "
                            "from its last checkpoint, e.g. to a larger --max_steps)")
    assert [p.name for p in done.iterdir()] == ["results.json"]


@pytest.mark.parametrize("command", ["train", "launch"])
def test_an_output_dir_that_cannot_take_the_run_is_refused_before_any_process_starts(command, tmp_path, hfscale_cli):
    """A finished run's folder, or one that cannot be written: one line before the launch, where each rank said it
    (and torchrun its failure summary) once the process group was up."""
    done = tmp_path / "done"
    done.mkdir()
    (done / "results.json").write_text('{"status": "ok"}')
    launch = ["--num_processes", "2"] if command == "launch" else []
    proc = hfscale_cli([command, *launch, "--max_steps", "1", "--output_dir", str(done)])
    _check_refused(proc, f"{done} already holds the results of a finished run", tmp_path / "never")
    _check_refused(hfscale_cli([command, *launch, "--max_steps", "1", "--output_dir", "/proc/hfscale-run"]),
                   "--output_dir /proc/hfscale-run is not writable", tmp_path / "never")
    assert [p.name for p in tmp_path.iterdir()] == ["done"]


@pytest.mark.parametrize("command", [["launch", "--num_processes", "2"],
                                     ["sweep", "--strategy", "ddp", "--out", "sw", "--"]], ids=lambda c: c[0])
def test_a_schedule_its_runs_cannot_build_is_refused_before_they_launch(command, tmp_path, hfscale_cli):
    """The launching commands check the schedule the runs would build (hfscale's recipe filled in), where each rank
    refused it; the recipe's own cosine_with_min_lr with its min_lr_rate passes."""
    _check_refused(hfscale_cli([*command, "--lr_scheduler_type", "warmup_stable_decay"], cwd=tmp_path),
                   "--lr_scheduler_kwargs for warmup_stable_decay: missing a required argument", tmp_path / "sw")
    if command[0] == "launch":
        with pytest.raises(ReachedLaunch):  # the default schedule: on to the launch
            hfscale_cli([*command, "--max_steps", "2"], cwd=tmp_path)


def test_empty_data_file(tmp_path, hfscale_cli):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    out = tmp_path / "out"
    proc = hfscale_cli(["train", "--train_files", str(empty), "--output_dir", str(out)])
    _check_refused(proc, f"data file is empty: {empty}", out)


def test_unwritable_output_dir(tmp_path):
    proc = run([sys.executable, "-m", "hfscale", "train", "--max_steps", "1", "--output_dir", "/proc/hfscale-run"])
    _check_refused(proc, "--output_dir /proc/hfscale-run is not writable", tmp_path / "never")


@pytest.mark.parametrize("argv", [
    ["project", "results.json", "--out", "taken/projection"],
    ["report", ".", "--out", "taken/report"],
    ["import-logs", REPO / "tests/data/61B-megatron-mbs-2-pp16-dp-1-gas-512-200977.out", "--out", "taken/megatron"],
    ["slurm", "--nodes", "2", "--gpus_per_node", "8", "--strategy", "zero1,zero2", "--out", "taken/jobs", "--"],
    ["sweep", "--strategy", "ddp", "--out", "taken/sweep"],
    ["tune", "--model", "tiny", "--num_processes", "1", "--out", "taken/tune"],
    ["bandwidth", "--num_processes", "2", "--out", "taken/bandwidth.json"],
    ["parity", "--strategy", "zero1", "--out", "taken/parity"],
    ["export", "elsewhere/checkpoint-4", "taken/model"],
], ids=lambda argv: argv[0])
def test_an_output_behind_a_file_is_refused_before_any_work(argv, tmp_path, hfscale_cli):
    """Every command that writes checks its output folder first: a file in the way (or a folder it cannot write) is
    one line, not a traceback after the work (a sweep's runs, a tune's trials) was done."""
    (tmp_path / "taken").write_text("a file, not a folder")
    _checkpoint(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    named = str(argv[-2] if argv[-1] == "--" else argv[-1])
    proc = hfscale_cli(argv, cwd=tmp_path)
    _check_refused(proc, f"{named}: {tmp_path / 'taken'} is a file, not a folder", tmp_path / "runs")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def _checkpoint(tmp_path, **changes) -> Path:
    """A complete checkpoint's marker as a 1-process ddp run of `tiny` writes it, with some fields changed."""
    from hfscale.run.checkpoints import MARKER, identity
    from hfscale.models import resolve_shape

    marker = {k: v for k, v in identity("ddp", "adamw", 1, resolve_shape("tiny")).items() if k != "data"}
    marker["step"] = 4
    for key, value in changes.items():
        if key in marker["model"]:
            marker["model"][key] = value
        else:
            marker[key] = value
    path = tmp_path / "elsewhere" / "checkpoint-4"
    path.mkdir(parents=True)
    if changes.get("complete", True):
        (path / MARKER).write_text(json.dumps(marker))
    return path


@pytest.mark.parametrize("changes,expected", [
    ({"strategy": "zero3"}, "was saved with strategy 'zero3' but this run has 'ddp'"),
    ({"n_layer": 4}, "was saved with model"),
    ({"world_size": 8}, "was saved with world_size 8 but this run has 1"),
    ({"optim": "adafactor"}, "was saved with optim 'adafactor' but this run has 'adamw'"),
    ({"complete": False}, "incomplete checkpoint (no hfscale_checkpoint.json"),
    # its marker lists a file the folder no longer holds (a copy cut short): refused, no older intact one named
    ({"files": {"model.safetensors": 1000}}, "checkpoint-4: its file model.safetensors is missing; the last intact one "
                                             "is none"),
    # another place in the data: the Trainer skips as many batches as it trained, so samples would be skipped/repeated
    ({"data": {"per_device_train_batch_size": 3}}, "was saved with per_device_train_batch_size 3 but this run has 8: "
                                                   "the Trainer finds its place in the data by skipping"),
    ({"data": {"data_seed": 7}}, "was saved with data_seed 7 but this run has 42"),
    ({"data": {"text": {"files": [["wiki.txt", 1000]], "column": "text"}}}, "was saved with text {'files': [['wiki.txt'"),
])
def test_resume_from_an_incompatible_checkpoint(tmp_path, changes, expected, hfscale_cli):
    """A named checkpoint is checked with the flags, before any process group starts."""
    ckpt = _checkpoint(tmp_path, **changes)
    out = tmp_path / "out"
    proc = hfscale_cli(["train", "--resume_from_checkpoint", str(ckpt), "--output_dir", str(out)])
    _check_refused(proc, expected, out)


def test_ignore_data_skip_resumes_from_another_data_position(tmp_path):
    """--ignore_data_skip starts the data over, so a checkpoint of another batch shape or data is taken (the Trainer's
    meaning of the flag); without it, refused. A marker older than the data identity (no `data`) is taken as it is."""
    from hfscale.models import resolve_shape
    from hfscale.errors import HfscaleError
    from hfscale.run.checkpoints import identity, resolve_resume

    expected = identity("ddp", "adamw", 1, resolve_shape("tiny"), {"per_device_train_batch_size": 8, "seq_len": 256})
    ckpt = _checkpoint(tmp_path, data={"per_device_train_batch_size": 4, "seq_len": 256})
    assert resolve_resume(str(ckpt), tmp_path, expected, data_skip=False) == str(ckpt)
    with pytest.raises(HfscaleError, match="per_device_train_batch_size 4 but this run has 8"):
        resolve_resume(str(ckpt), tmp_path, expected)
    older = _checkpoint(tmp_path / "older")
    assert "data" not in json.loads((older / "hfscale_checkpoint.json").read_text())
    assert resolve_resume(str(older), tmp_path, expected) == str(older)
    # a run's folder names its newest complete checkpoint, as `hfscale export` reads it (before: "incomplete checkpoint
    # (no hfscale_checkpoint.json ...); the last complete one is none")
    assert resolve_resume(str(older.parent), tmp_path, expected) == str(older)
    with pytest.raises(HfscaleError, match="incomplete checkpoint"):
        resolve_resume(str(tmp_path / "older"), tmp_path, expected)  # a folder of run folders is none of them
    # a marker from before Qwen3 names no head size: its heads were hidden / heads wide, which the run's are too
    marker = json.loads((older / "hfscale_checkpoint.json").read_text())
    del marker["model"]["head_size"]
    (older / "hfscale_checkpoint.json").write_text(json.dumps(marker))
    assert resolve_resume(str(older), tmp_path, expected) == str(older)
    qwen3 = identity("ddp", "adamw", 1, resolve_shape("tiny-qwen3"))
    marker["model"] = {k: v for k, v in qwen3["model"].items() if k != "head_size"}
    (older / "hfscale_checkpoint.json").write_text(json.dumps(marker))
    with pytest.raises(HfscaleError, match="was saved with model"):  # 16-wide heads, where the run's are 32
        resolve_resume(str(older), tmp_path, qwen3)


@pytest.mark.parametrize("argv,expected", [
    (["sweep", "--strategy", "ddp,zero9"], "unknown strategy 'zero9'"),
    (["sweep", "--num_processes", "two"], "--num_processes takes positive integers, got 'two'"),
    (["sweep", "--mbs", "2,4"], "--mbs is now --per_device_train_batch_size (the Trainer's name"),
    (["parity", "--strategy", "zero7"], "unknown strategy 'zero7'"),
    (["parity", "--nproc", "2"], "--nproc is now --num_processes"),
    (["parity", "--strategy", "zero1,fsdp", "--", "--optim", "adafactor"],
     "strategy 'fsdp' cannot use optimizer 'adafactor'"),  # refused before ddp is launched
    (["parity", "--", "--optim", "adam9"], "unknown optimizer 'adam9'"),
    # what cannot run on one node's processes: refused before ddp is launched (under `all`, left out)
    (["parity", "--strategy", "zero1,fsdp_hybrid"], "fsdp_hybrid shards over a node's processes and replicates"),
    (["parity", "--strategy", "ddp_powersgd", "--num_processes", "1"], "ddp_powersgd compresses the gradient all-reduce"),
    # the training flags a command hands on are checked before it writes or launches anything
    (["parity", "--num_processes", "1", "--strategy", "zero1", "--", "--model", "gpt9"], "unknown model preset 'gpt9'"),
    (["parity", "--strategy", "zero1", "--", "--learning_rate=-1"], "--learning_rate must be >= 0, got -1.0"),
    (["sweep", "--repeats", "0", "--out", "runs/sw"], "sweep repeats must be a positive integer, got 0"),
    (["sweep", "--out", "runs/sw", "--", "--seq_len", "100000"], "--seq_len 100000 is longer than the model's 256 positions"),
    (["sweep", "--out", "runs/sw", "--", "--model", "tiny-bloom", "--attn_implementation", "sdpa"],
     "BloomForCausalLM has no 'sdpa' attention"),
    # a run file stands alone: these commands add flags of their own to the training flags
    (["sweep", "--out", "runs/sw", "--", "run.yaml"], "run.yaml: a run file stands alone"),
    (["tune", "--model", "tiny", "--num_processes", "2", "--out", "runs/tune", "--", "run.yaml"],
     "run.yaml: a run file stands alone"),
    (["slurm", "--nodes", "2", "--gpus_per_node", "8", "--out", "runs/slurm", "--", "run.json"],
     "run.json: a run file stands alone"),
    # an abbreviation would have set the axis the run's name says otherwise
    (["sweep", "--out", "runs/sw", "--", "--strat", "zero3"], "unknown flag --strat (did you mean --strategy?)"),
    (["sweep", "--out", "runs/sw", "--", "--lerning_rate", "0.1"],
     "unknown flag --lerning_rate (did you mean --learning_rate?)"),
    (["tune", "--model", "tiny", "--num_processes", "2", "--out", "runs/tune", "--", "--max_steps", "abc"],
     "argument --max_steps/--max-steps: invalid int value: 'abc'"),
    (["launch", "--strategy", "zero1", "--dry_run", "--bogus"], "unknown flag --bogus"),
    (["launch", "--strategy", "zero1", "--dry_run", "--train_files", "/nonexistent/corpus.txt"],
     "data file not found: /nonexistent/corpus.txt"),
    (["slurm", "--nodes", "2", "--gpus_per_node", "8", "--out", "runs/slurm", "--", "--n_head", "5"],
     "heads (5) must divide hidden size (64)"),
    (["slurm", "--nodes", "2", "--gpus_per_node", "8", "--out", "runs/slurm", "--", "--optimm", "adamw"],
     "unknown flag --optimm (did you mean --optim"),
    # refused by the training script the reference run launches (what depends on the run itself): no other strategy
    # launched, its folders removed
    (["parity", "--num_processes", "1", "--strategy", "zero1", "--", "--deepspeed", str(REPO / "ds_configs/zero1.json")],
     "--deepspeed is for the zero* strategies"),
    (["tune", "--gpus", "2"], "--gpus is now --num_processes"),
    (["export", "/nonexistent/checkpoint-9", "OUT"], "no such checkpoint directory"),
    (["export", str(REPO / "README.md"), "OUT"], f"is a file, not a checkpoint directory: give the folder that holds "
                                                 f"it ({REPO})"),
    (["import-logs", "/nonexistent/61B-megatron.out"], "log file not found"),
    (["import-logs", "."], ". is a directory, not a log file"),
    (["report", "/nonexistent/runs"], "no such run or sweep directory"),
    (["report", ".", "--target_loss", "nan"], "--target_loss must be a positive, finite loss, got nan"),
    (["report", ".", "--target_loss", "-1"], "--target_loss must be a positive, finite loss, got -1.0"),
    # the link flags are read only for the projected days: a bandwidth file given without them was silently ignored
    (["report", ".", "--bandwidth_file", "runs/bandwidth.json"], "--bandwidth_file is read only with --days_at_gpus"),
    # several machines: without this machine's rank and machine 0's address every launcher waits for ever
    (["launch", "--strategy", "zero1", "--num_machines", "2", "--dry_run"],
     "--num_machines 2 needs --machine_rank and --main_process_ip"),
    (["launch", "--strategy", "zero1", "--num_machines", "2", "--machine_rank", "2", "--main_process_ip", "n0",
      "--dry_run"], "--machine_rank must be 0 to 1 for --num_machines 2, got 2"),
    # a tune with nothing to run: refused, nothing written (no OUT/tune.md of pruned rows)
    (["tune", "--model", "tiny", "--num_processes", "2", "--strategy", "zero2_offload", "--optim", "adamw_8bit",
      "--out", "runs/tune"], "every configuration asked is refused by the strategy table: zero2_offload x adamw_8bit"),
    (["tune", "--model", "bigscience-176b", "--num_processes", "2", "--device", "V100-16GB", "--out", "runs/tune"],
     "nothing fits 2 process(es) here; the smallest is"),
    (["launch", "--strategy", "zero1", "--num_processes", "0", "--dry_run"], "--num_processes must be positive, got 0"),
    (["launch", "--strategy", "zero1", "--machine_rank", "-1", "--dry_run"], "--machine_rank must be 0 for --num_machines 1"),
    (["launch", "--strategy", "zero1", "--main_process_port", "70000", "--dry_run"],
     "--main_process_port must be 0 (a free port) to 65535, got 70000"),
    (["import-logs", REPO / "tests/data/61B-megatron-mbs-2-pp16-dp-1-gas-512-200977.out", "--params", "nan"],
     "--params must be positive, got nan"),
    (["parity", "--strategy", "zero1", "--tolerance", "nan"], "--tolerance must be positive, got nan"),
    (["parity", "--strategy", "zero1", "--timeout", "0"], "--timeout must be positive, got 0.0"),
    (["parity", "--strategy", "ddp"], "--strategy ddp: nothing to compare with ddp; name another strategy"),
    (["sweep", "--strategy", "ddp", "--", "--output_dir", "x"], "--output_dir is set by hfscale sweep (each run's "
                                                                 "folder under --out)"),  # before: "a sweep axis"
    (["strategies", "--matrx"], "unknown flag --matrx (did you mean --matrix?); `hfscale strategies --help` lists every flag"),
    (["estimate", "--model", "tiny", "--gpu", "8"], "unknown flag --gpu (did you mean --gpus?)"),
    # more GPUs than any cluster has: a typo, refused before the per-rank arithmetic (before: MemoryError, OverflowError)
    (["estimate", "--model", "tiny", "--gpus", str(2**40)], f"--gpus must be at most 1048576 (more GPUs than any "
                                                             f"cluster has), got {2**40}"),
    (["tune", "--model", "tiny", "--num_processes", str(10**20), "--dry_run"], "--num_processes must be at most 1048576"),
    (["slurm", "--nodes", "2", "--gpus_per_node", str(10**20), "--", "--strategy", "zero1"],
     "--gpus_per_node must be at most 1048576"),
    (["launch", "--strategy", "ddp", "--num_machines", str(10**20), "--machine_rank", "0", "--main_process_ip", "n0",
      "--dry_run"], "--num_machines must be at most 1048576"),
    (["slurm", "--nodes", "2", "--gpus_per_node", "8", "--python", "", "--", "--strategy", "zero1"],
     "--python is empty: name the interpreter that has hfscale"),
    # project's speed given twice (the tokens/s taken, the TFLOPs ignored), above the device's peak, with an unknown
    # attention (before: each accepted without a word)
    (["project", "--model", "tiny", "--tokens_per_s_per_gpu", "100", "--tflops_per_gpu", "100"],
     "give --tokens_per_s_per_gpu or --tflops_per_gpu, not both"),
    (["project", "--model", "tiny", "--tflops_per_gpu", "5000", "--device", "H100-80GB"],
     "--tflops_per_gpu 5000 is above the H100-80GB's 989 TFLOPs dense peak"),
    (["project", "--model", "tiny", "--tflops_per_gpu", "100", "--attn_implementation", "flash9"],
     "unknown attention implementation 'flash9'; choose one of: eager, sdpa"),
    # a rendezvous no machine can meet at (before: written into the launcher's command)
    (["launch", "--strategy", "ddp", "--num_machines", "2", "--machine_rank", "0", "--main_process_ip", "n0",
      "--main_process_port", "0", "--dry_run"], "--main_process_port 0 (a free port) is for one machine"),
    (["launch", "--strategy", "ddp", "--num_machines", "2", "--machine_rank", "0", "--main_process_ip", "node 0",
      "--dry_run"], "--main_process_ip 'node 0' is not one address"),
    # a value lost between two commas (before: dropped without a word)
    (["project", "--model", "tiny", "--gpus", "8,,16", "--tflops_per_gpu", "100"],
     "--gpus '8,,16' has an empty item: give the values separated by single commas"),
    # a 3D layout flag where no megatron* layout is weighed (before: ignored without a word)
    (["estimate", "--model", "tiny", "--strategy", "ddp", "--sequence_parallel"],
     "--sequence_parallel describes the 3D layouts: add megatron or megatron-deepspeed to --strategy"),
    (["project", "--model", "tiny", "--tflops_per_gpu", "100", "--recompute_granularity", "selective"],
     "--recompute_granularity describes the 3D layouts"),
    (["estimate", "--model", "tiny", "--strategy", "megatron", "--tp", "2", "--gpus", "2", "--recompute_granularity",
      "selective"], "--recompute_granularity selective is what --activation_checkpointing recomputes"),
    (["estimate", "--model", "tiny", "--strategy", "megatron", "--tp", "2", "--gpus", "2", "--dropout", "1"],
     "--dropout must be in [0, 1), got 1.0"),
    (["project", "--model", "tiny", "--tflops_per_gpu", "100", "--dropout", "-0.1"],
     "--dropout must be in [0, 1), got -0.1"),
    # an empty path (before: train's ranks raised makedirs(''); bandwidth measured and wrote nothing)
    (["train", "--model", "tiny", "--max_steps", "1", "--output_dir", ""], "--output_dir is empty: give a folder"),
    (["bandwidth", "--out", ""], "--out is empty: name a file"),
    (["peak", "--size", "-3"], "--size must be positive, got -3"),
    (["peak", "--size", "0"], "--size must be positive, got 0"),
    (["peak", "--seconds", "nan"], "--seconds must be positive, got nan"),
    # matrices no host holds (before: torch's allocator error as a traceback)
    (["peak", "--size", "100000000"], "--size 100000000 needs 120,000,000.0 GB for its three fp32 matrices, more "
                                      "than the host's available"),
])
def test_other_commands_refuse_bad_input(tmp_path, argv, expected, hfscale_cli):
    proc = hfscale_cli(argv, cwd=tmp_path)
    _check_refused(proc, expected, tmp_path / "runs")
    assert not (tmp_path / "OUT").exists()


def test_a_tune_whose_every_trial_this_host_cannot_start_is_refused_in_one_line(tmp_path, hfscale_cli, monkeypatch):
    """A model that fits the --device the tune plans for but not this host's RAM, which each trial's own start-up
    checks: refused before anything is written (before: every trial recorded as refused, and the tune ended with exit
    1 and a table of refusals). The host is made 16 GB here, whatever this machine has."""
    import psutil

    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(total=16 * 10**9, available=16 * 10**9))
    out = tmp_path / "tune"
    proc = hfscale_cli(["tune", "--model", "bloom-7b1", "--n_layer", "5", "--num_processes", "2", "--strategy", "ddp",
                        "--out", str(out)])
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr[-2000:]
    line, = proc.stderr.strip().splitlines()
    assert line.startswith("hfscale: error: every trial would be refused as it starts on this machine: "
                           "ddp-adamw-np2-mbs1-gas1: the model states alone need") and "this host has 16.0 GB" in line
    assert not out.exists()


def test_export_of_a_run_directory_without_a_usable_checkpoint_names_them(tmp_path, hfscale_cli):
    """A run's output directory stands for its newest complete, intact checkpoint (tests/test_faults.py exports one);
    one whose saves were all interrupted is one line naming them, nothing written."""
    for step in (2, 4):
        (tmp_path / "run" / f"checkpoint-{step}").mkdir(parents=True)
    proc = hfscale_cli(["export", "run", "OUT"], cwd=tmp_path)
    _check_refused(proc, "run: a run directory without a complete, intact checkpoint (checkpoint-2, checkpoint-4: "
                         "interrupted or damaged saves)", tmp_path / "OUT")


def test_malformed_sweep_spec(tmp_path, hfscale_cli):
    spec = tmp_path / "sweep.yaml"
    spec.write_text("strategy: [ddp]\nbatch: 4\n")
    proc = hfscale_cli(["sweep", "--spec", str(spec), "--out", str(tmp_path / "sw")])
    _check_refused(proc, "unknown key(s) batch", tmp_path / "sw")
    spec.write_text("strategies: [ddp]\ngrad_accum: [1, 2]\n")  # a spec written for the old names
    proc = hfscale_cli(["sweep", "--spec", str(spec), "--out", str(tmp_path / "sw")])
    _check_refused(proc, "grad_accum is now gradient_accumulation_steps", tmp_path / "sw")


def test_malformed_deepspeed_json(tmp_path, hfscale_cli):
    bad = tmp_path / "bad.json"
    bad.write_text('{"zero_optimization": {"stage": 1,,}')
    out = tmp_path / "out"
    proc = hfscale_cli(["train", "--strategy", "zero1", "--deepspeed", str(bad), "--output_dir", str(out)])
    _check_refused(proc, f"{bad}: malformed DeepSpeed JSON", out)


def test_deepspeed_json_contradicting_trainer_flags(tmp_path):
    """transformers would raise this only once training starts (and with a traceback): refused up front."""
    config = json.loads((REPO / "ds_configs" / "zero1.json").read_text())
    config["gradient_clipping"] = 0.5
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps(config))
    out = tmp_path / "out"
    proc = run([sys.executable, "-m", "hfscale.train", "--strategy", "zero1", "--deepspeed", str(mine), "--output_dir", str(out)])
    _check_refused(proc, f"{mine}: values that contradict the Trainer flags: ds gradient_clipping=0.5 vs hf max_grad_norm=1.0", out)


def test_missing_text_column(tmp_path, hfscale_cli):
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"body": "some text " * 50}) for _ in range(20)))
    out = tmp_path / "out"
    proc = hfscale_cli(["train", "--train_files", str(data), "--output_dir", str(out), "--cache_dir",
                        str(tmp_path / "cache")])
    _check_refused(proc, "record 1 has no text column 'text' (['body'])", out)  # found when the run is parsed


def test_malformed_run_file(tmp_path, hfscale_cli):
    bad = tmp_path / "run.yaml"
    bad.write_text("strategy: [zero1\n")
    proc = hfscale_cli(["train", str(bad)])
    assert proc.returncode == 2 and f"{bad}: malformed YAML" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("text,expected", [
    ("max_steps: abc\n", "max_steps takes an integer, got \"abc\""),
    ("max_steps: 2.5\n", "max_steps takes an integer, got 2.5"),
    ("max_steps: true\n", "max_steps takes an integer, got true"),
    ("learning_rate: fast\n", "learning_rate takes a number, got \"fast\""),
    ("bf16: maybe\n", "bf16 takes true or false, got \"maybe\""),
    ("per_device_train_batch_size: [1, 2]\n", "per_device_train_batch_size takes one value, got [1, 2]"),
    ("model: {name: tiny}\n", "model takes one value, got {\"name\": \"tiny\"}"),
    ("lr_scheduler_type: wobbly\n", "lr_scheduler_type: unknown value \"wobbly\"; choose one of: linear, cosine"),
    ("lerning_rate: 0.1\nmax_stepz: 3\n", "unknown keys lerning_rate (did you mean learning_rate?), max_stepz (did you mean "
                                          "max_steps?); `hfscale train --help` lists every flag"),
])
def test_a_run_file_value_of_the_wrong_kind_is_one_line(tmp_path, hfscale_cli, text, expected):
    """A run file's values go through their flags' own types and choices, as on the command line."""
    path = tmp_path / "run.yaml"
    path.write_text(text)
    _check_refused(hfscale_cli(["train", str(path)], cwd=tmp_path), f"{path}: {expected}", tmp_path / "runs")


def test_a_run_file_reads_as_its_flags_would(tmp_path):
    """Lists, mappings and YAML's strings for numbers where the fields take them: the same plan as the flags."""
    from hfscale.train import check_args

    data = tmp_path / "d.txt"
    data.write_text("some text to train on\n")
    path = tmp_path / "run.yaml"
    path.write_text(f"max_steps: 3\nreport_to: [none]\nlr_scheduler_kwargs: {{min_lr_rate: 0.2}}\n"
                    f"train_files: [{data}]\nlearning_rate: 1e-3\nper_device_train_batch_size: 2.0\nbf16: true\n")
    flags = ["--max_steps", "3", "--report_to", "none", "--lr_scheduler_kwargs", '{"min_lr_rate": 0.2}', "--train_files",
             str(data), "--learning_rate", "1e-3", "--per_device_train_batch_size", "2", "--bf16"]
    (_, from_file, file_kw, file_state), (_, from_flags, flag_kw, flag_state) = check_args([str(path)]), check_args(flags)
    assert from_file.train_files == from_flags.train_files == [str(data)]
    for key in ("max_steps", "learning_rate", "per_device_train_batch_size", "bf16"):
        assert file_kw[key] == flag_kw[key] and type(file_kw[key]) is type(flag_kw[key]), key
    assert file_state.plan == flag_state.plan
    assert file_kw["lr_scheduler_kwargs"] == {"min_lr_rate": 0.2} and file_kw["report_to"] in (["none"], "none")


# Launcher configs: `hfscale launch` checks them before `accelerate launch` starts anything.
LAUNCH_CASES = {
    "malformed YAML": ("distributed_type: MULTI_GPU\nnum_processes: [2\n", "malformed YAML"),
    "not a mapping": ("- DEEPSPEED\n", "expected a mapping at the top level"),
    "not UTF-8 text": (b"distributed_type: MULTI_GPU\n# \xff\xfe\n", "malformed YAML: not UTF-8 text"),  # a traceback
    "unknown distributed_type": ("distributed_type: MULTI_TPU9\n", "unknown distributed_type 'MULTI_TPU9'; choose one of: NO"),
    "unknown key": ("distributed_type: MULTI_GPU\nnum_gpus: 2\n", "unknown keys (['num_gpus'])"),
    "missing DeepSpeed JSON": ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: nowhere/z.json\n",
                               "deepspeed_config_file nowhere/z.json not found"),
    "contradicts --strategy": ("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n",
                               "--strategy zero1 contradicts the launcher's config, which asks for fsdp"),
}


@pytest.mark.parametrize("case", list(LAUNCH_CASES))
def test_bad_launcher_config_is_one_line(case, tmp_path, hfscale_cli):
    text, expected = LAUNCH_CASES[case]
    config = tmp_path / "launcher.yaml"
    config.write_bytes(text if isinstance(text, bytes) else text.encode())
    out = tmp_path / "out"
    proc = hfscale_cli(["launch", "--config_file", str(config), "--strategy", "zero1", "--output_dir", str(out)],
                       cwd=tmp_path)
    _check_refused(proc, expected, out)
    if "contradicts" not in expected:
        assert f"hfscale: error: {config}: " in proc.stderr  # the file is named


def test_launch_takes_the_training_flags_after_a_double_dash_too(tmp_path, hfscale_cli):
    """`hfscale launch ... -- TRAIN FLAGS`, as sweep, tune and slurm take them, is the same launch (before: "unknown
    flags --, --max_steps (did you mean --max_steps?)")."""
    base = ["launch", "--strategy", "ddp", "--num_processes", "2", "--dry_run"]
    plain = hfscale_cli([*base, "--max_steps", "3"], cwd=tmp_path)
    dashed = hfscale_cli([*base, "--", "--max_steps", "3"], cwd=tmp_path)
    assert plain.returncode == dashed.returncode == 0, dashed.stderr
    assert dashed.stdout == plain.stdout and plain.stdout.rstrip().endswith("train.py --strategy ddp --max_steps 3")


def test_launch_without_config_uses_the_shipped_one(tmp_path):
    """From any directory: the strategy's own launcher config and DeepSpeed JSON, by absolute path."""
    proc = run([sys.executable, "-m", "hfscale", "launch", "--strategy", "zero2", "--num_processes", "3", "--dry_run",
                "--model", "tiny"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    cmd = proc.stdout.split()
    assert cmd[cmd.index("--config_file") + 1] == str(REPO / "accelerate_configs" / "zero2.yaml")
    assert cmd[cmd.index("--deepspeed_config_file") + 1] == str(REPO / "ds_configs" / "zero2.json")
    assert cmd[cmd.index("--num_processes") + 1] == "3"
    assert cmd[-4:] == [str(REPO / "hfscale" / "train.py"), "--strategy", "zero2", "--model", "tiny"][-4:]


def test_content_checks_refuse_nothing_valid_beyond_their_sample(tmp_path):
    """The checks read each file's first MB: a large JSON array and a JSON-lines record longer than that are valid
    data and must pass (datasets reads the rest)."""
    from hfscale.run.data import CONTENT_SAMPLE_BYTES, check_file_content

    array = tmp_path / "big.json"
    array.write_text(json.dumps([{"text": "word " * 50} for _ in range(CONTENT_SAMPLE_BYTES // 200)]))
    long_record = tmp_path / "long.jsonl"
    long_record.write_text(json.dumps({"text": "x" * (2 * CONTENT_SAMPLE_BYTES)}) + "\n")
    text = tmp_path / "big.txt"
    text.write_text("é" * CONTENT_SAMPLE_BYTES)  # two-byte characters straddle the sample's end
    for path in (array, long_record, text):
        assert path.stat().st_size > CONTENT_SAMPLE_BYTES
        check_file_content(str(path), "text")
