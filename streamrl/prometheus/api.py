"""A minimal client of Prometheus's HTTP query API (instant queries), sync and async:
`streamrl run`'s autoscaler and the operator read the scaling inputs through it."""

from __future__ import annotations

import httpx


class PrometheusError(RuntimeError):
    """Prometheus could not be reached or refused a query."""


def _result(expr: str, reply: httpx.Response) -> list[dict]:
    try:
        body = reply.json()
    except ValueError:
        raise PrometheusError(f"PromQL {expr!r}: HTTP {reply.status_code}, not JSON") from None
    if body.get("status") != "success":
        raise PrometheusError(f"PromQL {expr!r}: {body.get('errorType')}: {body.get('error')}")
    return body["data"]["result"]


class PrometheusAPI:
    """Sync queries share one connection pool (creating an HTTP client costs ~25 ms of CPU,
    as much as several queries: an autoscaler polling every second would feel it); close()
    releases it. Async queries open a client per batch (aquery_all), on the caller's loop."""

    def __init__(self, url: str, timeout_s: float = 10.0):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._client: httpx.Client | None = None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _params(self, expr: str, at: float | None) -> dict:
        return {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """An instant query's result vector."""
        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout_s)
        try:
            reply = self._client.get(f"{self.url}/api/v1/query", params=self._params(expr, at))
        except httpx.HTTPError as err:
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {err}") from None
        return _result(expr, reply)

    async def aquery(self, expr: str, at: float | None = None, http: httpx.AsyncClient | None = None) -> list[dict]:
        if http is None:
            async with httpx.AsyncClient(timeout=self.timeout_s) as http:
                return await self.aquery(expr, at, http)
        try:
            reply = await http.get(f"{self.url}/api/v1/query", params=self._params(expr, at))
        except httpx.HTTPError as err:
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {err}") from None
        return _result(expr, reply)

    def query_all(self, exprs: dict[str, str]) -> dict[str, list[dict]]:
        return {k: self.query(e) for k, e in exprs.items()}

    async def aquery_all(self, exprs: dict[str, str]) -> dict[str, list[dict]]:
        async with httpx.AsyncClient(timeout=self.timeout_s) as http:
            return {k: await self.aquery(e, http=http) for k, e in exprs.items()}
