"""The rollout core, sans I/O: the rules that hand prompts to generator replicas and take their
samples back (membership and draining, work queue and dispatch order, long-tail routing, weight
relay, groups from dispatch to consumption, refusals, counters, an iteration's plan and tally).
No asyncio, no gRPC, no clock of its own: the trainer service drives it from its event loop,
`streamrl simulate` from simulated time, the same code either way."""
