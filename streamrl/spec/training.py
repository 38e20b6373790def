"""What a job trains and how: the model, the task, the reward, the algorithm, the pipeline
mode and checkpoints."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, StrictBool, ValidationInfo, field_validator, model_validator

from streamrl.spec.base import SpecModel

SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
"""A Kubernetes object name (DNS-1123 subdomain: claims, Secrets)."""
RELATIVE_PATH = r"^(([^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+)(/([^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+))*)?$"
"""A path inside a volume: relative, its parts neither empty nor `.` nor `..`."""


QUANTITY = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$"
"""A Kubernetes quantity of bytes (`50Gi`, `500M`)."""


class HfModelSource(SpecModel):
    """A model on the Hugging Face Hub (or the mirror HF_ENDPOINT names), downloaded once into a
    cache with huggingface_hub (the checkpoint volume's, in Kubernetes)."""

    repo: str = Field(min_length=1, max_length=200,
                      pattern=r"^[A-Za-z0-9][-A-Za-z0-9._]*(/[A-Za-z0-9][-A-Za-z0-9._]*)?$")
    """Repository id, e.g. `Qwen/Qwen2.5-7B-Instruct`."""
    revision: str = Field(default="main", min_length=1, max_length=200)
    """Branch, tag or commit hash."""
    token_secret: str | None = Field(default=None, min_length=1, max_length=253, pattern=SUBDOMAIN)
    """Kubernetes: a Secret of the job's namespace whose key `token` is a hub token, mounted as
    a file into the trainer's pods only (never an environment variable). Locally, huggingface_hub
    finds the token itself (HF_TOKEN, or what `hf auth login` stored)."""
    cache_size: str = Field(default="50Gi", pattern=QUANTITY, max_length=32)
    """Kubernetes, without a checkpoint volume: the size of the claim the operator makes for the
    hub cache (<job>-hf-cache), so a download outlives an evicted or restarted trainer pod.
    Size it to the repository: a 70B model in bf16 is about 140Gi. With a checkpoint volume
    the cache lives on that claim and this is not used."""
    cache_storage_class: str | None = Field(default=None, min_length=1, max_length=253)
    """Kubernetes: the storage class of the hub cache's claim (unset = the cluster's default)."""


class HfFileSource(SpecModel):
    """One file of a Hugging Face Hub dataset repository, downloaded once into the hub cache
    (the checkpoint volume's, in Kubernetes)."""

    repo: str = Field(min_length=1, max_length=200,
                      pattern=r"^[A-Za-z0-9][-A-Za-z0-9._]*(/[A-Za-z0-9][-A-Za-z0-9._]*)?$")
    """Dataset repository id, e.g. `org/math-prompts`."""
    revision: str = Field(default="main", min_length=1, max_length=200)
    """Branch, tag or commit hash."""
    file: str = Field(min_length=1, max_length=1024, pattern=RELATIVE_PATH)
    """The JSONL file's path in the repository, e.g. `train.jsonl`."""
    token_secret: str | None = Field(default=None, min_length=1, max_length=253, pattern=SUBDOMAIN)
    """Kubernetes: a Secret whose key `token` is a hub token (as model.hf.tokenSecret; a job
    names at most one)."""


class PvcFileSource(SpecModel):
    """Kubernetes: one file in a PersistentVolumeClaim of the job's namespace, mounted read-only
    into the trainer's pods only."""

    claim_name: str = Field(min_length=1, max_length=253, pattern=SUBDOMAIN)
    path: str = Field(min_length=1, max_length=1024, pattern=RELATIVE_PATH)
    """The file inside the claim."""


class PvcModelSource(SpecModel):
    """Kubernetes: a PersistentVolumeClaim of the job's namespace holding the model directory,
    mounted read-only into the trainer's pods only."""

    claim_name: str = Field(min_length=1, max_length=253, pattern=SUBDOMAIN)
    sub_path: str = Field(default="", max_length=1024, pattern=RELATIVE_PATH)
    """The model directory inside the claim (empty: its root)."""


class ImageModelSource(SpecModel):
    """Kubernetes: an OCI image holding the model directory, mounted read-only into the trainer's
    pods as an image volume (the ImageVolume feature: alpha in 1.31, beta in 1.33, on by default
    from 1.35; a `path` inside the image needs 1.33), or, with `mount: copy`, copied out by an
    init container running the image, on any version."""

    reference: str = Field(min_length=1, max_length=512, pattern=r"^[^\s]+$")
    """Image reference, e.g. `registry.example.com/models/qwen2.5-7b:v1` (a digest pins it)."""
    path: str = Field(default="", max_length=1024, pattern=RELATIVE_PATH)
    """The model directory inside the image (empty: its root)."""
    mount: Literal["volume", "copy"] = "volume"
    """`volume`: an image volume (no copy). `copy`: an init container running the image copies
    `path` into an emptyDir (the image needs a `cp`)."""


class ModelSpec(SpecModel):
    """The policy model. Only the trainer loads it; generators boot from the trainer."""

    source: Literal["builtin-tiny", "path", "hf", "pvc", "image"] = "builtin-tiny"
    """`builtin-tiny`: a small Llama-architecture model with a character tokenizer, built
    locally and warm-started on the task (no downloads). `path`: a Hugging Face causal-LM
    directory (config.json, safetensors, tokenizer) loaded with `from_pretrained`. `hf`: a Hub
    repository (`hf`), downloaded once. `pvc`, `image`: Kubernetes only, a claim (`pvc`) or an
    OCI image (`image`) holding such a directory."""
    path: str | None = None
    """Directory of the Hugging Face model when source is `path`."""
    hf: HfModelSource | None = None
    """The repository when source is `hf`."""
    pvc: PvcModelSource | None = None
    """The claim when source is `pvc`."""
    image: ImageModelSource | None = None
    """The image when source is `image`."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype for generation and training."""
    warm_start_steps: int = Field(default=600, ge=0)
    """Supervised steps on the task before RL, for `builtin-tiny` (0 = none); the result is cached."""
    seed: int = 0
    """Seed of the built-in model's initialisation and warm start."""

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        for name in ("path", "hf", "pvc", "image"):
            given = getattr(self, name) is not None
            if self.source == name and not given:
                raise ValueError(f"{name} is required when source is '{name}'")
            if self.source != name and given:
                raise ValueError(f"{name} is only used when source is '{name}'")
        return self


class TaskName(StrEnum):
    counting = "counting"
    counting_ramp = "counting-ramp"
    addition = "addition"
    jsonl = "jsonl"


class TaskSpec(SpecModel):
    """Where prompts and their reference answers come from."""

    name: TaskName = TaskName.counting
    """Built-in synthetic task (`counting`, `addition`; `counting-ramp`: counting with spans
    spread evenly, whose lengths ramp up steadily under `curriculum`) or `jsonl` (prompts
    from a file)."""
    path: str | None = None
    """JSONL file with one {"prompt": str, "answer": str} object per line, for `jsonl`."""
    hf: HfFileSource | None = None
    """For `jsonl`, instead of `path`: the file in a Hugging Face Hub dataset repository."""
    pvc: PvcFileSource | None = None
    """For `jsonl`, instead of `path`, Kubernetes only: the file in a claim."""
    num_prompts: int = Field(default=1024, ge=1)
    """Number of distinct prompts generated by a built-in task."""
    seed: int = 0
    """Seed of the built-in task's prompt generator and of the dataset order."""
    curriculum: StrictBool = False
    """Walk each epoch shortest reference answer first (a length curriculum), instead of
    in random order: output lengths grow as the run goes on, as they do in long RL runs."""

    @model_validator(mode="after")
    def _path_matches_name(self) -> TaskSpec:
        given = [k for k in ("path", "hf", "pvc") if getattr(self, k) is not None]
        if self.name == TaskName.jsonl and not given:
            raise ValueError("path, hf or pvc is required when name is 'jsonl'")
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)}: a task's file comes from one of path, hf and pvc")
        if self.name != TaskName.jsonl and (self.hf or self.pvc):
            raise ValueError(f"{'hf' if self.hf else 'pvc'} is only used when name is 'jsonl'")
        return self


