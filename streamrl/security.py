"""Authentication of every gRPC channel: mutual TLS from files, or a shared bearer token.

With TLS, servers require a client certificate signed by the job's CA, so plaintext and
unauthenticated peers fail the handshake. Without TLS but with a token file, servers
answer UNAUTHENTICATED to calls that lack `authorization: Bearer <token>`. Health checks
stay open so probes work. Knows files and grpc; nothing of the services.
"""

from __future__ import annotations

import hmac
from pathlib import Path

import grpc

from streamrl.spec import SecuritySpec
from streamrl.wire import GRPC_OPTIONS

OPEN_METHOD_PREFIX = "/grpc.health.v1.Health/"


def _read(path: str | None, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise ValueError(f"security.{what} {path}: cannot read: {err.strerror}") from None


def read_token(security: SecuritySpec) -> str | None:
    if not security.token_file:
        return None
    token = _read(security.token_file, "tokenFile").decode().strip()
    if not token:
        raise ValueError(f"security.tokenFile {security.token_file}: empty")
    return token


def server_credentials(security: SecuritySpec) -> grpc.ServerCredentials | None:
    tls = security.tls
    if tls is None:
        return None
    return grpc.ssl_server_credentials(
        [(_read(tls.key_file, "tls.keyFile"), _read(tls.cert_file, "tls.certFile"))],
        root_certificates=_read(tls.ca_file, "tls.caFile"),
        require_client_auth=True,
    )


def channel_credentials(security: SecuritySpec) -> grpc.ChannelCredentials | None:
    tls = security.tls
    if tls is None:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca_file, "tls.caFile"),
        private_key=_read(tls.key_file, "tls.keyFile"),
        certificate_chain=_read(tls.cert_file, "tls.certFile"),
    )


class _TokenClientInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                              grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, token: str):
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, details):
        metadata = list(details.metadata or []) + [self._header]
        return details._replace(metadata=metadata) if hasattr(details, "_replace") else _Details(details, metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._details(details), requests)


class _Details(grpc.ClientCallDetails):
    def __init__(self, base, metadata):
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


def open_channel(address: str, security: SecuritySpec) -> grpc.Channel:
    """A channel to `address` authenticated as the spec says."""
    creds = channel_credentials(security)
    if creds is not None:
        options = GRPC_OPTIONS + [("grpc.ssl_target_name_override", security.tls.server_name)]
        channel = grpc.secure_channel(address, creds, options=options)
    else:
        channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
    token = read_token(security)
    return grpc.intercept_channel(channel, _TokenClientInterceptor(token)) if token else channel


def _token_ok(metadata, token: str) -> tuple[bool, str]:
    value = dict(metadata or ()).get("authorization", "")
    if not value:
        return False, "missing bearer token (metadata 'authorization: Bearer <token>')"
    if not hmac.compare_digest(value.encode(), f"Bearer {token}".encode()):
        return False, "invalid bearer token"
    return True, ""


def _deny(message: str) -> grpc.RpcMethodHandler:
    def abort(request_or_iterator, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return grpc.stream_stream_rpc_method_handler(abort)


class TokenInterceptor(grpc.ServerInterceptor):
    """Sync servers: refuse calls without the shared bearer token."""

    def __init__(self, token: str):
        self.token = token

    def intercept_service(self, continuation, details):
        if details.method.startswith(OPEN_METHOD_PREFIX):
            return continuation(details)
        ok, why = _token_ok(details.invocation_metadata, self.token)
        return continuation(details) if ok else _deny(why)


class AioTokenInterceptor(grpc.aio.ServerInterceptor):
    """asyncio servers: refuse calls without the shared bearer token."""

    def __init__(self, token: str):
        self.token = token

    async def intercept_service(self, continuation, details):
        if details.method.startswith(OPEN_METHOD_PREFIX):
            return await continuation(details)
        ok, why = _token_ok(details.invocation_metadata, self.token)
        if ok:
            return await continuation(details)

        async def abort(request_or_iterator, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, why)

        return grpc.stream_stream_rpc_method_handler(abort)


def server_interceptors(security: SecuritySpec, aio: bool) -> list:
    token = read_token(security)
    if not token:
        return []
    return [AioTokenInterceptor(token) if aio else TokenInterceptor(token)]


def add_port(server, bind: str, security: SecuritySpec) -> int:
    """Bind a sync or aio server as the spec says; returns the port."""
    creds = server_credentials(security)
    return server.add_secure_port(bind, creds) if creds else server.add_insecure_port(bind)
