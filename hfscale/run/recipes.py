"""Pretraining defaults: what a from-scratch run uses when the user does not say otherwise.

The Trainer's own defaults are a fine-tuning recipe (5e-5, linear decay, no warmup, Adam beta2 0.999, no weight
decay): a model trained from scratch with them barely moves. hfscale fills, for every flag the user did not pass,
the recipe of the GPT-3 and BLOOM papers: a peak learning rate by model size, linear warmup, cosine decay to 10% of
the peak, AdamW betas (0.9, 0.95), weight decay 0.1, gradient clipping 1.0. docs/compare.md has the table.
"""

import math

# (parameters, peak learning rate) of published pretraining runs. GPT-3 (Brown et al. 2020, Table 2.1): 125M 6e-4,
# 350M 3e-4, 760M 2.5e-4, 1.3B 2e-4, 2.7B 1.6e-4, 6.7B 1.2e-4, 13B 1e-4, 175B 0.6e-4. BLOOM (BigScience 2022,
# Table 3) used the same values at its sizes (560M 3e-4, 1.1B 2.5e-4, 1.7B 2e-4, 3B 1.6e-4, 7.1B 1.2e-4, 176B 0.6e-4).
# Below 125M (test-sized models) the rate keeps rising to 1e-3 at 10M and below: tiny models take larger steps.
PEAK_LR = [(10e6, 1e-3), (125e6, 6e-4), (350e6, 3e-4), (760e6, 2.5e-4), (1.3e9, 2e-4), (2.7e9, 1.6e-4),
           (6.7e9, 1.2e-4), (13e9, 1e-4), (175e9, 0.6e-4)]
ADAFACTOR_LR = 1e-3  # T5's constant Adafactor rate with relative_step off (the Trainer turns relative_step off)
WARMUP_FRACTION = 0.02  # of the training steps (GPT-3: 375M of 300B tokens; short runs need relatively more)
MIN_LR_RATE = 0.1  # cosine decay to 10% of the peak (GPT-3, BLOOM)
ADAM_BETA2 = 0.95  # GPT-3, BLOOM (the Trainer's 0.999 is a fine-tuning value)
WEIGHT_DECAY = 0.1
MAX_GRAD_NORM = 1.0
LOG_POINTS = 50  # logging density: a short run still logs ~50 points of its loss curve
MAX_LOGGING_STEPS = 10  # and a long run at least every 10 steps (the Trainer's default 500 draws nothing)


def peak_learning_rate(params: float) -> float:
    """Log-linear interpolation of PEAK_LR in log(parameters)."""
    if params <= PEAK_LR[0][0]:
        return PEAK_LR[0][1]
    for (n0, lr0), (n1, lr1) in zip(PEAK_LR, PEAK_LR[1:]):
        if params <= n1:
            x = (math.log(params) - math.log(n0)) / (math.log(n1) - math.log(n0))
            return math.exp(math.log(lr0) + x * (math.log(lr1) - math.log(lr0)))
    return PEAK_LR[-1][1]


def logging_steps(max_steps: int) -> int:
    return max(1, min(MAX_LOGGING_STEPS, max_steps // LOG_POINTS)) if max_steps > 0 else MAX_LOGGING_STEPS


def pretraining_defaults(params: float, optim: str, max_steps: int) -> dict:
    """TrainingArguments values of the pretraining recipe for a model of `params` parameters."""
    adafactor = optim == "adafactor"
    return {
        "learning_rate": ADAFACTOR_LR if adafactor else peak_learning_rate(params),
        "lr_scheduler_type": "cosine_with_min_lr",
        "lr_scheduler_kwargs": {"min_lr_rate": MIN_LR_RATE},
        "warmup_steps": WARMUP_FRACTION,
        # transformers hands Adafactor the learning rate alone: no betas (a recipe value there would claim a setting)
        **({} if adafactor else {"adam_beta2": ADAM_BETA2}),
        "weight_decay": 0.0 if adafactor else WEIGHT_DECAY,  # Adafactor (T5) trains without weight decay
        "max_grad_norm": MAX_GRAD_NORM,
        "logging_steps": logging_steps(max_steps),
    }


def _size(params: float) -> str:
    return f"{params / 1e9:g}B" if params >= 1e9 else f"{params / 1e6:g}M"


# What `--help` says of each recipe flag: the Trainer's own default would be a lie in an hfscale run.
RECIPE_HELP = {
    "learning_rate": "by model size, log-linear between " + ", ".join(f"{_size(n)} {lr:g}" for n, lr in PEAK_LR)
                     + f"; adafactor {ADAFACTOR_LR:g}",
    "lr_scheduler_type": "cosine_with_min_lr",
    "lr_scheduler_kwargs": f'{{"min_lr_rate": {MIN_LR_RATE}}} (cosine decay to {MIN_LR_RATE:.0%} of the peak)',
    "warmup_steps": f"{WARMUP_FRACTION} ({WARMUP_FRACTION:.0%} of the steps)",
    "adam_beta2": f"{ADAM_BETA2}; adafactor reads none",
    "weight_decay": f"{WEIGHT_DECAY}; adafactor 0",
    "max_grad_norm": f"{MAX_GRAD_NORM}",
    "logging_steps": f"max_steps / {LOG_POINTS}, from 1 to {MAX_LOGGING_STEPS}",
}


def document_recipe(parser) -> None:
    """Say in an argparse parser's help what hfscale fills for each recipe flag the user leaves out."""
    for action in parser._actions:
        name = action.dest
        if name in RECIPE_HELP and action.help:
            ours = f"default: {RECIPE_HELP[name]}, hfscale's pretraining recipe (docs/compare.md)".replace("%", "%%")
            action.help = f"{action.help.rstrip()} ({ours}; the Trainer's own: %(default)s)"


def apply_defaults(training: dict, explicit: set[str], params: float, optim: str) -> tuple[dict, dict]:
    """(training keywords with the recipe filled where the user set nothing, {name: [value, source]}): source "flag"
    (the user's), "default" (the recipe's) or "trainer" (the Trainer's own default: the recipe's scheduler arguments
    are its cosine schedule's, so another --lr_scheduler_type keeps the Trainer's, which every scheduler accepts)."""
    out = dict(training)
    recipe = {}
    defaults = pretraining_defaults(params, optim, int(training.get("max_steps") or -1))
    for name, value in defaults.items():
        if name in explicit:
            recipe[name] = [training[name], "flag"]
        elif name == "lr_scheduler_kwargs" and str(out.get("lr_scheduler_type")) != defaults["lr_scheduler_type"]:
            recipe[name] = [training.get(name), "trainer"]
        else:
            out[name] = value
            recipe[name] = [value, "default"]
    return out, recipe
