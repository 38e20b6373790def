"""The simulated rollout side as the coordinator runs it: the product's Replica records, work
queue, long-tail planner and weight relay over the scenario's links, and sample intake into
groups; each replica's outbox is pumped into its simulated engine. Knows no trainer loop."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from streamrl.messages import BatchCap, WeightsLoaded, WeightsNotice, Work
from streamrl.metrics import WAITING_WEIGHTS, ServiceMetrics
from streamrl.planning.decoding import Sequence, SimReplica
from streamrl.planning.events import Signal, Simulation, Track
from streamrl.planning.scenario import LinkSection, Scenario
from streamrl.planning.stages import Stages
from streamrl.trainer import longtail, workqueue
from streamrl.trainer.counters import RolloutCounters
from streamrl.trainer.groups import InFlight, PromptWork
from streamrl.trainer.relay import WeightRelay
from streamrl.trainer.replica import Replica


@dataclass
class SimGroup:
    """A prompt's samples as they arrive; complete when every one is in."""

    prompt_id: str
    iteration: int
    prompt_tokens: int
    group_size: int
    lengths: list[int] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)


class _Outbox:
    """Stands in for a replica's asyncio queue: each message goes to the simulated replica at once."""

    def __init__(self, deliver: Callable[[object], None]):
        self.put_nowait = deliver


