"""The hardware catalog: the shipped GPU types with their sources, a user's folder adding and
replacing entries, and errors that name the unknown type or the bad field."""

import pytest

from streamrl.planning.catalog import load_catalog
from streamrl.planning.shape import ModelShape

REQUIRED = {"H100", "H800", "H20", "H200", "A100-80GB", "L40S", "L4", "A10G"}


def test_the_shipped_catalog_has_every_required_type_with_its_sources():
    catalog = load_catalog()
    assert REQUIRED <= {g.name for g in catalog.gpus}
    for gpu in catalog.gpus:
        assert gpu.sources, f"{gpu.name} cites no source"
    h20, h800 = catalog.gpu("h20"), catalog.gpu("H800")  # names match case-insensitively
    # The paper's pair: H20 148 TFLOPS, 96 GB, 4.0 TB/s, cost 1.00; H800 989.5 TFLOPS, 80 GB, 3.35 TB/s, cost 2.85.
    assert (h20.bf16_tflops, h20.memory_gb, h20.hbm_gb_s, h20.relative_cost) == (148, 96, 4000, 1.0)
    assert (h800.bf16_tflops, h800.memory_gb, h800.hbm_gb_s, h800.relative_cost) == (989.5, 80, 3350, 2.85)


def test_an_unknown_gpu_type_is_named_with_the_known_ones():
    with pytest.raises(ValueError) as err:
        load_catalog().gpu("H300", field="--gpu-type")
    message = str(err.value)
    assert message.startswith("--gpu-type 'H300': not in the GPU catalog (known: A100-80GB, A10G, H100, H20, H200,")
    assert "add it to a YAML file under" in message


def test_a_users_folder_adds_types_and_replaces_same_named_ones(tmp_path):
    (tmp_path / "mine.yaml").write_text(
        "gpus:\n"
        "  - {name: MI300X, bf16_tflops: 1307, hbm_gb_s: 5300, memory_gb: 192, interconnect_gb_s: 896,"
        " relative_cost: 2.5, sources: [AMD MI300X datasheet]}\n"
        "  - {name: H20, bf16_tflops: 148, hbm_gb_s: 4000, memory_gb: 96, interconnect_gb_s: 900,"
        " relative_cost: 0.8}\n")
    catalog = load_catalog([tmp_path])
    assert catalog.gpu("mi300x").memory_gb == 192
    assert catalog.gpu("H20").relative_cost == 0.8
    assert catalog.gpu("H800").relative_cost == 2.85  # the shipped entries stay


def test_a_bad_entry_is_refused_naming_the_file_the_entry_and_the_field(tmp_path):
    (tmp_path / "bad.yaml").write_text(
        "gpus:\n  - {name: X1, bf16_tflops: -3, hbm_gb_s: 1, memory_gb: 1, interconnect_gb_s: 1, relative_cost: 1,"
        " hbm_tb_s: 4}\n")
    with pytest.raises(ValueError) as err:
        load_catalog([tmp_path])
    message = str(err.value)
    assert f"catalog {tmp_path / 'bad.yaml'}: invalid" in message
    assert "gpus[0].bf16_tflops: Input should be greater than 0" in message
    assert "gpus[0].hbm_tb_s: unknown field" in message


def test_a_missing_folder_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"catalog folder .*nowhere: not a directory"):
        load_catalog([tmp_path / "nowhere"])


def test_model_shapes_come_from_the_catalog_or_a_config_json(tmp_path):
    catalog = load_catalog()
    qwen = catalog.model("Qwen2.5-7B")
    assert round(qwen.num_params / 1e9, 2) == 7.62  # Qwen2.5-7B's published 7.61 B (biases left out)
    assert round(catalog.model("qwen2.5-72b").num_params / 1e9, 1) == 72.7
    (tmp_path / "config.json").write_text(
        '{"num_hidden_layers": 28, "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,'
        ' "vocab_size": 152064, "intermediate_size": 18944, "tie_word_embeddings": false}')
    from_file = ModelShape.from_hf_config(tmp_path)
    assert from_file.num_params == qwen.num_params
    assert from_file.kv_values_per_token() == 2 * 28 * 4 * 128
    (tmp_path / "config.json").write_text('{"hidden_size": 8}')
    with pytest.raises(ValueError, match="missing num_hidden_layers, num_attention_heads, vocab_size"):
        ModelShape.from_hf_config(tmp_path / "config.json")
    with pytest.raises(ValueError, match=r"model .gpt-9.: not in the catalog \(known: llama-2-13b, llama-2-34b, "
                                         r"llama-2-70b,"):
        catalog.model("gpt-9")
