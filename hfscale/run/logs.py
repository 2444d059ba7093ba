"""The run's console: hfscale's lines at INFO on rank 0, the libraries at WARNING, and the library noise that says
nothing about the run dropped, each message matched precisely (every other warning stays visible)."""

import logging
import sys
import warnings


# Library output that says nothing about the run, each matched precisely (every other warning stays visible):
WARNING_NOISE = [
    # torch 2.13 deprecates the *_tensor collectives that DeepSpeed 0.19 and FSDP2 still call, on every step
    (FutureWarning, r"`torch\.distributed\.\w+` is deprecated"),
]
LOG_NOISE = {
    # bitsandbytes' optional CPU 4-bit kernels (the `kernels` package); hfscale uses no 4-bit layers
    "bitsandbytes.backends.cpu.ops": "kernels-community",
    # torchao's optional compiled kernels (MX-FP8, CUTLASS) that do not load into a torch without them; AdamW8bit
    # (fsdp* x adamw_8bit) is torch.compile'd and uses none of them
    "torchao": "Failed to load",
    # torchao registers two Enums with torch.compile the pre-2.13 way, once per process
    "torch.utils._pytree": "is an Enum subclass and is now natively supported by torch.compile",
}


class _DropMessage(logging.Filter):
    def __init__(self, fragment: str):
        super().__init__()
        self.fragment = fragment

    def filter(self, record: logging.LogRecord) -> bool:
        return self.fragment not in record.getMessage()


def quiet_libraries() -> None:
    """Drop the library noise above, before the libraries are imported."""
    for category, pattern in WARNING_NOISE:
        warnings.filterwarnings("ignore", message=pattern, category=category)
    for name, fragment in LOG_NOISE.items():
        logging.getLogger(name).addFilter(_DropMessage(fragment))


def setup_logging(args) -> None:
    """hfscale's lines at INFO on rank 0; the libraries at WARNING (transformers' INFO is a config dump per model and
    per save), errors only on the other ranks. (datasets, with pandas and pyarrow, is imported here: a run refused by
    its checks never needs it.)"""
    import datasets
    import transformers

    level = logging.INFO if args.process_index == 0 else logging.WARNING
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=level, stream=sys.stdout)
    transformers.utils.logging.set_verbosity(logging.WARNING if args.process_index == 0 else logging.ERROR)
    datasets.utils.logging.set_verbosity(logging.WARNING)
    datasets.disable_progress_bars()
