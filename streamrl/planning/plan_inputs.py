"""What `streamrl plan` reads besides the job, from its flags: the GPU budget per datacenter,
the model's shape, measured profiles by GPU type. Each parser names the flag it read when the
input is bad."""

from __future__ import annotations

import re
from pathlib import Path

from streamrl.planning.catalog import Catalog
from streamrl.planning.planner import Budget
from streamrl.planning.profile_record import Profile, load_profile
from streamrl.planning.shape import ModelShape
from streamrl.spec import RLJobSpec

DEFAULT_DATACENTER = "dc"
_BUDGET = re.compile(r"^(?:(?P<dc>[a-z0-9]([-a-z0-9.]*[a-z0-9])?):)?(?P<types>.+)$")


def parse_budget(values: list[str], catalog: Catalog) -> Budget:
    """`--gpus [DC:]TYPE=COUNT[,TYPE=COUNT...]`, repeatable: GPUs available per datacenter and type."""
    if not values:
        raise ValueError("--gpus: say which GPUs are available, e.g. --gpus H20=64,H800=32 (one datacenter) or "
                         "--gpus east:H800=32 --gpus west:H20=64 (two)")
    budget: Budget = {}
    for value in values:
        match = _BUDGET.match(value.strip())
        if not match:
            raise ValueError(f"--gpus {value!r}: expected [DATACENTER:]TYPE=COUNT[,TYPE=COUNT...] (a datacenter "
                             "name is a lowercase DNS name)")
        dc = match["dc"] or DEFAULT_DATACENTER
        for item in match["types"].split(","):
            name, _, count = item.partition("=")
            if not count.strip().isdigit():
                raise ValueError(f"--gpus {value!r}: {item!r} is not TYPE=COUNT")
            gpu = catalog.gpu(name.strip(), field="--gpus")
            budget.setdefault(dc, {})
            budget[dc][gpu.name] = budget[dc].get(gpu.name, 0) + int(count)
    return budget


def parse_mapping(values: list[str], flag: str) -> dict[str, str]:
    """`KEY=VALUE` flags, repeatable."""
    out = {}
    for value in values or []:
        key, sep, val = value.partition("=")
        if not sep or not key or not val:
            raise ValueError(f"{flag} {value!r}: expected KEY=VALUE")
        out[key] = val
    return out


def model_shape(spec: RLJobSpec, catalog: Catalog, override: str | None = None) -> ModelShape:
    """The shape of the model the job trains: `--model` (a catalog name, a config.json or a model
    directory), else the job's model directory's config.json, else the built-in model's config."""
    if override:
        if Path(override).exists():
            return ModelShape.from_hf_config(override)
        return catalog.model(override)
    if spec.model.source == "path":
        assert spec.model.path is not None  # the spec requires it with this source
        return ModelShape.from_hf_config(spec.model.path)
    from streamrl.models import CHARS, SPECIAL_TOKENS, TINY_CONFIG

    c = TINY_CONFIG
    return ModelShape(name="builtin-tiny", num_layers=c["num_hidden_layers"], hidden_size=c["hidden_size"],
                      num_heads=c["num_attention_heads"], num_kv_heads=c["num_key_value_heads"],
                      vocab_size=len(SPECIAL_TOKENS) + len(CHARS), intermediate_size=c["intermediate_size"],
                      tie_word_embeddings=c["tie_word_embeddings"], source="streamrl/models.py TINY_CONFIG")


def profiles_by_type(values: list[str], catalog: Catalog) -> dict[str, tuple[Path, Profile]]:
    """`--profile [TYPE=]FILE`, repeatable: a measured profile replaces the roofline for its GPU
    type (TYPE, or the type the profile was measured as: `streamrl profile --gpu-type`)."""
    out: dict[str, tuple[Path, Profile]] = {}
    for value in values or []:
        name, sep, path = value.partition("=")
        if not sep:
            name, path = "", value
        profile = load_profile(path)
        name = name or profile.hardware.gpu_type or ""
        if not name:
            raise ValueError(f"--profile {value}: the profile names no GPU type (measure with --gpu-type TYPE, or "
                             "write --profile TYPE=FILE)")
        gpu = catalog.gpu(name, field="--profile")
        out[gpu.name] = (Path(path), profile)
    return out
