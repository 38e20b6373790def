"""What the generator adds to vLLM's worker (its `worker_extension_cls`): load a policy version
from a safetensors directory in place and say which tensors it loaded. Runs inside vLLM's worker,
in the generator's process or in a worker process of vLLM's; knows files and tensor names only."""

from __future__ import annotations

from pathlib import Path

from safetensors import safe_open


class VersionLoader:
    """Mixed into vLLM's worker class by vLLM (`worker_extension_cls`); its methods are called
    through `collective_rpc` on every worker of a replica."""

    def load_version(self, path: str) -> list[str]:
        """Load every tensor of the safetensors files in `path` through vLLM's reload path (which
        redoes the backend's weight processing, e.g. the CPU backend's oneDNN repacking); returns
        the names handed to the model, in file order."""
        names: list[str] = []

        def tensors():
            for file in sorted(Path(path).glob("*.safetensors")):
                with safe_open(str(file), framework="pt", device="cpu") as f:
                    for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                        names.append(name)
                        yield name, f.get_tensor(name)

        self.reload_weights(weights_iterator=tensors(), is_checkpoint_format=True)
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
