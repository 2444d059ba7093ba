"""Where the shipped config folders live (strategies/, accelerate_configs/ and ds_configs/), and a launcher config
checked as `accelerate launch` would read it, with the DeepSpeed JSON it names."""

from pathlib import Path

from ..errors import HfscaleError, one_of
from ..files import load_yaml

_PACKAGE = Path(__file__).resolve().parent.parent
KINDS = ("strategies", "accelerate_configs", "ds_configs")


def config_dir(kind: str) -> Path:
    """The folder of one config kind: the copy shipped inside the package, else the repository's top level."""
    for candidate in (_PACKAGE / "_configs" / kind, _PACKAGE.parent / kind):
        if candidate.is_dir():
            return candidate
    raise HfscaleError(f"hfscale is installed without its {kind}/ folder (looked in {_PACKAGE})")


def check_accelerate_config(path) -> dict:
    """What `accelerate launch --config_file` would reject, as one line naming the file: missing, malformed YAML,
    not a mapping, an unknown distributed_type, keys accelerate does not know, a DeepSpeed JSON that is missing."""
    from accelerate.commands.config.config_args import load_config_from_file  # imports torch: only when asked
    from accelerate.utils import DistributedType

    config = load_yaml(path)

    kinds = [k.value for k in DistributedType]
    if config.get("distributed_type", "NO") not in kinds:
        raise HfscaleError(f"{path}: {one_of('distributed_type', config['distributed_type'], kinds)}")
    try:
        load_config_from_file(str(path))
    except (ValueError, TypeError, KeyError) as err:
        raise HfscaleError(f"{path}: {' '.join(str(err).split())}") from None
    return config


def launcher_deepspeed_json(config: dict, config_path: Path) -> str | None:
    """The DeepSpeed JSON a launcher config names, as a path that exists from here: as written (relative to the
    working directory, as accelerate reads it), else the copy shipped with hfscale under the same name."""
    name = (config.get("deepspeed_config") or {}).get("deepspeed_config_file")
    if config.get("distributed_type") != "DEEPSPEED" or not name:
        return None
    for candidate in (Path(name), config_dir("ds_configs") / Path(name).name):
        if candidate.is_file():
            return str(candidate.resolve())
    raise HfscaleError(f"{config_path}: deepspeed_config_file {name} not found (relative paths are read from the "
                       f"working directory; hfscale also ships ds_configs/{Path(name).name} only for its own names)")