class RewardSpec(SpecModel):
    """How a completion is scored against the prompt's reference answer."""

    function: str = "exact-match"
    """A registered reward (`exact-match`, `numeric`, `prefix-match`) or `module:function`
    taking (completion: str, answer: str) and returning a float."""
    on_error: Literal["fail", "zero"] = "fail"
    """When the function raises on a completion: `fail` stops the run with the error, the
    prompt and the completion named (nothing is trained on a sample that was not scored);
    `zero` scores that sample 0, counts it (`num_samples_reward_failed`) and logs it."""


class ImportanceSamplingSpec(SpecModel):
    """Correction of the train/inference mismatch: the engine that sampled a token and the
    learner disagree on its probability (different kernels, precision, a stale version). With
    a mode other than `none` the PPO ratio is taken against the learner's own log-probability
    before this step (so it clips only what the learner changed), and each token's loss is
    weighted by the probability ratio learner/engine, truncated or masked at `cap` (TRL's
    `vllm_importance_sampling_*`; Yao et al., truncated importance sampling)."""

    mode: Literal["none", "token-truncate", "sequence-truncate", "sequence-mask"] = "none"
    """`none`: the PPO ratio against the engine's log-probabilities, no weight. `token-truncate`:
    each token weighted by its ratio, at most `cap`. `sequence-truncate`: every token of a
    sample by the product of its tokens' ratios, at most `cap`. `sequence-mask`: by that
    product, and a sample whose product exceeds `cap` is left out of the loss."""
    cap: float = Field(default=3.0, gt=1, le=1000)
    """The largest weight (truncate), or the product above which a sample is dropped (mask)."""


