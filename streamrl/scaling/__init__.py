"""Elastic generators: the policy (pure), its inputs from Prometheus, one shared round, and
the two drivers beside them: `local` (processes of `streamrl run`) and `cluster` (the
operator's RLJob spec and status)."""
