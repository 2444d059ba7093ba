"""Where the shipped config folders live: strategies/, accelerate_configs/ and ds_configs/."""

from pathlib import Path

from ..errors import HfscaleError

_PACKAGE = Path(__file__).resolve().parent.parent
KINDS = ("strategies", "accelerate_configs", "ds_configs")


def config_dir(kind: str) -> Path:
    """The folder of one config kind: the copy shipped inside the package, else the repository's top level."""
    for candidate in (_PACKAGE / "_configs" / kind, _PACKAGE.parent / kind):
        if candidate.is_dir():
            return candidate
    raise HfscaleError(f"hfscale is installed without its {kind}/ folder (looked in {_PACKAGE})")