class AlgorithmSpec(SpecModel):
    """The RL algorithm and its hyper-parameters."""

    type: Literal["grpo", "ppo"] = "grpo"
    """`grpo`: each sample's advantage is its reward against its group's (no critic). `ppo`: a
    critic (a value head on the policy's architecture, started from the policy's weights,
    sharded and stepped beside it) values every completion token, and each token's advantage
    is its generalised advantage estimate (GAE, gamma and gaeLambda) from the sample's reward
    at its last token; the critic learns the returns."""
    num_iterations: int = Field(default=20, ge=1)
    """Optimizer steps (= iterations) of the run."""
    prompts_per_step: int = Field(default=16, ge=1)
    """Prompts per iteration; each yields a group of group_size samples."""
    group_size: int = Field(default=8, ge=1)
    """Samples per prompt; grpo's advantages are normalised within a group, so it needs 2 or
    more (ppo's critic gives each sample its own baseline: 1 is allowed)."""
    learning_rate: float = Field(default=2e-4, gt=0)
    """AdamW learning rate."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW weight decay."""
    max_grad_norm: float = Field(default=1.0, gt=0)
    """Gradient clipping threshold (L2 norm)."""
    clip_eps: float = Field(default=0.2, gt=0, lt=1)
    """PPO clip range below 1: the ratio is clipped to [1 - clip_eps, 1 + clip_eps_high]."""
    clip_eps_high: float = Field(default=0.28, gt=0)
    """PPO clip range above 1."""
    kl_coef: float = Field(default=0.0, ge=0)
    """Weight of the KL penalty to the initial policy (k3 estimator); 0 = no reference model."""
    loss_aggregation: Literal["sequence-mean", "token-sum"] = "token-sum"
    """`sequence-mean`: each sample's token-mean loss, averaged over samples (GRPO).
    `token-sum`: token losses summed and divided by samples x max_new_tokens, a constant
    (Dr. GRPO), which removes the length bias and is known before the batch completes."""
    warmup_steps: int = Field(default=0, ge=0)
    """Linear learning-rate warm-up over this many optimizer steps."""
    scale_advantages: StrictBool = True
    """Divide group-centred rewards by the group's standard deviation."""
    temperature: float = Field(default=1.0, gt=0)
    """Sampling temperature; log-probabilities are taken at the same temperature."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling mass (1 = off)."""
    max_new_tokens: int = Field(default=96, ge=1)
    """Maximum completion length, tokens."""
    micro_batch_size: int = Field(default=32, ge=1)
    """Maximum samples per forward/backward pass of the learner."""
    seed: int = 0
    """Seed of sampling and training."""
    gamma: float = Field(default=1.0, gt=0, le=1)
    """ppo: discount per token (1 = the reward counts fully at every token)."""
    gae_lambda: float = Field(default=0.95, ge=0, le=1)
    """ppo: GAE's lambda (1 = Monte-Carlo returns less the values; 0 = one-step TD)."""
    critic_learning_rate: float | None = Field(default=None, gt=0)
    """ppo: AdamW learning rate of the critic (unset = learningRate)."""
    importance_sampling: ImportanceSamplingSpec = Field(default_factory=ImportanceSamplingSpec)
    """Correction of the mismatch between the engine's and the learner's log-probabilities;
    the mismatch itself is measured every iteration either way (metrics.jsonl `mismatch_*`)."""

    @field_validator("group_size")
    @classmethod
    def _grpo_compares_within_a_group(cls, value: int, info: ValidationInfo) -> int:
        if value < 2 and info.data.get("type", "grpo") == "grpo":
            raise ValueError(f"{value} sample per prompt leaves grpo nothing to compare a sample with (its advantage "
                             "is its reward against its group's): 2 or more, or type ppo")
        return value


