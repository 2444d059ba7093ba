"""One training run: arguments, data, model, the Trainer subclass and its callbacks, live measurement, saved
checkpoints, the results file, export. `hfscale/train.py` reads them top to bottom."""
