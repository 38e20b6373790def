"""How every gRPC channel is secured: mutual TLS from files, a shared bearer token."""

from __future__ import annotations

from pydantic import Field, model_validator

from streamrl.spec.base import SpecModel

TLS_MOUNT = "/etc/streamrl/tls"
"""Where pods find the job's TLS Secret."""
TOKEN_MOUNT = "/etc/streamrl/token"
"""Where pods find the token Secret the operator mints for a job that names no tokenFile."""


class TLSSpec(SpecModel):
    """Mutual TLS: every service presents a certificate signed by the job's CA and
    requires one from its peers (files, e.g. mounted from a Kubernetes Secret)."""

    ca_file: str = f"{TLS_MOUNT}/ca.crt"
    """PEM file of the CA that signs every service's certificate."""
    cert_file: str = f"{TLS_MOUNT}/tls.crt"
    """PEM certificate of this service."""
    key_file: str = f"{TLS_MOUNT}/tls.key"
    """PEM private key of this service."""
    server_name: str = Field(default="streamrl", min_length=1, max_length=253)
    """Name every certificate carries (subjectAltName DNS) and clients verify, so peers
    can be dialled by IP address."""
    secret_name: str | None = Field(default=None, max_length=253)
    """Kubernetes: the Secret (keys `ca.crt`, `tls.crt`, `tls.key`) the operator mounts at
    /etc/streamrl/tls in every pod, where the default file paths point."""
    generator_server_name: str | None = Field(default=None, min_length=1, max_length=253)
    """The name generators' certificates carry, apart from the trainer's (serverName): a
    generator then serves its pool's weight relay under it and peers verify it, and since its
    certificate does not carry serverName, a generator's key cannot pass for the trainer.
    Unset: one name (and on Kubernetes one certificate) for every role."""
    generator_secret_name: str | None = Field(default=None, max_length=253)
    """Kubernetes: the Secret generator pods mount at /etc/streamrl/tls instead of secretName
    (a certificate for generatorServerName signed by the same CA), e.g. in a remote datacenter
    whose nodes should never hold the trainer's key."""

    @model_validator(mode="after")
    def _generator_identity(self) -> TLSSpec:
        if self.generator_secret_name and not self.generator_server_name:
            raise ValueError("generatorSecretName needs generatorServerName: the name its certificate carries, which "
                             "peers verify")
        if self.generator_server_name == self.server_name:
            raise ValueError(f"generatorServerName must differ from serverName ({self.server_name}): a generator's "
                             "certificate would pass for the trainer's")
        return self


class SecuritySpec(SpecModel):
    """Authentication of every gRPC channel (trainer, generators, weight relays)."""

    tls: TLSSpec | None = None
    """Mutual TLS; plaintext and unauthenticated peers are refused."""
    token_file: str | None = None
    """File holding a shared bearer token, required on every call (used with or without TLS).
    Kubernetes: unset, the operator mints a token per job (a Secret mounted at
    /etc/streamrl/token in every pod) and every role presents and checks it."""
