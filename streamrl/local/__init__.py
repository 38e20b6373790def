"""`streamrl run`: a job's trainer, generators and ranker as local processes on loopback,
started, supervised or autoscaled, watched and stopped (`run.run`). Knows nothing of
Kubernetes; the operator is the cluster's control plane."""


class RunFailed(RuntimeError):
    """The local run cannot go on; the message says why (it is printed and kept in run.json)."""
