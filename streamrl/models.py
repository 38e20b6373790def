"""Policy models: the built-in tiny Llama with a character tokenizer, and loading any
Hugging Face causal-LM directory through the real `from_pretrained` path."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import string
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamrl.spec import ModelSpec, RLJobSpec

if TYPE_CHECKING:  # heavy imports stay lazy
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = string.digits + string.ascii_letters + " .,:;+-=*/()!?'\"#<>[]_"
TINY_CONFIG: dict[str, Any] = dict(
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=512,
    max_position_embeddings=256,
    tie_word_embeddings=True,
)
SMALL_CONFIG: dict[str, Any] = dict(
    hidden_size=512,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=8,
    intermediate_size=2048,
    max_position_embeddings=512,
    tie_word_embeddings=True,
)
"""The same architecture at ~34 M parameters: big enough that sharding the trainer pays
(bench/trainer_scale.py), small enough for a CPU."""
BUILTIN_CONFIGS = {"tiny": TINY_CONFIG, "small": SMALL_CONFIG}
# Bump when the built-in model or its warm start changes, so stale caches are not reused.
TINY_REVISION = 2


def cache_root() -> Path:
    return Path(os.environ.get("STREAMRL_CACHE_DIR", Path.home() / ".cache" / "streamrl"))


def build_char_tokenizer() -> PreTrainedTokenizerBase:
    """A character-level tokenizer over digits, letters and punctuation."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + list(CHARS))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )


def build_tiny_model(out_dir: Path, seed: int = 0, size: str = "tiny") -> Path:
    """Write a randomly initialised built-in Llama (`tiny`, 0.5 M parameters, or `small`,
    ~34 M) + char tokenizer to out_dir (HF format)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_char_tokenizer()
    config = LlamaConfig(  # the ignores: transformers types special-token ids loosely
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,  # pyright: ignore[reportArgumentType]
        bos_token_id=tokenizer.bos_token_id,  # pyright: ignore[reportArgumentType]
        eos_token_id=tokenizer.eos_token_id,  # pyright: ignore[reportArgumentType]
        **BUILTIN_CONFIGS[size],
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    _quiet_transformers()
    return AutoTokenizer.from_pretrained(str(path))


def eos_token_id(path: str | Path) -> int:
    """The tokenizer's end-of-sequence id, read from its files with the `tokenizers` library
    alone (the tokenizer classes of transformers cost a generator ~0.4 s of imports as it
    joins); through the full tokenizer when the files do not say it plainly."""
    path = Path(path)
    try:
        eos = json.loads((path / "tokenizer_config.json").read_text()).get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        if isinstance(eos, str) and (path / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            token_id = Tokenizer.from_file(str(path / "tokenizer.json")).token_to_id(eos)
            if token_id is not None:
                return token_id
    except (OSError, ValueError):
        pass
    return load_tokenizer(path).eos_token_id  # pyright: ignore[reportReturnType] (transformers: ids untyped)


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".npz")
"""Files that hold weights (with their shard indexes, `*.index.json`): a replica booting from the
trainer is never sent them, it takes the weights as a published version."""


def is_weight_file(name: str) -> bool:
    return name.endswith(WEIGHT_SUFFIXES) or name.endswith(".index.json")


def weight_bytes(path: str | Path) -> int:
    """Bytes of the directory's weight files (not their indexes): what from_pretrained reads of it."""
    return sum(p.stat().st_size for p in Path(path).iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))


def load_model(path: str | Path, dtype: str = "float32", device: str = "cpu") -> PreTrainedModel:
    """Load a causal LM with `from_pretrained` (safetensors), in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    _quiet_transformers()
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype))
    return model.to(device).eval()  # pyright: ignore[reportArgumentType] (transformers types this `to` wrongly)


def model_from_config(path: str | Path, dtype: str = "float32", device: str = "cpu") -> PreTrainedModel:
    """The architecture of the directory's config.json with every weight zero (no initialisation
    is computed; buffers such as rotary frequencies are): what a replica booting from the
    trainer holds until it loads a published version, in eval mode."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    _quiet_transformers()
    config = AutoConfig.from_pretrained(str(path))
    with no_init_weights(), torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.tie_weights()  # as from_pretrained leaves it (tied embeddings are one parameter, published once)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    return model.eval()


def check_model_dir(path: str | Path) -> Path:
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ValueError(f"model.path {path}: not a Hugging Face model directory (no config.json)")
    return path


def _task_identity(spec: RLJobSpec) -> dict:
    """What the warm start learns from: the task's prompts (a JSONL file by its content, not
    its path), not the order RL walks them in."""
    task = spec.task.model_dump(mode="json", exclude={"curriculum"})
    if spec.task.path:
        try:
            task["path"] = hashlib.sha256(Path(spec.task.path).read_bytes()).hexdigest()
        except OSError:
            pass  # load_prompts names the problem
    return task


def _builtin_key(spec: RLJobSpec) -> str:
    blob = json.dumps(
        {
            "revision": TINY_REVISION,
            "config": TINY_CONFIG,
            "chars": CHARS,
            "seed": spec.model.seed,
            "warm_start_steps": spec.model.warm_start_steps,
            "task": _task_identity(spec),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def resolve_model_dir(spec: RLJobSpec, log=print, progress_every_s: float | None = None) -> Path:
    """The directory of the initial policy: the user's, the hub's snapshot in the cache (its
    download's progress said every `progress_every_s`, default hub.PROGRESS_EVERY_S), or the
    cached built-in one (built and warm-started on first use; concurrent builders do not clash)."""
    if spec.model.source == "path":
        assert spec.model.path is not None  # the spec requires it with this source (and below)
        return check_model_dir(spec.model.path)
    if spec.model.source == "hf":
        from streamrl.hub import PROGRESS_EVERY_S, download_model

        assert spec.model.hf is not None
        return check_model_dir(download_model(spec.model.hf, log, progress_every_s or PROGRESS_EVERY_S))
    if spec.model.source in ("pvc", "image"):
        what = "claim" if spec.model.source == "pvc" else "model image"
        raise ValueError(f"model.source {spec.model.source}: a {what} is mounted by the operator into the trainer's "
                         "pods, in Kubernetes only; on this machine use source: path with the model's directory")
    final = cache_root() / "models" / f"tiny-{spec.task.name.value}-{_builtin_key(spec)}"
    if (final / "config.json").is_file():
        return final
    from streamrl.warmstart import warm_start

    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=final.parent))
    try:
        build_tiny_model(tmp, seed=spec.model.seed)
        if spec.model.warm_start_steps:
            log(f"warm-starting the built-in model on {spec.task.name.value} "
                f"({spec.model.warm_start_steps} steps, cached in {final})")
            model = load_model(tmp)
            warm_start(model, load_tokenizer(tmp), spec, log=log)
            model.save_pretrained(tmp)
        try:
            tmp.rename(final)
        except OSError:  # another process finished first
            if not (final / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def model_spec_summary(spec: ModelSpec) -> str:
    match spec.source:
        # ModelSpec requires the source's own field (hence the asserts)
        case "path":
            assert spec.path is not None
            return spec.path
        case "hf":
            assert spec.hf is not None
            return f"hf {spec.hf.repo}@{spec.hf.revision}"
        case "pvc":
            assert spec.pvc is not None
            return f"pvc {spec.pvc.claim_name}/{spec.pvc.sub_path}"
        case "image":
            assert spec.image is not None
            return f"image {spec.image.reference} {spec.image.path}"
    return f"builtin-tiny (warm start {spec.warm_start_steps} steps)"
