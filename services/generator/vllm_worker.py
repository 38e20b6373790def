"""What the generator adds to vLLM's worker (its `worker_extension_cls`): load a policy version in
place, from tensors handed over in the generator's process or from a safetensors directory in a
worker process of vLLM's, and say which tensors it loaded. Knows tensors, files and names only."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open


class VersionLoader:
    """Mixed into vLLM's worker class by vLLM (`worker_extension_cls`); its methods are called
    through `collective_rpc` on every worker of a replica."""

    if TYPE_CHECKING:  # what vLLM's worker, which this is mixed into, has (never defined here: that would shadow it)
        model_config: Any
        model_runner: Any

        def reload_weights(self, *, weights_iterator: Iterable[tuple[str, torch.Tensor]],
                           is_checkpoint_format: bool) -> None: ...

    def process_id(self) -> int:
        """The worker's process: the generator's own when vLLM runs it in process."""
        return os.getpid()

    def load_tensors(self, tensors: dict[str, torch.Tensor]) -> list[str]:
        """Load these tensors, handed over within the worker's process (collective_rpc's arguments
        cross no process boundary there), through vLLM's reload path; the names loaded."""
        return self._reload(tensors.items())

    def load_version(self, path: str) -> list[str]:
        """Load every tensor of the safetensors files in `path` through vLLM's reload path; the
        names loaded, in file order."""

        def tensors() -> Iterator[tuple[str, torch.Tensor]]:
            for file in sorted(Path(path).glob("*.safetensors")):
                with safe_open(str(file), framework="pt", device="cpu") as f:
                    for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                        yield name, f.get_tensor(name)

        return self._reload(tensors())

    def _reload(self, named: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
        """vLLM's reload path redoes the backend's weight processing (e.g. the CPU backend's oneDNN
        repacking), which loading into the model's parameters directly would skip."""
        names: list[str] = []

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in named:
                names.append(name)
                yield name, tensor

        self.reload_weights(weights_iterator=counted(), is_checkpoint_format=True)
        self._retie_output_embeddings()
        return names

    def _retie_output_embeddings(self) -> None:
        """With tied embeddings the output head shares the input embedding's tensor, and vLLM's reload
        processes only the embedding (a limitation its reload module states): the head then keeps the
        backend's processed copy of the old weights (on CPU, the GEMM handle built from them), and
        samples come from the old head. Its processing is redone here, from the tensor it shares."""
        if not getattr(self.model_config.hf_config, "tie_word_embeddings", False):
            return
        head = getattr(self.model_runner.get_model(), "lm_head", None)
        method = getattr(head, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(head)
