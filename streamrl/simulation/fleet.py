"""The simulated rollout side: the rollout core's Fleet (streamrl/rollout/fleet.py: the
product's membership and draining, groups, work queue, dispatch, long-tail routing and weight
relay, as the trainer's Coordinator runs them) over simulated engines and the scenario's links;
each replica's outbox is pumped into its simulated engine, its samples added to their groups.
Knows no trainer loop."""

from __future__ import annotations

from collections.abc import Callable

from streamrl.messages import BatchCap, Hello, WeightsLoaded, WeightsNotice, Work
from streamrl.metrics import WAITING_WEIGHTS
from streamrl.rollout.counters import RolloutCounters
from streamrl.rollout.fleet import Fleet
from streamrl.rollout.longtail import LongTailDemand
from streamrl.rollout.relay import WeightRelay
from streamrl.rollout.replica import Replica
from streamrl.rollout.work import GroupBook, PromptWork, SamplingConfig
from streamrl.rollout.workqueue import WorkQueue
from streamrl.simulation.events import Signal, Simulation, Track
from streamrl.simulation.replica import Sequence, SimReplica
from streamrl.simulation.scenario import LinkSection, Scenario
from streamrl.simulation.stages import Stages
from streamrl.simulation.workload import DrawnPrompt


class _Outbox:
    """Stands in for a replica's asyncio queue: each message goes to the simulated replica at once."""

    def __init__(self, deliver: Callable[[object], None]):
        self.put_nowait = deliver


