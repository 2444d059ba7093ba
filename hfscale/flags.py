"""Command-line values every hfscale command reads the same way: comma-separated lists of a flag's values, on/off
values, the flags renamed to the Trainer's names (refused for one release with a one-line hint), and the training
flags a command passes on to its runs (after `--`: a flag's value, the list without it).

One vocabulary: a planner's flag has the name of the training flag it stands for (`--per_device_train_batch_size`,
`--gradient_accumulation_steps`, `--activation_checkpointing`, `--bf16`, ...), and a list of values is that flag with
comma-separated values (`--per_device_train_batch_size 1,2,4`, `--strategy zero1,zero3` or `all`).
"""

from pathlib import Path

from .errors import HfscaleError, one_of
from .files import is_run_file, read_run_file

ALL = "all"
BOOLEANS = {"true": True, "on": True, "yes": True, "1": True, "false": False, "off": False, "no": False, "0": False}

# Old spelling -> the name it has now (0.1 -> 0.2); refused with a hint until the next release drops this table.
RENAMED = {
    "--mbs": "--per_device_train_batch_size",
    "--micro_batch_size": "--per_device_train_batch_size",
    "--micro_batch_sizes": "--per_device_train_batch_size",
    "--grad_accum": "--gradient_accumulation_steps",
    "--gas": "--gradient_accumulation_steps",
    "--checkpointing": "--activation_checkpointing",
    "--strategies": "--strategy",
    "--optims": "--optim",
    "--nprocs": "--num_processes",
    "--nproc": "--num_processes",
    "--steps": "--max_steps",
}


def refuse_renamed(argv: list[str], renamed: dict[str, str] | None = None) -> None:
    """One line for a flag that has been renamed (`--mbs 4` or `--mbs=4`) - never a silent wrong value."""
    for arg in argv:
        if arg == "--":
            return  # what follows belongs to the training script
        name = arg.split("=", 1)[0]
        new = (renamed or RENAMED).get(name)
        if new:
            raise HfscaleError(f"{name} is now {new} (the Trainer's name; lists are comma-separated values of it): "
                               f"{arg.replace(name, new, 1)}")


def comma_list(text, flag: str, kind=str, valid=None, what: str | None = None) -> list:
    """`a,b,c` -> [a, b, c] as `kind` (str, int, bool, float), each value once, in the order given; `all` -> every
    valid value. Checked: names against `valid` (`what` names them in the message: "unknown optimizer 'sgd'"), numbers
    positive; an empty list or item (`8,,16`: a value lost to a typo) is refused. One line naming the flag otherwise."""
    if isinstance(text, (list, tuple)):
        items = list(text)
    else:
        items = [t.strip() for t in str(text).split(",")]
        if len(items) > 1 and not all(items):
            raise HfscaleError(f"{flag} {text!r} has an empty item: give the values separated by single commas")
        items = [t for t in items if t]
    if valid is not None and items == [ALL]:
        return list(valid)
    if not items:
        raise HfscaleError(f"{flag}: give at least one value")
    out = []
    for item in items:
        if kind is bool:
            value = item if isinstance(item, bool) else BOOLEANS.get(str(item).lower())
            if not isinstance(value, bool):
                raise HfscaleError(f"{flag} takes true/false (or on/off) values, got {item!r}")
        elif kind in (int, float):
            try:
                value = kind(item) if not isinstance(item, bool) else None
            except (TypeError, ValueError):
                value = None
            if value is None or not 0 < value < float("inf"):
                raise HfscaleError(f"{flag} takes positive {'integers' if kind is int else 'numbers'}, got {item!r}")
        else:
            value = str(item)
            if valid is not None and value not in valid:
                raise one_of(what or flag.lstrip("-").replace("_", " "), value, [*valid, ALL])
        out.append(value)
    return list(dict.fromkeys(out))  # a value named twice is one row, one run


def first_given(argv: list[str], flags) -> str | None:
    """The first of `flags` the command line names (`--flag v` or `--flag=v`; its parser takes no abbreviations), for
    a command that reads them only sometimes: given where they would not be read, they are refused, not ignored."""
    return next((a.split("=", 1)[0] for a in argv if a.split("=", 1)[0] in flags), None)


# A count of GPUs, processes or nodes above this is a typo, not a cluster (about five times the largest training
# clusters of 2026): refused where it is read, before the per-rank arithmetic behind it runs out of memory or overflows
MAX_GPUS = 1 << 20


def at_most_gpus(flag: str, *counts: int | None) -> None:
    """Each count (of GPUs, processes or nodes) is at most MAX_GPUS, or absent."""
    too_many = next((n for n in counts if n is not None and n > MAX_GPUS), None)
    if too_many is not None:
        raise HfscaleError(f"{flag} must be at most {MAX_GPUS} (more GPUs than any cluster has), got {too_many}")


def positive(opts, *names: str) -> None:
    """Each named option is positive and finite, or absent."""
    for name in names:
        value = getattr(opts, name)
        if value is not None and not 0 < value < float("inf"):
            raise HfscaleError(f"--{name} must be positive, got {value}")


def flag_value(args: list[str], name: str) -> str | None:
    """The value of `--name V` or `--name=V` in an argument list (None when absent)."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def bool_flag(args: list[str], name: str) -> bool:
    """A TrainingArguments switch in an argument list, as HfArgumentParser reads it: `--name` alone is true, `--name V`
    or `--name=V` is V (true/false, yes/no, 1/0); absent is false."""
    truth = ("true", "t", "yes", "y", "1")
    for i, arg in enumerate(args):
        if arg == name:
            value = args[i + 1] if i + 1 < len(args) else None
            return value is None or value.startswith("--") or value.lower() in truth
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1].lower() in truth
    return False


def train_flag(args: list[str], name: str) -> str | None:
    """A training flag's value, given as `--name V` or as a key of the run file the flags are."""
    if not is_run_file(args):
        return flag_value(args, name)
    data = read_run_file(Path(args[0]))
    value = data.get(name.lstrip("-")) if isinstance(data, dict) else None
    return None if value is None else str(value)


def drop_flag(args: list[str], name: str) -> list[str]:
    """args without `--name V` / `--name=V`."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == name:
            skip = True
        elif not arg.startswith(name + "="):
            out.append(arg)
    return out


def split_train_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the command's own flags, the training flags after `--`), as `hfscale sweep|parity|slurm ... -- TRAIN FLAGS`."""
    if "--" not in argv:
        return list(argv), []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]
