"""Elastic generators: the policy (pure), its inputs from Prometheus and one shared round.
The drivers live with their control planes: streamrl.local.autoscaler (processes of `streamrl
run`) and streamrl.operator.scaling (the operator's: its RLJob spec and status)."""
