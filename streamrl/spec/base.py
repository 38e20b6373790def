"""The base of every spec model: frozen, unknown keys refused, camelCase on the wire
(Kubernetes style), each field's docstring kept (the CRD's descriptions come from them)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class SpecModel(BaseModel):
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
    )
