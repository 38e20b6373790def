"""What tensor parallelism needs, refused before any rank waits on a collective: the size must
divide the ranks (and, in the spec, the ranks of a node) and the model's heads and MLP width.
tests/integration/test_ranks.py trains with it on two real ranks."""

import pytest

from streamrl.models import load_model
from streamrl.spec import parse_job
from streamrl.trainer.ranks import Ranks, shard


def test_a_size_that_does_not_divide_the_model_is_named(tiny_model_dir):
    model = load_model(tiny_model_dir)  # 4 attention heads, 2 KV heads, MLP 512
    with pytest.raises(ValueError, match=r"tensorParallel: 4 does not divide the model's num_key_value_heads \(2\)"):
        shard(model, Ranks(0, 4), tensor_parallel=4)
    with pytest.raises(ValueError, match=r"tensorParallel: 2 does not divide the trainer's 3 ranks"):
        shard(model, Ranks(0, 3), tensor_parallel=2)


def test_the_spec_keeps_a_layer_within_a_node():
    job = {"spec": {"model": {"source": "builtin-tiny"},
                    "trainer": {"nodes": 2, "processesPerNode": 1, "memory": {"tensorParallel": 2}}}}
    with pytest.raises(ValueError, match=r"memory.tensorParallel: 2 must divide processesPerNode \(1\): a layer is "
                                         "split across the ranks of one node"):
        parse_job(job)
    job["spec"]["trainer"].update(nodes=1, processesPerNode=2)
    assert parse_job(job).spec.trainer.memory.tensor_parallel == 2