class SimulatedFleet(Fleet[Sequence]):
    def __init__(self, sim: Simulation, scenario: Scenario, stages: Stages, latency_context: int,
                 demand: Callable[[], LongTailDemand | None]):
        self.sim, self.scenario, self.stages = sim, scenario, stages
        self.latency_context = latency_context
        sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=scenario.workload.max_new_tokens,
                                  seed=scenario.seed)
        super().__init__(WorkQueue(sampling, RolloutCounters(), scenario.dispatch.effective_queue_factor),
                         WeightRelay(frozenset(p.name for p in scenario.generators if p.weight_relay)),
                         GroupBook(scenario.seed), scenario.dispatch, demand)
        self.engines: dict[str, SimReplica] = {}
        self.departed: list[SimReplica] = []
        self.drawn: dict[str, DrawnPrompt] = {}
        """Prompts out, by id, until their group completes: the outputs their samples produce."""
        self.arrived = Signal(sim)
        """Fired when a group completes."""
        self.num_arrived = 0
        """Samples that reached the trainer so far."""
        self.on_trainer_core: list[SimReplica] = []
        """Replicas placed on the trainer's core (placement.cores)."""
        self.barrier_track = Track(sim, "barrier", "busy", "barrier")
        """'busy' while no work is pending or out anywhere (the generation barrier)."""
        self.in_process = scenario.pipeline.mode == "colocated"
        """Colocated: generators run in the trainer's process; weights and samples cross no link."""
        self.sync_s: dict[int, float] = {}
        """Slowest replica's notice-to-swap seconds per version."""
        self.bytes_by_link = {"local": 0.0, "cross": 0.0}
        self._free_at: dict[str, float] = {}
        self._copy_at: dict[tuple[str, int], float] = {}
        """(replica, version) -> when its copy from the trainer is in (its peers' copies, relayed
        as the chunks arrive, cannot be in before it)."""
        self._notices: dict[int, float] = {}
        self._pool_of = {p.name: p for p in scenario.generators}
        self._counter = 0
        self._outgoing: list[tuple[str, object]] = []

    # ---- membership -------------------------------------------------------------------
    def connect(self, pool: str, policy_version: int = 0, held_since: float | None = None) -> SimReplica:
        """A replica says hello (its GPUs held since `held_since`: when it was added, default now)."""
        spec, stage = self._pool_of[pool], self.stages.pools[pool]
        gid = f"{pool}-{self._counter}"
        self._counter += 1
        sizes = sorted({1 << k for k in range(stage.max_batch.bit_length())} | {stage.max_batch})
        points = tuple((b, stage.cost.decode_step_s(b, self.latency_context)) for b in sizes)
        hello = Hello(gid, pool, stage.max_batch, "simulated", policy_version, gid if spec.weight_relay else "", points)
        engine = SimReplica(self.sim, gid, pool, stage.cost, stage.max_batch, Track(self.sim, f"generator-{gid}"),
                            self._on_sample, self._on_loaded, self.scenario.dispatch.low_occupancy,
                            stage.load_s, policy_version, stage.sample_s, points, self._on_report,
                            self.scenario.pipeline.in_flight_updates)
        engine.held_since = self.sim.now if held_since is None else held_since
        self.engines[gid] = engine
        cores, k = self.scenario.placement.cores, self._counter - 1
        if cores and not self.in_process and (1 + k) % cores == 0:  # round-robin after the trainer's core
            self.on_trainer_core.append(engine)
        self.join(Replica.of(hello, outbox=_Outbox(lambda msg, gid=gid: self._deliver(gid, msg))))
        return engine

    def released(self, replica: Replica) -> None:
        """A drained replica leaves at once, its engine closed (its GPUs held no longer)."""
        self.leave(replica.generator_id)
        engine = self.engines.pop(replica.generator_id)
        engine.close()
        self.departed.append(engine)

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
                    drawn = self.drawn[msg.prompt_id]
                    work.setdefault(gid, []).extend(
                        Sequence(msg.prompt_id, i, drawn.lengths[i], drawn.prompt_tokens, msg.min_policy_version,
                                 msg.priority) for i in msg.sample_indices)
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
    def add_drawn(self, iteration: int, drawn: list[DrawnPrompt], prompts: list[PromptWork],
                  min_policy_version: int) -> None:
        """Queue one iteration's prompts (the Fleet's add_prompts), each to produce its drawn outputs."""
        self.drawn.update((p.prompt_id, p) for p in drawn)
        self.add_prompts(iteration, prompts, self.scenario.algorithm.group_size, min_policy_version)

    def at_barrier(self, barrier: bool) -> None:
        self.barrier_track.set("busy" if barrier else "idle", "barrier" if barrier else "")

    # ---- samples in -------------------------------------------------------------------
    def _on_sample(self, engine: SimReplica, q: Sequence) -> None:
        latency = 0.0 if self.in_process else self._link(engine.pool).latency_ms / 1e3
        self.sim.after(latency, self._arrive, engine, q)

    def _arrive(self, engine: SimReplica, q: Sequence) -> None:
        """A sample reaches the trainer (accepted: the simulation makes none it would refuse)."""
        self.num_arrived += 1
        for mate in self.on_trainer_core:  # the trainer takes it in on their core
            mate.share_core(self.stages.trainer_sample_s)
        if self.book.add(q.prompt_id, q.index, q):
            del self.drawn[q.prompt_id]
            self.arrived.fire()
        replica = self.replicas.get(engine.generator_id)
        if replica is not None:
            replica.outstanding.discard((q.prompt_id, q.index))
            self.release_if_drained(replica)
        # The coordinator dispatches after every sample; since the last dispatch, which left nothing
        # any replica could take, only this replica's room changed: when it could take nothing,
        # dispatching would change nothing and is skipped (at hundreds of replicas, most of the time).
        if replica is None or replica.generator_id not in self.replicas or \
                self.queue.could_take(replica, self.routed):
            self.dispatch()
        else:
            self.at_barrier(self.barrier)

    # ---- weights ----------------------------------------------------------------------
    def publish(self, policy_version: int) -> None:
        """The trainer published a version: the product's relay says who fetches it from where."""
        self._notices[policy_version] = self.sim.now
        self.announce(WeightsNotice(policy_version, int(self.stages.weight_bytes), 0, ""))

    def _link(self, pool: str) -> LinkSection:
        far = self._pool_of[pool].datacenter != self.scenario.trainer.datacenter
        return self.scenario.network.cross_datacenter if far else self.scenario.network.local

    def _fetch(self, engine: SimReplica, notice: WeightsNotice) -> None:
        """One copy over one link: transfers from one source (or over the cross link) queue behind
        each other; a copy from a pool peer ends no earlier than the peer's own copy (cut-through)."""
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
        done = start + seconds + latency
        if notice.source:
            done = max(done, self._copy_at.get((notice.source, notice.policy_version), 0.0))
        else:
            self._copy_at[(engine.generator_id, notice.policy_version)] = done
        engine.fetching = True
        if engine.idle and not engine.running:
            engine.track.set("idle", WAITING_WEIGHTS)
        source = "peer" if notice.source else "trainer"
        self.sim.at(done, self._fetched, engine, notice.policy_version, source,
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
        self.loaded(engine.generator_id,
                    WeightsLoaded(policy_version, sync_s, int(self.stages.weight_bytes), engine.fetch_source))
