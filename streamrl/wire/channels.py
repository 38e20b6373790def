"""gRPC channels and servers as the spec's `security` says: message-size and keepalive
options, mutual TLS from files, a shared bearer token on every call (health checks stay
open for probes). asyncio (grpc.aio) on both sides; knows nothing of the services.
"""

from __future__ import annotations

import hmac
from pathlib import Path

import grpc

from streamrl.spec import SecuritySpec

MAX_MESSAGE_BYTES = 16 << 20
"""Weights travel in 1 MiB chunks (trainer.weightChunkBytes), so 16 MiB leaves headroom. A
message beyond it is cut by gRPC (RESOURCE_EXHAUSTED); below it, the trainer refuses and
counts a Connect message larger than a sample of maxNewTokens tokens can be (1 MiB + 10 bytes
a token, streamrl.rollout.refusals), so a bad generator is named rather than just cut off."""
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
CHANNEL_OPTIONS = GRPC_OPTIONS + [
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_reconnect_backoff_ms", 5_000),
]
"""A client channel's connections are its own: by default gRPC shares them process-wide, so a
channel opened to redial a peer that came back inherited a connection still backing off from
the failed attempts before (up to 120 s between tries) and failed at once while the peer was
up. Callers redial on their own backoff (spec.generators.reconnect); a long-lived channel
retries a lost peer at least every 5 s."""
OPEN_METHOD_PREFIX = "/grpc.health.v1.Health/"
"""Calls that need no token (probes)."""


def _read(path: str, what: str) -> bytes:
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


class _Token:
    """Adds `authorization: Bearer <token>` to every call of a channel. grpc.aio files an
    interceptor under the first call kind it implements, so there is one class per kind."""

    def __init__(self, token: str):
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        # A namedtuple at run time; typeshed's grpc stubs declare a plain class.
        return details._replace(  # pyright: ignore[reportAttributeAccessIssue]
            metadata=grpc.aio.Metadata(*(details.metadata or ()), self._header))


class _TokenUnaryUnary(_Token, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(self._details(details), request)


class _TokenUnaryStream(_Token, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):
        return await continuation(self._details(details), request)


class _TokenStreamUnary(_Token, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, details, requests):
        return await continuation(self._details(details), requests)


class _TokenStreamStream(_Token, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, details, requests):
        return await continuation(self._details(details), requests)


def open_channel(address: str, security: SecuritySpec, server_name: str | None = None) -> grpc.aio.Channel:
    """An asyncio channel to `address`, authenticated as the spec says (call from a loop);
    with TLS the peer's certificate must carry `server_name` (default: tls.serverName, the
    trainer's)."""
    token = read_token(security)
    kinds = (_TokenUnaryUnary, _TokenUnaryStream, _TokenStreamUnary, _TokenStreamStream)
    interceptors = [kind(token) for kind in kinds] if token else None
    creds = channel_credentials(security)
    if creds is not None:
        assert security.tls is not None  # the credentials come from it
        options = CHANNEL_OPTIONS + [("grpc.ssl_target_name_override", server_name or security.tls.server_name)]
        return grpc.aio.secure_channel(address, creds, options=options, interceptors=interceptors)
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS, interceptors=interceptors)


def _token_ok(metadata, token: str) -> tuple[bool, str]:
    value = dict(metadata or ()).get("authorization", "")
    if not value:
        return False, "missing bearer token (metadata 'authorization: Bearer <token>')"
    if not hmac.compare_digest(value.encode(), f"Bearer {token}".encode()):
        return False, "invalid bearer token"
    return True, ""


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls without the shared bearer token (UNAUTHENTICATED, with the reason)."""

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


def new_server(security: SecuritySpec) -> grpc.aio.Server:
    """An asyncio server that refuses unauthenticated calls as the spec says."""
    token = read_token(security)
    return grpc.aio.server(options=GRPC_OPTIONS, interceptors=[TokenInterceptor(token)] if token else [])


def add_port(server: grpc.aio.Server, bind: str, security: SecuritySpec) -> int:
    """Bind the server (TLS when the spec has it); returns the port."""
    creds = server_credentials(security)
    return server.add_secure_port(bind, creds) if creds else server.add_insecure_port(bind)
