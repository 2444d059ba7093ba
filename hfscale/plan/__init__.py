"""Before launch: what a run will hold in memory (estimate), how long a token budget takes on N GPUs (project), and
which configuration to launch (tune). They read runs only through results.json and `hfscale.launching`."""
