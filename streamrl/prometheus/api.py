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
    def __init__(self, url: str, timeout_s: float = 10.0):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _params(self, expr: str, at: float | None) -> dict:
        return {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """An instant query's result vector."""
        try:
            reply = httpx.get(f"{self.url}/api/v1/query", params=self._params(expr, at), timeout=self.timeout_s)
        except httpx.HTTPError as err:
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {err}") from None
        return _result(expr, reply)

    async def aquery(self, expr: str, at: float | None = None) -> list[dict]:
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s) as http:
                reply = await http.get(f"{self.url}/api/v1/query", params=self._params(expr, at))
        except httpx.HTTPError as err:
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {err}") from None
        return _result(expr, reply)

    def query_all(self, exprs: dict[str, str]) -> dict[str, list[dict]]:
        return {k: self.query(e) for k, e in exprs.items()}

    async def aquery_all(self, exprs: dict[str, str]) -> dict[str, list[dict]]:
        return {k: await self.aquery(e) for k, e in exprs.items()}
