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
