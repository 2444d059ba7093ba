"""Where the shipped config folders live, and loading YAML/JSON with errors that name the file."""

import json
from pathlib import Path

import yaml

from .errors import HfscaleError

_PACKAGE = Path(__file__).resolve().parent
KINDS = ("strategies", "accelerate_configs", "ds_configs")


def config_dir(kind: str) -> Path:
    """The folder of one config kind: the copy shipped inside the package, else the repository's top level."""
    for candidate in (_PACKAGE / "_configs" / kind, _PACKAGE.parent / kind):
        if candidate.is_dir():
            return candidate
    raise HfscaleError(f"hfscale is installed without its {kind}/ folder (looked in {_PACKAGE})")


def load_yaml(path: Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise HfscaleError(f"{path}: file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise HfscaleError(f"{path}: malformed YAML: {' '.join(str(err).split())}") from None
    if not isinstance(data, dict):
        raise HfscaleError(f"{path}: malformed YAML: expected a mapping at the top level")
    return data


def load_json(path: Path, what: str = "JSON") -> dict:
    path = Path(path)
    if not path.is_file():
        raise HfscaleError(f"{path}: file not found")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise HfscaleError(f"{path}: malformed {what}: {err}") from None
    if not isinstance(data, dict):
        raise HfscaleError(f"{path}: malformed {what}: expected an object at the top level")
    return data
