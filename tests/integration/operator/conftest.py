"""The real kopf operator, in-process, against kmock (an emulated Kubernetes API)."""

from __future__ import annotations

import asyncio

import kmock
import kopf
import pytest

from streamrl.operator.handlers import register
from streamrl.operator.kube import KubeClient
from streamrl.operator.main import kopf_settings as operator_kopf_settings
from streamrl.operator.runtime import Runtime
from streamrl.operator.settings import Settings
from tests.integration.operator.emulator import Emulator, register_kinds


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
    return Settings(image="streamrl:test", namespace="streamrl-system", status_interval_s=0.5,
                    prometheus_url_allow=("http://127.0.0.1:",))


@pytest.fixture
async def operator(k8s, kopf_settings, operator_settings):
    """Start the operator's handlers (a fresh registry, the reconcile timer at the settings'
    interval) with a Runtime talking to kmock; yields the Runtime so tests can register remote
    clusters or a trainer status source."""
    settings = operator_settings
    registry = register(kopf.OperatorRegistry(), settings, cluster_probe_s=1.0)

    @kopf.on.login(registry=registry)
    def login_to_kmock(**_):
        return kopf.ConnectionInfo(server=str(k8s.url).rstrip("/"), default_namespace="default")

    async def no_trainer(job, namespace):
        return None

    runtime = Runtime(KubeClient(str(k8s.url)), settings, trainer_status=no_trainer, retry_delay_s=0.3)
    stop_flag, ready_flag = asyncio.Event(), asyncio.Event()
    ignored = set(asyncio.all_tasks())
    root_tasks = await kopf.spawn_tasks(registry=registry, settings=kopf_settings, clusterwide=True, standalone=True,
                                        stop_flag=stop_flag, ready_flag=ready_flag, memo=kopf.Memo(runtime=runtime))
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
