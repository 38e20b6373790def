"""The work queue and the dispatcher: samples waiting for a replica, handed to the replicas
with the most room a whole prompt at a time, long-tail prompts only to long-tail replicas
while both kinds exist. A replica holds at most `queue_factor` batches of its capacity, so
work binds late: whichever frees slots first takes the longest prompt still waiting."""

from __future__ import annotations

from collections import deque
from collections.abc import Collection

from streamrl.messages import Work
from streamrl.rollout.counters import RolloutCounters
from streamrl.rollout.replica import Replica
from streamrl.rollout.work import InFlight, PromptWork, SamplingConfig


def dispatch_order(prompts: list[PromptWork]) -> list[PromptWork]:
    """The order an iteration's prompts join the queue: longest predicted first when there are
    predictions (ranked dispatch), else as drawn. Pure, so the simulator queues by it too."""
    if any(p.predicted_length for p in prompts):
        return sorted(prompts, key=lambda p: -p.predicted_length)
    return list(prompts)


class WorkQueue:
    def __init__(self, sampling: SamplingConfig, counters: RolloutCounters, queue_factor: float = 4.0):
        self.sampling = sampling
        self.counters = counters
        self.queue_factor = queue_factor
        self._pending: deque[tuple[InFlight, list[int]]] = deque()
        """(prompt, sample indices) not assigned yet, in dispatch order."""

    def add(self, tasks: list[InFlight]) -> None:
        """Queue every sample of these prompts, in this order."""
        self._pending.extend((t, list(range(t.group_size))) for t in tasks)

    def requeue(self, task: InFlight, indices: list[int]) -> None:
        """Samples to generate again (their replica left, or they were stale or malformed): first in line."""
        self._pending.appendleft((task, sorted(indices)))

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    @property
    def num_samples_pending(self) -> int:
        return sum(len(i) for _, i in self._pending)

    def allowance(self, replica: Replica) -> int:
        """Samples a replica may hold at once: queue_factor batches of its capacity."""
        return max(1, round(replica.capacity * self.queue_factor))

    def room(self, replica: Replica) -> int:
        return 0 if replica.draining else self.allowance(replica) - len(replica.outstanding)

    def _next_for(self, replica: Replica, routed: bool) -> int | None:
        """Index in the queue of the first work this replica may take."""
        for i, (task, _) in enumerate(self._pending):
            if not routed or task.prompt.long_tail == replica.long_tail:
                return i
        return None

    @staticmethod
    def routed(replicas: Collection[Replica]) -> bool:
        """Long-tail work goes only to long-tail replicas: while both kinds exist."""
        return any(r.long_tail for r in replicas) and any(not r.long_tail for r in replicas)

    def _choice(self, replica: Replica, routed: bool) -> int | None:
        """Index in the queue of the work dispatching would give this replica now: the first
        it may take, unless that group does not fit its room whole while it could (a group
        larger than a replica's whole allowance is split)."""
        room = self.room(replica)
        index = self._next_for(replica, routed) if room > 0 else None
        if index is None:
            return None
        task, indices = self._pending[index]
        if len(task.missing(indices)) > room and room < self.allowance(replica):
            return None  # keep a group on one replica: wait until it fits whole
        return index

    def could_take(self, replica: Replica, routed: bool) -> bool:
        """Whether dispatching now would give this replica work, without assigning it."""
        return self._choice(replica, routed) is not None

    def dispatch(self, replicas: Collection[Replica]) -> None:
        """Hand pending samples to the replicas with the most room, a whole prompt at a time."""
        routed = self.routed(replicas)
        progress = True
        while progress and self._pending and replicas:
            progress = False
            for replica in sorted(replicas, key=self.room, reverse=True):
                index = self._choice(replica, routed)
                if index is None:
                    continue
                room = self.room(replica)
                task, indices = self._pending[index]
                indices = task.missing(indices)
                del self._pending[index]
                take, rest = indices[:room], indices[room:]
                if rest:
                    self._pending.insert(index, (task, rest))
                if take:
                    self._assign(replica, task, take)
                progress = True
                break

    def _assign(self, replica: Replica, task: InFlight, indices: list[int]) -> None:
        replica.outstanding.update((task.prompt_id, i) for i in indices)
        sp, p = self.sampling, task.prompt
        replica.outbox.put_nowait(Work(p.prompt_id, p.token_ids, tuple(indices), sp.temperature, sp.top_p,
                                       sp.max_new_tokens, task.seed, task.min_policy_version,
                                       priority=p.predicted_length, incarnation=sp.incarnation))
        self.counters.dispatched()
