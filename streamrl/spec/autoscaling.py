"""Elastic generators: the autoscaler's mode, its inputs and its HPA-style behaviour."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from streamrl.spec.base import SpecModel


class ScalingPolicySpec(SpecModel):
    """At most `value` replicas per `periodSeconds` (as HPA's `type: Pods` policies)."""

    type: Literal["Pods"] = "Pods"
    """Only `Pods` (a number of replicas)."""
    value: int = Field(default=1, ge=1)
    """Replicas per period (when not given: 1, or `autoscaling.step` where that is more)."""
    period_seconds: int = Field(default=60, ge=1, le=1800)
    """The period, seconds."""


class ScalingRulesSpec(SpecModel):
    """One direction of scaling behaviour (HPA's `behavior.scaleUp` / `scaleDown`)."""

    stabilization_window_seconds: int = Field(default=0, ge=0, le=3600)
    """A recommendation must hold this long before it is acted on."""
    policies: list[ScalingPolicySpec] = Field(default_factory=lambda: [ScalingPolicySpec()], min_length=1,
                                              max_length=4)
    """Rate limits; every one must allow a step."""


class ScalingBehaviorSpec(SpecModel):
    scale_up: ScalingRulesSpec = Field(default_factory=ScalingRulesSpec)
    """Adding generator replicas."""
    scale_down: ScalingRulesSpec = Field(
        default_factory=lambda: ScalingRulesSpec(stabilization_window_seconds=300))
    """Removing generator replicas (a five-minute window by default, as HPA's)."""


class AutoscalingSpec(SpecModel):
    """Elastic generator capacity from the bubble metrics."""

    mode: Literal["Disabled", "Internal", "External"] = "Disabled"
    """`Internal`: StreamRL scales each pool itself; `External`: something else writes the
    RLJob's `/scale` (KEDA, an HPA); `Disabled`: replicas stay as written."""
    prometheus_url: str | None = Field(default=None, max_length=2048, pattern=r"^https?://")
    """Kubernetes: the Prometheus HTTP API the policy reads (default: the operator's)."""
    interval_seconds: int = Field(default=15, ge=1, le=3600)
    """How often the policy runs."""
    idle_threshold: float = Field(default=0.2, ge=0, le=1)
    """Remove a replica when generators idle for lack of work more than this fraction of the
    time while work is out (not at the iteration barrier, where every generator must wait for
    the optimizer step) and one replica fewer would keep generation within training's time."""
    hysteresis: float = Field(default=0.1, ge=0, lt=1)
    """A replica is removed on the times alone only when, with one fewer, generation would
    take at most (1 - hysteresis) of training's time: the band between the add and remove
    rules, so a reading's noise does not add back what the previous round removed."""
    min_utilisation: float = Field(default=1.0, gt=0, le=1)
    """Add a replica while generation is the bottleneck only if the generators would still
    be busy at least this fraction of the time with it. 1.0 is the published rule (the
    imbalance exceeds what one more replica saves: none sits partly idle); lower values
    spend replica-seconds to shrink the trainer's pipeline bubble sooner."""
    cooldown_seconds: int = Field(default=60, ge=0, le=3600)
    """After a change, no change in the opposite direction for this long: a replica just
    added is not removed (nor one just removed re-added) on one noisy reading."""
    step: int = Field(default=1, ge=1, le=64)
    """Replicas added or removed at once: the unit the cluster grows by (a data-parallel group
    of replicas, a node's worth), as the published method scales. The rules weigh what `step`
    replicas more or fewer would do; each rate policy's `value` must allow a step (one left
    unset does)."""
    behavior: ScalingBehaviorSpec = Field(default_factory=ScalingBehaviorSpec)
    """Stabilization windows and rate limits, with HPA's field names."""

    @model_validator(mode="after")
    def _policies_allow_a_step(self) -> AutoscalingSpec:
        for direction, rules in (("scaleUp", self.behavior.scale_up), ("scaleDown", self.behavior.scale_down)):
            for i, policy in enumerate(rules.policies):
                if "value" in policy.model_fields_set and policy.value < self.step:
                    raise ValueError(f"behavior.{direction}.policies[{i}].value: {policy.value} replicas per period "
                                     f"is below step {self.step}, so no step could ever be taken")
        return self
