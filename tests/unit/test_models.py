"""Model and tokenizer files: the end-of-sequence id a generator reads without the
tokenizer classes is the tokenizer's own."""

from __future__ import annotations

import json

from streamrl.models import eos_token_id, load_tokenizer


def test_eos_id_from_the_files_is_the_tokenizers(tiny_model_dir):
    assert eos_token_id(tiny_model_dir) == load_tokenizer(tiny_model_dir).eos_token_id == 2


def test_eos_id_falls_back_to_the_tokenizer_when_the_files_do_not_say_it(tiny_model_dir, tmp_path):
    # An eos token the vocabulary lacks, or none named: the full tokenizer decides.
    for name in tiny_model_dir.iterdir():
        (tmp_path / name.name).write_bytes(name.read_bytes())
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["eos_token"] = {"content": "<eos>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert eos_token_id(tmp_path) == 2
    del config["eos_token"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert eos_token_id(tmp_path) == load_tokenizer(tmp_path).eos_token_id


def test_a_model_from_its_config_holds_zeros_and_with_the_weights_computes_what_the_checkpoint_does(tiny_model_dir):
    import torch

    from streamrl.models import load_model, model_from_config

    empty = model_from_config(tiny_model_dir)
    assert all(not p.any() for p in empty.parameters())
    loaded = load_model(tiny_model_dir)
    assert [n for n, _ in empty.named_parameters()] == [n for n, _ in loaded.named_parameters()]  # tied alike
    empty.load_state_dict(dict(loaded.named_parameters()), strict=False)
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.equal(empty(ids).logits, loaded(ids).logits)
