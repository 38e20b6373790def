"""The real kopf operator, in-process, against kmock (an emulated Kubernetes API), under the
RBAC the Helm chart gives its ServiceAccount: cluster-wide by default, namespaced Roles where
a test sets `watch_namespaces`. Any request of the operator RBAC refuses fails the test."""

from __future__ import annotations

import asyncio
import functools
from dataclasses import replace

import kmock
import kopf
import pytest

from streamrl.operator.handlers import register
from streamrl.operator.kube import KubeClient
from streamrl.operator.main import kopf_settings as operator_kopf_settings
from streamrl.operator.runtime import Runtime
from streamrl.operator.settings import Settings
from tests.integration.operator import rbac
from tests.integration.operator.emulator import Emulator, register_kinds
from tests.k8stools import render

OPERATOR_NAMESPACE = "streamrl-system"
"""Where the chart is installed (helm template --namespace) and the operator's settings' namespace."""
OPERATOR_TOKEN = "operator-service-account-token"
"""The bearer token of the operator's clients: the emulator authenticates it as the chart's ServiceAccount."""


@pytest.fixture
def kmock_options(kmock_options):
    return dict(kmock_options, cls=Emulator)


@pytest.fixture
def k8s(kmock):
    register_kinds(kmock)
    return kmock


@pytest.fixture
async def remote_cluster():
    """A second emulated cluster (another datacenter), reached through a KubeClient."""
    async with Emulator() as emulator, kmock.Server(emulator):
        register_kinds(emulator)
        client = KubeClient(str(emulator.url), name="dc-west")
        yield emulator, client
        await client.close()


@functools.cache
def chart_rbac(watch_namespaces: tuple[str, ...]) -> tuple[rbac.User, rbac.Authorizer]:
    """The chart's ServiceAccount and the RBAC it renders for it (`helm template`, the real
    helm) with operator.watchNamespaces as given; () is the default, cluster-wide."""
    sets = [f"operator.watchNamespaces={{{','.join(watch_namespaces)}}}"] if watch_namespaces else []
    objects = render(*sets, namespace=OPERATOR_NAMESPACE)
    [account] = [o for o in objects if o["kind"] == "ServiceAccount"]
    user = rbac.service_account(account["metadata"]["namespace"], account["metadata"]["name"])
    return user, rbac.Authorizer(o for o in objects if o["kind"] in (
        "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"))


@pytest.fixture
def watch_namespaces() -> tuple[str, ...]:
    """The chart's operator.watchNamespaces the operator runs with (and under whose RBAC):
    () = every namespace. A test module parametrizes it to run in both modes."""
    return ()


def _settings() -> kopf.OperatorSettings:
    s = operator_kopf_settings()  # the operator's own (its finalizer and annotations under streamrl.io)
    s.peering.standalone = True
    s.scanning.disabled = True
    s.posting.enabled = False
    s.watching.reconnect_backoff = 0.05
    s.networking.request_timeout = 5
    s.networking.error_backoffs = [0.1]
    s.execution.max_workers = 4
    return s


@pytest.fixture
def kopf_settings() -> kopf.OperatorSettings:
    """The operator's settings (a test module may override this fixture, e.g. to post Events)."""
    return _settings()


@pytest.fixture
def operator_settings() -> Settings:
    """The operator's settings: every job reconciled every 0.5 s (a test module whose timing
    depends on other rounds, the autoscaler's, may slow it down)."""
    return Settings(image="streamrl:test", namespace=OPERATOR_NAMESPACE, status_interval_s=0.5,
                    prometheus_url_allow=("http://127.0.0.1:",))


@pytest.fixture
async def operator(k8s, kopf_settings, operator_settings, watch_namespaces):
    """Start the operator's handlers (a fresh registry, the reconcile timer at the settings'
    interval) with a Runtime talking to kmock, both clients (kopf's and the Runtime's) as the
    chart's ServiceAccount under the chart's RBAC; yields the Runtime so tests can register
    remote clusters or a trainer status source. A request RBAC refused fails the test at
    teardown (a test that expects one removes it from `k8s.refused`)."""
    settings = replace(operator_settings, watch_namespaces=tuple(watch_namespaces))
    registry = register(kopf.OperatorRegistry(), settings, cluster_probe_s=1.0)
    k8s.users[OPERATOR_TOKEN], k8s.authorizer = chart_rbac(tuple(watch_namespaces))

    @kopf.on.login(registry=registry)
    def login_to_kmock(**_):
        return kopf.ConnectionInfo(server=str(k8s.url).rstrip("/"), default_namespace="default",
                                   token=OPERATOR_TOKEN)

    async def no_trainer(job, namespace):
        return None

    runtime = Runtime(KubeClient(str(k8s.url), token=OPERATOR_TOKEN), settings, trainer_status=no_trainer,
                      retry_delay_s=0.3)
    stop_flag, ready_flag = asyncio.Event(), asyncio.Event()
    ignored = set(asyncio.all_tasks())
    root_tasks = await kopf.spawn_tasks(registry=registry, settings=kopf_settings,
                                        clusterwide=not watch_namespaces, namespaces=list(watch_namespaces),
                                        standalone=True, stop_flag=stop_flag, ready_flag=ready_flag,
                                        memo=kopf.Memo(runtime=runtime))
    task = asyncio.create_task(kopf.run_tasks(root_tasks, ignored=ignored))
    await asyncio.wait_for(ready_flag.wait(), timeout=10)
    yield runtime
    ignored.add(asyncio.current_task())
    # The emulator's server-side connection tasks are not the operator's to wait for.
    ignored.update(t for t in asyncio.all_tasks()
                   if getattr(getattr(t.get_coro(), "cr_code", None), "co_filename", "").endswith(
                       "aiohttp/web_protocol.py"))
    stop_flag.set()
    await asyncio.wait_for(task, timeout=15)
    await runtime.kube.close()
    assert not k8s.refused, "RBAC refused the operator: " + "; ".join(dict.fromkeys(k8s.refused))


async def wait_for(predicate, timeout: float = 10.0, what: str = "condition"):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = None
    while True:
        try:
            if predicate():
                return
        except (KeyError, IndexError, ValueError, TypeError) as err:
            last = err
        if loop.time() > deadline:
            raise AssertionError(f"{what} not met within {timeout}s (last error: {last!r})")
        await asyncio.sleep(0.05)