class Fleet:
    def __init__(self, sim: Simulation, scenario: Scenario, stages: Stages, latency_context: int):
        self.sim, self.scenario, self.stages = sim, scenario, stages
        self.latency_context = latency_context
        d = scenario.dispatch
        sampling = workqueue.SamplingConfig(1.0, 1.0, scenario.workload.max_new_tokens, scenario.seed)
        # the coordinator's own counters, over metrics of a registry no one serves
        self.counters = RolloutCounters(ServiceMetrics("trainer"))
        self.queue = workqueue.WorkQueue(sampling, self.counters, d.effective_queue_factor)
        self.relay = WeightRelay(frozenset(p.name for p in scenario.generators if p.weight_relay))
        self.replicas: dict[str, Replica] = {}
        self.engines: dict[str, SimReplica] = {}
        self.departed: list[SimReplica] = []
        self.inflight: dict[str, tuple[InFlight, SimGroup]] = {}
        self.lengths: dict[str, tuple[int, ...]] = {}
        self.ready: dict[int, deque[SimGroup]] = {}
        self.arrived = Signal(sim)
        """Fired when a group completes."""
        self.num_arrived = 0
        """Samples that reached the trainer so far."""
        self.on_trainer_core: list[SimReplica] = []
        """Replicas placed on the trainer's core (placement.cores)."""
        self.recent_lengths: deque[int] = deque(maxlen=4096)
        """D, the recent output lengths (as the trainer's loop keeps them)."""
        self.demand: longtail.LongTailDemand | None = None
        self.barrier = Track(sim, "barrier", "busy", "barrier")
        """'busy' while no work is pending or out anywhere (the generation barrier)."""
        self.in_process = scenario.pipeline.mode == "colocated"
        """Colocated: generators run in the trainer's process; weights and samples cross no link."""
        self.sync_s: dict[int, float] = {}
        """Slowest replica's notice-to-swap seconds per version."""
        self.bytes_by_link = {"local": 0.0, "cross": 0.0}
        self._free_at: dict[str, float] = {}
        self._notices: dict[int, float] = {}
        self._pool_of = {p.name: p for p in scenario.generators}
        self._counter = 0
        self._routed = False
        self._outgoing: list[tuple[str, object]] = []
        """Long-tail work goes only to long-tail replicas (both kinds exist: WorkQueue.dispatch's `routed`)."""

    # ---- membership -------------------------------------------------------------------
    def connect(self, pool: str, policy_version: int = 0, held_since: float | None = None) -> SimReplica:
        """A replica says hello (its GPUs held since `held_since`: when it was added, default now)."""
        spec, stage = self._pool_of[pool], self.stages.pools[pool]
        gid = f"{pool}-{self._counter}"
        self._counter += 1
        sizes = sorted({1 << k for k in range(stage.max_batch.bit_length())} | {stage.max_batch})
        points = tuple((b, stage.cost.decode_step_s(b, self.latency_context)) for b in sizes)
        replica = Replica(gid, pool, stage.max_batch, "simulated", policy_version,
                          gid if spec.weight_relay else "", points)
        engine = SimReplica(self.sim, gid, pool, stage.cost, stage.max_batch, Track(self.sim, f"generator-{gid}"),
                            self._on_sample, self._on_loaded, self.scenario.dispatch.low_occupancy,
                            stage.load_s, policy_version, stage.sample_s, points, self._on_report)
        engine.held_since = self.sim.now if held_since is None else held_since
        replica.outbox = _Outbox(lambda msg, gid=gid: self._deliver(gid, msg))
        self.replicas[gid] = replica
        self.engines[gid] = engine
        cores, k = self.scenario.placement.cores, self._counter - 1
        if cores and not self.in_process and (1 + k) % cores == 0:  # round-robin after the trainer's core
            self.on_trainer_core.append(engine)
        self.relay.joined(replica, self.replicas.values())
        self.replan()
        self._update_routed()
        self.dispatch()
        return engine

    def drain(self, generator_id: str) -> None:
        replica = self.replicas[generator_id]
        replica.draining = True
        self.replan()
        self._release_if_drained(replica)
        self.dispatch()

    def _release_if_drained(self, replica: Replica) -> None:
        if replica.draining and not replica.outstanding:
            del self.replicas[replica.generator_id]
            engine = self.engines.pop(replica.generator_id)
            engine.close()
            self.departed.append(engine)
            self.relay.left(replica.pool, list(self.replicas.values()))
            self._update_routed()

    def live(self, pool: str | None = None) -> list[Replica]:
        return [r for r in self.replicas.values() if not r.draining and (pool is None or r.pool == pool)]

    # ---- messages out, pumped into the simulated replicas --------------------------------
    def _deliver(self, gid: str, msg) -> None:
        """Messages sent within one moment reach the replica together (its worker drains its inbox
        between two steps), in the order sent."""
        if not self._outgoing:
            self.sim.at(self.sim.now, self._flush)
        self._outgoing.append((gid, msg))

    def _flush(self) -> None:
        outgoing, self._outgoing = self._outgoing, []
        work: dict[str, list[Sequence]] = {}
        for gid, msg in outgoing:
            engine = self.engines.get(gid)
            if engine is None:
                continue
            match msg:
                case Work():
                    length = self.lengths[msg.prompt_id]
                    tokens = self.scenario.workload.prompt_tokens
                    work.setdefault(gid, []).extend(
                        Sequence(msg.prompt_id, i, length[i], tokens, msg.min_policy_version, msg.priority)
                        for i in msg.sample_indices)
                case BatchCap():
                    engine.set_batch_cap(msg.max_batch_size)
                case WeightsNotice():
                    self._fetch(engine, msg)
                case None:
                    pass
                case _:
                    raise TypeError(f"unexpected message to a simulated replica: {msg!r}")
        for gid, sequences in work.items():
            self.engines[gid].give(sequences)

    # ---- work -------------------------------------------------------------------------
    def add_prompts(self, iteration: int, prompts: list[PromptWork], lengths: dict[str, tuple[int, ...]],
                    prompt_tokens: int, min_policy_version: int) -> None:
        """Queue one iteration's prompts in the product's dispatch order."""
        g = self.scenario.algorithm.group_size
        tasks = []
        for p in workqueue.dispatch_order(prompts):
            task = InFlight(p, iteration, g, 0, min_policy_version)
            self.inflight[p.prompt_id] = (task, SimGroup(p.prompt_id, iteration, prompt_tokens, g))
            self.lengths[p.prompt_id] = lengths[p.prompt_id]
            tasks.append(task)
        self.queue.add(tasks)
        self.dispatch()

    def dispatch(self) -> None:
        self.queue.dispatch(self.replicas.values())
        self._track_barrier()

    def _track_barrier(self) -> None:
        at_barrier = not self.queue._pending and not any(r.outstanding for r in self.replicas.values())
        self.barrier.set("busy" if at_barrier else "idle", "barrier" if at_barrier else "")

    def replan(self) -> None:
        """The long-tail plan for the current demand (also when replicas join or leave), as the trainer's loop."""
        if self.demand is None or not self.replicas:
            return
        d = self.scenario.dispatch
        replicas = [longtail.ReplicaProfile(r.generator_id, longtail.LatencyProfile(r.latency_profile or ((1, 1.0),)),
                                            r.capacity) for r in self.replicas.values() if not r.draining]
        if not replicas:
            return
        plan = longtail.plan_long_tail(self.demand, replicas, d.long_tail_batch_cap, d.objective)
        chosen = set(plan.long_replicas)
        for r in self.replicas.values():  # the coordinator's set_long_tail_replicas
            long_tail = r.generator_id in chosen
            if long_tail != r.long_tail or long_tail:
                r.outbox.put_nowait(BatchCap(d.long_tail_batch_cap if long_tail else 0))
            r.long_tail = long_tail
        self._update_routed()

    def _update_routed(self) -> None:
        kinds = {r.long_tail for r in self.replicas.values()}
        self._routed = kinds == {True, False}

    # ---- samples in -------------------------------------------------------------------
    def _on_sample(self, engine: SimReplica, q: Sequence) -> None:
        latency = 0.0 if self.in_process else self._link(engine.pool).latency_ms / 1e3
        self.sim.after(latency, self._arrive, engine, q)

    def _arrive(self, engine: SimReplica, q: Sequence) -> None:
        _, group = self.inflight[q.prompt_id]
        self.num_arrived += 1
        for mate in self.on_trainer_core:  # the trainer takes it in on their core
            mate.share_core(self.stages.trainer_sample_s)
        group.lengths.append(q.length)
        group.policy_versions.append(q.policy_version)
        if len(group.lengths) == group.group_size:
            del self.inflight[q.prompt_id]
            del self.lengths[q.prompt_id]
            self.ready.setdefault(group.iteration, deque()).append(group)
            self.recent_lengths.extend(group.lengths)
            self.arrived.fire()
        replica = self.replicas.get(engine.generator_id)
        if replica is not None:
            replica.outstanding.discard((q.prompt_id, q.index))
            self._release_if_drained(replica)
        if replica is None or replica.generator_id not in self.replicas or self._could_take(replica):
            self.dispatch()
        else:
            self._track_barrier()

    def _could_take(self, replica: Replica) -> bool:
        """Whether the dispatcher would give this replica work now. The coordinator dispatches after
        every sample; since the last dispatch, which left nothing any replica could take, only this
        replica's room changed, so only it could take something: when it cannot (the product's
        own tests: its room, the first work it may take, a group kept whole), dispatching would
        change nothing and is skipped (at hundreds of replicas it is most of the time)."""
        q = self.queue
        room = q.room(replica)
        if room <= 0 or not q._pending:
            return False
        index = q._next_for(replica, self._routed)
        if index is None:
            return False
        task, indices = q._pending[index]
        return not (len(task.missing(indices)) > room and room < q.allowance(replica))

    def ready_samples(self, iteration: int) -> int:
        return sum(g.group_size for g in self.ready.get(iteration, ()))

    def take(self, iteration: int, max_samples: int) -> list[SimGroup]:
        """Complete groups of `iteration`, at most max_samples unless one group is larger (GroupAssembler.take)."""
        queue = self.ready[iteration]
        out, total = [], 0
        while queue and (not out or total + queue[0].group_size <= max_samples):
            group = queue.popleft()
            out.append(group)
            total += group.group_size
        if not queue:
            del self.ready[iteration]
        return out

    # ---- weights ----------------------------------------------------------------------
    def announce(self, policy_version: int) -> None:
        """The trainer published a version: the product's relay says who fetches it from where."""
        self._notices[policy_version] = self.sim.now
        size = int(self.stages.weight_bytes)
        self.relay.announce(WeightsNotice(policy_version, size, 0, ""), self.replicas.values())

    def _link(self, pool: str) -> LinkSection:
        far = self._pool_of[pool].datacenter != self.scenario.trainer.datacenter
        return self.scenario.network.cross_datacenter if far else self.scenario.network.local

    def _fetch(self, engine: SimReplica, notice: WeightsNotice) -> None:
        """One copy over one link: transfers from one source (or over the cross link) queue behind each other."""
        if notice.source:  # a pool peer, in the replica's own datacenter
            link, resource, kind = self.scenario.network.local, f"peer:{notice.source}", "local"
        else:
            link = self._link(engine.pool)
            kind = "cross" if link is self.scenario.network.cross_datacenter else "local"
            resource = "cross" if kind == "cross" else "trainer"
        seconds = 0.0 if self.in_process else notice.size_bytes * 8 / (link.bandwidth_gbps * 1e9)
        latency = 0.0 if self.in_process else link.latency_ms / 1e3
        start = max(self.sim.now, self._free_at.get(resource, 0.0))
        self._free_at[resource] = start + seconds
        engine.fetching = True
        if engine.idle and not engine.running:
            engine.track.set("idle", WAITING_WEIGHTS)
        source = "peer" if notice.source else "trainer"
        self.sim.at(start + seconds + latency, self._fetched, engine, notice.policy_version, source,
                    0 if self.in_process else notice.size_bytes, kind)

    def _fetched(self, engine: SimReplica, policy_version: int, source: str, size_bytes: int, kind: str) -> None:
        """A copy arrived (counted now: a version still on its way when the run ends is not)."""
        self.bytes_by_link[kind] += size_bytes
        if not engine.closed:
            engine.fetch_source = source
            engine.weights_fetched(policy_version)

    def _on_report(self, engine: SimReplica) -> None:
        """A load report: the coordinator keeps the replica's PTL(BS) as it reports it."""
        replica = self.replicas.get(engine.generator_id)
        if replica is not None:
            replica.latency_profile = tuple(sorted(engine.ptl.items()))

    def _on_loaded(self, engine: SimReplica, policy_version: int) -> None:
        sync_s = self.sim.now - self._notices.get(policy_version, self.sim.now)
        self.sync_s[policy_version] = max(self.sync_s.get(policy_version, 0.0), sync_s)
        replica = self.replicas.get(engine.generator_id)
        if replica is not None:
            msg = WeightsLoaded(policy_version, sync_s, int(self.stages.weight_bytes), engine.fetch_source)
            self.relay.loaded(replica, msg, self.replicas.values())
