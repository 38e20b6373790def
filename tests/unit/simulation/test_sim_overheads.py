"""What the real loop pays besides decoding and training tokens, worked out by hand on the
timelines of test_sim_timelines.py (two replicas, 1 s decode steps, prompts of 0 tokens,
lengths [4, 10] for p0 on g-0 and [6, 6] for p1 on g-1, 0.1 s per padded token, a 1 s step):
a replica's seconds per finished sample, the learner's per-micro-batch seconds, the trainer's
intake of samples that arrive while it trains, colocated mode paying that intake in the
replica's process, a replica on the trainer's core lending it that intake (and timing its
steps the longer for it), and those seconds resolved from a measured profile."""

from __future__ import annotations

import pytest

from streamrl.planning.profile_record import Profile, ProfileEngine, ProfileHardware, ProfileModel
from streamrl.simulation.scenario import parse_scenario
from streamrl.simulation.simulator import Simulator, simulate
from streamrl.simulation.stages import resolve_stages
from tests.unit.simulation.handworked import hand_scenario


def _scenario(tmp_path, mode: str, pool: dict | None = None, trainer: dict | None = None, **extra) -> dict:
    return hand_scenario(tmp_path, mode, iterations=2, pool=pool, trainer=trainer, **extra)


def _first(run) -> tuple:
    r = run.iterations[0]
    return r.start_s, r.wall_s, r.generation_s, r.train_s


def test_a_replica_sends_its_finished_samples_before_its_next_step(tmp_path):
    run = simulate(parse_scenario(_scenario(tmp_path, "batch", pool={"sampleSeconds": 0.5})))
    # g-0: the 4-token sample is done at 3 and sent by 3.5; the 10-token one needs 6 more steps: in at 9.5
    # (it arrives as it is done; the replica sends until 10). Without sending the batch was complete at 9.
    assert _first(run) == pytest.approx((0.0, 14.5, 9.5, 5.0))


def test_a_step_that_admits_prompts_pays_its_fixed_prefill_once(tmp_path):
    run = simulate(parse_scenario(_scenario(tmp_path, "batch", pool={"prefillSecondsPerStep": 0.5})))
    # g-0 admits p0's two samples in one step (0.5 s; their first tokens) and decodes 3 and 9 more
    # steps: done at 3.5 and 9.5 (admitting nothing after, it pays no more); g-1 ends at 5.5.
    assert _first(run) == pytest.approx((0.0, 14.5, 9.5, 5.0))


def test_every_micro_batch_costs_its_fixed_seconds(tmp_path):
    data = _scenario(tmp_path, "batch", trainer={"microBatchSeconds": 0.5})
    assert _first(simulate(parse_scenario(data))) == pytest.approx((0.0, 14.5, 9.0, 5.5))  # 4 + 0.5 + 1
    data["algorithm"]["microBatchSize"] = 2  # [0+4, 6] -> 12 tokens and [6, 10] -> 20: 3.2 s + 2 x 0.5
    assert _first(simulate(parse_scenario(data))) == pytest.approx((0.0, 14.2, 9.0, 5.2))


def test_samples_arriving_while_the_trainer_trains_delay_it_by_their_intake(tmp_path):
    data = _scenario(tmp_path, "stream-sync", trainer={"secondsPerToken": 1.0, "sampleSeconds": 0.25})
    run = simulate(parse_scenario(data))
    # p1 is in at 5 and trains 12 s; p0's long sample arrives at 9 meanwhile (+0.25); its short one came
    # at 3, while the trainer waited (free). p0 trains 20 s from 17.25, the step ends at 38.25.
    assert _first(run) == pytest.approx((0.0, 38.25, 17.25, 33.25))
    data["trainer"]["cost"]["sampleSeconds"] = 0.0
    assert _first(simulate(parse_scenario(data))) == pytest.approx((0.0, 38.0, 17.0, 33.0))


def test_colocated_takes_samples_in_between_the_replicas_steps(tmp_path):
    data = _scenario(tmp_path, "colocated", trainer={"sampleSeconds": 0.5})
    scenario = parse_scenario(data)
    stages = resolve_stages(scenario)
    assert stages.trainer_sample_s == 0.0 and stages.pools["g"].sample_s == 0.5  # one process
    # as a replica sending for 0.5 s per sample: complete at 9.5; the trainer pays nothing more
    assert _first(simulate(scenario)) == pytest.approx((0.0, 14.5, 9.5, 5.0))


def _profile(tmp_path, **over) -> str:
    fields = dict(
        created="2026-01-01T00:00:00+00:00", hardware=ProfileHardware(device="cpu", name="test cpu", cores=2),
        model=ProfileModel(name="builtin-tiny", num_params=503424, dtype="float32"),
        engine=ProfileEngine(type="torch", max_batch_size=4, device="cpu"),
        ptl=[(1, 1.0)], ptl_context=16, prefill_s_per_token=0.0, train_micro_batch_size=4,
        train_sequence_tokens=16, forward_backward_s_per_token=0.1, forward_backward_s_per_micro_batch=0.5,
        optimizer_step_s=1.0, publish_s=0.0, weight_load_s=0.25, sample_intake_s=0.02, sample_stream_s=0.1)
    path = tmp_path / "profile.json"
    Profile(**(fields | over)).write(path)
    return str(path)


