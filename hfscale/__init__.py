"""hfscale: choose how to train a GPT-2, BLOOM or Llama-shaped model at scale, and know what each choice costs."""

__version__ = "0.1.0"
