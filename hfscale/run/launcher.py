"""`python -m hfscale.run.launcher ARGS` is `accelerate launch ARGS`, with Python's garbage collector off while the
launcher imports torch and accelerate, then one full collection and the survivors frozen (hfscale/run/garbage.py):
~0.5 CPU-s less per launch; the same launcher, flags and process tree. The command `hfscale launch`, sweep, tune,
parity and the SLURM script start (`launch.launch_command`); `accelerate launch` typed by hand is the stock one."""

import gc

from hfscale.run import garbage


def main() -> None:
    gc.disable()  # this process is the launcher's: nothing of a caller's to restore
    from accelerate.commands.launch import main as accelerate_launch

    garbage.settle()  # before collection is back on: its first young collection would walk every import again
    gc.enable()
    accelerate_launch()


if __name__ == "__main__":
    main()