@pytest.mark.parametrize("mode", ["batch", "colocated"])
def test_a_profile_gives_each_stage_its_measured_overheads(tmp_path, mode):
    data = _scenario(tmp_path, mode)
    cost = {"type": "profile", "path": _profile(tmp_path)}
    data["generators"][0]["cost"] = cost
    data["trainer"]["cost"] = cost
    stages = resolve_stages(parse_scenario(data))
    pool = stages.pools["g"]
    assert pool.load_s == 0.25
    assert stages.trainer.train_s(40, 2) == pytest.approx(4.0 + 1.0)
    if mode == "batch":  # the wire (0.08 s) split between its ends; the intake on the trainer's side
        assert (pool.sample_s, stages.trainer_sample_s) == pytest.approx((0.04, 0.06))
    else:  # one process, no wire: a profile before version 5 stands in the intake between the replica's steps
        assert (pool.sample_s, stages.trainer_sample_s) == pytest.approx((0.02, 0.0))
    data["weights"]["loadSeconds"] = 0.0  # the scenario's own figure wins
    assert resolve_stages(parse_scenario(data)).pools["g"].load_s == 0.0
    # serving colocated measured: that, not the intake, between the replica's steps; the wire unchanged
    cost["path"] = _profile(tmp_path, sample_colocated_s=0.07)
    stages = resolve_stages(parse_scenario(data))
    expected = (0.04, 0.06) if mode == "batch" else (0.07, 0.0)
    assert (stages.pools["g"].sample_s, stages.trainer_sample_s) == pytest.approx(expected)


def test_a_replica_on_the_trainers_core_lends_it_the_intake_of_each_sample(tmp_path):
    data = _scenario(tmp_path, "batch", trainer={"sampleSeconds": 0.25}, placement={"cores": 2})
    run = simulate(parse_scenario(data))
    # two cores: the trainer on core 0, g-0 on core 1, g-1 on core 0 beside it. g-1 decodes [6, 6] from 0
    # to 5 while the trainer takes in g-0's short sample at 3: g-1's samples are in at 5, then it pays
    # what it lent. g-0 is alone: p0 complete at 9, as without placement.
    assert _first(run) == pytest.approx((0.0, 14.0, 9.0, 5.0))
    data["generators"][0]["replicas"] = 1  # g-0 alone runs both prompts, 4 at once: [4, 10, 6, 6] done at 9
    data["placement"]["cores"] = 1  # ... on the trainer's core: it lends 0.25 s for the sample in at 3
    # while decoding, and 2 x 0.25 for those in at 5 while paying that: its last 4 steps start at 5.75
    run = simulate(parse_scenario(data))
    assert _first(run) == pytest.approx((0.0, 14.75, 9.75, 5.0))
    data["placement"]["cores"] = None
    assert _first(simulate(parse_scenario(data))) == pytest.approx((0.0, 14.0, 9.0, 5.0))


def test_a_replica_on_the_trainers_core_reports_the_steps_it_lent_for_as_longer(tmp_path):
    # As a replica times a step's wall clock: g-1's 5 steps of [6, 6] (1 s each at batch 2) lent
    # the trainer 0.25 s, so it observes 1.05 s per step, in each of the 2 iterations (10 steps,
    # smoothed 0.1 per step into its start-up 1.0). g-0, on a core of its own, reports 1.0.
    data = _scenario(tmp_path, "batch", trainer={"sampleSeconds": 0.25}, placement={"cores": 2})
    scenario = parse_scenario(data)
    sim = Simulator(scenario, resolve_stages(scenario))
    sim.run()
    assert sim.fleet.engines["g-1"].ptl == pytest.approx({1: 1.0, 2: 1.0 + 0.05 * (1 - 0.9**10), 4: 1.0})
    assert sim.fleet.engines["g-0"].ptl == pytest.approx({1: 1.0, 2: 1.0, 4: 1.0})


def test_colocated_pays_its_two_switches_each_iteration(tmp_path):
    # Without switches: complete at 9, 4 s of training and the 1 s step, the next iteration at 14.
    # Switching to training (0.2 s) before the first micro-batch and back (0.3 s) after publishing
    # adds 0.5 s to every iteration's wall, none to its training seconds.
    free = simulate(parse_scenario(_scenario(tmp_path, "colocated")))
    assert _first(free) == pytest.approx((0.0, 14.0, 9.0, 5.0))
    assert free.iterations[1].start_s == pytest.approx(14.0)
    data = _scenario(tmp_path, "colocated", trainer={"switchToTrainingSeconds": 0.2, "switchToGenerationSeconds": 0.3})
    paid = simulate(parse_scenario(data))
    assert _first(paid) == pytest.approx((0.0, 14.5, 9.0, 5.0))
    assert paid.iterations[1].start_s == pytest.approx(14.5)
    data["pipeline"]["mode"] = "batch"  # disaggregated: nothing switches
    assert resolve_stages(parse_scenario(data)).to_training_s == 0.0


def test_a_profile_gives_colocated_its_measured_cache_switch(tmp_path):
    data = _scenario(tmp_path, "colocated")
    cost = {"type": "profile", "path": _profile(tmp_path, cache_release_s=0.01, cache_allocate_s=0.03)}
    data["generators"][0]["cost"] = data["trainer"]["cost"] = cost
    stages = resolve_stages(parse_scenario(data))
    assert (stages.to_training_s, stages.to_generation_s) == (0.01, 0.03)