class PipelineMode(StrEnum):
    colocated = "colocated"
    batch = "batch"
    stream_sync = "stream-sync"
    stream_async = "stream-async"


class PipelineSpec(SpecModel):
    """How generation and training are overlapped."""

    mode: PipelineMode = PipelineMode.stream_sync
    """`colocated`: one process alternates generate -> train. `batch`: disaggregated, the
    trainer waits for the whole batch. `stream-sync`: disaggregated, the trainer runs
    forward/backward on micro-batches of finished groups while generation continues;
    one optimizer step per batch (on-policy). `stream-async`: as stream-sync, but
    generators already produce the next iterations with the weights they hold while the
    trainer trains, so neither stage waits (off-policy by at most maxStaleness versions)."""
    min_micro_batch_size: int = Field(default=8, ge=1)
    """Streaming modes: the learner starts a micro-batch once this many samples of complete
    groups are waiting (fewer when the iteration has fewer left)."""
    max_staleness: int = Field(default=1, ge=1)
    """stream-async: the largest allowed difference between the trainer's policy_version
    when it consumes a sample and the sample's policy_version. Enforced when work is
    handed out and again when a sample is consumed (a too-stale sample is dropped and its
    prompt re-issued). Synchronous modes are on-policy (staleness 0)."""
    in_flight_updates: StrictBool = False
    """stream-async only: how a generator takes a new version that arrives while requests
    run. false (drain-then-update): it stops admitting requests, lets the running ones
    finish on the version they started on, then loads and admits again, so every sample
    comes from one version. true (in-flight): it pauses in place, loads, and resumes; the
    running requests continue on the new weights, their KV cache kept, so a sample may mix
    versions. Each sample carries the version of each of its tokens (run-length, on the
    wire and in metrics.jsonl); its policy_version, from which staleness counts, is its
    oldest token's."""

    @model_validator(mode="after")
    def _in_flight_needs_stream_async(self) -> PipelineSpec:
        if self.in_flight_updates and self.mode != PipelineMode.stream_async:
            raise ValueError(f"inFlightUpdates: true needs mode stream-async (mode is {self.mode.value}): only there "
                             "do generators run requests while a new version arrives")
        return self

    @property
    def staleness(self) -> int:
        """The staleness bound in force for this mode."""
        return self.max_staleness if self.mode == PipelineMode.stream_async else 0

    @property
    def streaming(self) -> bool:
        """The learner consumes groups as they finish (not the whole batch at once)."""
        return self.mode in (PipelineMode.stream_sync, PipelineMode.stream_async)




class CheckpointVolumeSpec(SpecModel):
    """Kubernetes: where checkpoints (and the run's records) outlive a trainer pod."""

    claim_name: str | None = Field(default=None, min_length=1, max_length=253,
                                   pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    """An existing PersistentVolumeClaim to use; unset = the operator creates one
    (<job>-checkpoints) with `size`, `storageClass` and `accessMode`."""
    size: str = Field(default="20Gi", pattern=QUANTITY)
    """Size of the claim the operator creates (a Kubernetes quantity)."""
    storage_class: str | None = Field(default=None, min_length=1, max_length=253)
    """Storage class of the claim the operator creates (unset = the cluster's default)."""
    access_mode: Literal["ReadWriteOnce", "ReadWriteMany"] | None = None
    """Unset = ReadWriteOnce for a one-pod trainer, ReadWriteMany for trainer.nodes > 1 (every
    rank writes its own shard, from every node)."""
    retain: StrictBool = True
    """Keep the claim the operator created when the RLJob is deleted (false: delete it too)."""


class CheckpointSpec(SpecModel):
    """Resumable checkpoints: the sharded model and optimizer (torch.distributed.checkpoint),
    the LR schedule, every rank's RNG state, the policy version, the iteration, the prompt
    cursor and the ledger of prompts dispatched and trained, in <out>/checkpoints/iter-NNNNN.
    A trainer that starts and finds one resumes from it."""

    every_iterations: int = Field(default=10, ge=0)
    """Save every N iterations (0 = only on SIGTERM). Saving overlaps training (the state is
    copied off the model, then written by a background thread)."""
    keep: int = Field(default=2, ge=1, le=100)
    """The newest checkpoints kept on disk (older ones are deleted once a newer one is whole)."""
    volume: CheckpointVolumeSpec | None = None
    """Kubernetes: a PersistentVolumeClaim mounted as every trainer pod's run directory (the
    checkpoints and the records a resumed run continues). Unset = the pod's own disk: a
    restarted pod starts over."""
