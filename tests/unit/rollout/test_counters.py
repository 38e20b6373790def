"""The rollout's counters are plain numbers the run summary reads; a sink, when given one, is told
of each count as it grows (the trainer's Prometheus counters), and is not a count itself."""

from streamrl.rollout.counters import RolloutCounters
from streamrl.rollout.refusals import Refusal


class _Sink:
    def __init__(self):
        self.added: list[tuple[str, int]] = []
        self.refusals: list[tuple[Refusal, int]] = []

    def add(self, count: str, n: int) -> None:
        self.added.append((count, n))

    def refused(self, reason: Refusal, n: int) -> None:
        self.refusals.append((reason, n))


def test_counts_reach_the_sink_as_they_grow_and_the_totals_are_numbers_only():
    sink = _Sink()
    c = RolloutCounters(sink=sink)
    c.accepted()
    c.redispatched(3)
    assert c.refused(Refusal.STALE, 2) == 2
    assert c.refused(Refusal.STALE) == 3
    c.refused(Refusal.DUPLICATE)
    assert sink.added == [("num_samples_accepted", 1), ("num_samples_redispatched", 3),
                          ("num_samples_stale_dropped", 2), ("num_samples_stale_dropped", 1),
                          ("num_samples_duplicate_dropped", 1)]
    assert sink.refusals == [(Refusal.STALE, 2), (Refusal.STALE, 1), (Refusal.DUPLICATE, 1)]
    totals = c.totals()
    assert "sink" not in totals
    assert totals["num_samples_refused"] == {"stale": 3, "duplicate": 1}
    assert (totals["num_samples_accepted"], totals["num_samples_stale_dropped"]) == (1, 3)


def test_a_restored_run_continues_its_counts_without_telling_the_sink():
    sink = _Sink()
    c = RolloutCounters(sink=sink)
    c.restore({"num_prompts_dispatched": 40, "num_samples_accepted": 99, "unknown_count": 1}, accepted_trained=64)
    assert (c.num_prompts_dispatched, c.num_samples_accepted) == (40, 64)
    assert sink.added == [] and not hasattr(c, "unknown_count")
    assert RolloutCounters() == RolloutCounters(sink=sink)  # the sink is not part of the counts
