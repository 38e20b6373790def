"""The simulator against timelines worked out by hand: two replicas, decode steps of 1 s at any
batch, prompts of 0 tokens, output lengths [4, 10] (prompt p0) and [6, 6] (p1) in every
iteration, training 0.1 s per padded token and a 1 s optimizer step, a weight version taking
1 s over the link (1.25 GB at 10 Gbit/s), relayed: replica g-0 fetches it from the trainer,
g-1 from g-0 at the same time, each chunk as g-0 has it (cut-through), so both hold it 1 s
after the notice. random-fifo hands p0 to g-0 and p1 to g-1.

g-0 decodes p0's two samples together: the first token comes from prefill, so the 4-token
sample is done after 3 steps and the 10-token one after 9; from step 3 on it runs one sequence
of a cap of 4 with nothing waiting, a skewness bubble. g-1 finishes p1 after 5 steps."""

from __future__ import annotations

import pytest

from streamrl.simulation.scenario import parse_scenario
from streamrl.simulation.simulator import padded_tokens, simulate
from tests.unit.simulation.handworked import complete_group, hand_scenario


def _timeline(run) -> list[tuple]:
    return [(r.start_s, r.wall_s, r.generation_s, r.train_s, r.pipeline_bubble_ratio, r.skewness_bubble_ratio)
            for r in run.iterations]


def _expect(rows: list[tuple]) -> list:
    return [pytest.approx(row, abs=1e-9) for row in rows]


def test_padded_tokens_pad_each_micro_batch_to_its_longest_sample():
    groups = [complete_group("a", 2, [4, 10]), complete_group("b", 2, [6, 6])]
    assert padded_tokens(groups, 4) == 4 * 12  # one micro-batch of 4, padded to 2 + 10
    assert padded_tokens(groups, 2) == 2 * 8 + 2 * 12  # [6, 8] and [8, 12] (prompt + output, sorted)


def test_batch_mode_waits_for_the_whole_batch_and_the_relayed_weights(tmp_path):
    run = simulate(parse_scenario(hand_scenario(tmp_path, "batch")))
    # iteration 0: the batch is complete at 9; 40 padded tokens train in 4 s, the step takes 1 s.
    # iteration 1 starts at 14: g-0 holds version 1 at 15, g-1 (relayed through g-0) at 15 too; p0
    # ends at 15 + 9.
    assert _timeline(run) == _expect([
        (0.0, 14.0, 9.0, 5.0, 9 / 14, 6 / (2 * 14)),
        (14.0, 15.0, 10.0, 5.0, 10 / 15, 6 / (2 * 15)),
        (29.0, 15.0, 10.0, 5.0, 10 / 15, 6 / (2 * 15)),
    ])
    s = run.summary
    assert s.samples_per_s == pytest.approx(12 / 44)
    assert [r.weight_sync_s_max for r in run.iterations] == pytest.approx([0.0, 1.0, 1.0])
    # relayed: one copy from the trainer and one from g-0 for each version used (the third, published
    # as the run ends, is still on its way and not counted)
    assert s.weight_bytes_local == pytest.approx(2 * 2 * 1.25e9)
    trainer = next(st for st in s.stages if st.name == "trainer")
    assert trainer.utilisation == pytest.approx(15 / 44)
    assert trainer.gpu_seconds == pytest.approx(44.0)


def test_colocated_is_batch_without_a_link(tmp_path):
    run = simulate(parse_scenario(hand_scenario(tmp_path, "colocated")))
    assert _timeline(run) == _expect([(14.0 * i, 14.0, 9.0, 5.0, 9 / 14, 6 / 28) for i in range(3)])
    s = run.summary
    assert s.weight_bytes_local == 0
    # the generators run on the trainer's GPUs: only those are paid for
    assert s.gpu_seconds == pytest.approx(42.0)


def test_stream_sync_trains_each_group_as_it_completes(tmp_path):
    run = simulate(parse_scenario(hand_scenario(tmp_path, "stream-sync")))
    # iteration 0: p1 (done at 5) trains 12 tokens in 1.2 s; p0 (done at 9) 20 tokens in 2 s; step at 11.
    # iteration 1 from 12: g-0 loads at 13 (p0 done at 22), g-1 at 14 (p1 done at 19).
    assert _timeline(run) == _expect([
        (0.0, 12.0, 9.0, 4.2, 7.8 / 12, 6 / 24),
        (12.0, 13.0, 10.0, 4.2, 8.8 / 13, 6 / 26),
        (25.0, 13.0, 10.0, 4.2, 8.8 / 13, 6 / 26),
    ])


def test_stream_async_generates_the_next_iteration_while_training(tmp_path):
    run = simulate(parse_scenario(hand_scenario(tmp_path, "stream-async")))
    # iterations 0 and 1 are handed out at once: each replica runs four sequences from 0 (no
    # bubble: two still run after g-0's short ones finish). Iteration 1's samples are all in
    # when it starts at 12: one take of 40 padded tokens. Iteration 2 (version 1) runs on g-0
    # from 13 (p0's long sample alone from 16 to 22, version 2 swapped in at 18 between two
    # steps) and on g-1 from 14 to 19.
    assert _timeline(run) == _expect([
        (0.0, 12.0, 9.0, 4.2, 7.8 / 12, 0.0),
        (12.0, 5.0, 0.0, 5.0, 0.0, 1 / (2 * 5)),
        (17.0, 8.0, 5.0, 4.2, 3.8 / 8, 5 / (2 * 8)),
    ])
    assert [r.staleness_max for r in run.iterations] == [0, 1, 1]
    assert run.summary.samples_per_s == pytest.approx(12 / 25)


def test_without_relay_every_replica_fetches_from_the_trainer_one_after_the_other(tmp_path):
    data = hand_scenario(tmp_path, "batch")
    data["generators"][0]["weightRelay"] = False
    run = simulate(parse_scenario(data))
    # the trainer's link carries both copies, one after the other: g-0 at 15, g-1 at 16, as relayed
    assert [r.wall_s for r in run.iterations] == pytest.approx([14.0, 15.0, 15.0])
    assert run.summary.weight_bytes_local == pytest.approx(2 * 2 * 1.25e9)
