"""Running at cluster scale: SLURM job scripts (slurm.py)."""
