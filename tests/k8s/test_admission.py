"""What kube-apiserver's decoder and admission do to a pod create, modelled by the test server.

The same behaviours are checked on the real control plane in ``test_cluster_admission``;
these run everywhere and pin the backend's side: ``fieldValidation=Strict`` on every write,
``Warning`` headers logged, the plain-text max-in-flight 429, the 403 before a namespace's
ServiceAccount exists (retried), and whose fault each refusal is.
"""

from __future__ import annotations

import logging
import time

import anyio
import pytest
from guards import HANG_GUARD_SECONDS, LONG_SECONDS

from cwsandbox_async import SandboxBackendUnavailableError, SandboxCreationError, SandboxValidationError
from cwsandbox_async.backends.kubernetes._client import warning_texts
from cwsandbox_async.backends.kubernetes._inventory import pods_path
from cwsandbox_async.backends.kubernetes._manifest import build_pod
from cwsandbox_async.testing.contract import make_spec

from .conftest import BackendFactory, needs_bwrap, wait_no_pods
from .server import KubeTestServer

pytestmark = needs_bwrap

SA_MISSING = (
    'pods "x" is forbidden: error looking up service account default/default: serviceaccount "default" not found'
)
QUOTA_UNCOUNTED = 'pods "x" is forbidden: status unknown for quota: pods, resource: pods'
QUOTA = 'pods "x" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=2, limited: pods=2'
MAX_IN_FLIGHT = "Too many requests, please try again later.\n"  # k8s.io/apiserver filters/maxinflight.go


async def test_a_misspelled_field_is_a_validation_error(
    k8s_server: KubeTestServer, make_backend: BackendFactory
) -> None:
    backend = make_backend(tolerations=[{"key": "gpu", "operater": "Exists"}])  # "operator", misspelled
    spec = make_spec("typo")
    with pytest.raises(SandboxValidationError, match=r'unknown field "spec\.tolerations\[0\]\.operater"') as info:
        await backend.create(spec)
    assert not info.value.infrastructure
    (post,) = k8s_server.calls("POST", r"/pods$")
    assert ("fieldValidation", "Strict") in post.query
    assert k8s_server.live_pods() == []


async def test_every_write_asks_for_strict_field_validation(
    k8s_server: KubeTestServer, make_backend: BackendFactory
) -> None:
    backend = make_backend()
    spec = make_spec("strict")
    await backend.create(spec)
    await backend.set_lifetime(spec.sandbox_id, 600)
    await backend.destroy(spec.sandbox_id)
    writes = [r for r in k8s_server.requests if r.method in ("POST", "PATCH", "PUT") and "/exec" not in r.path]
    assert {r.method for r in writes} == {"POST", "PATCH"}
    assert all(("fieldValidation", "Strict") in r.query for r in writes)
    await wait_no_pods(k8s_server)


async def test_warning_headers_are_logged_once_per_text(
    k8s_server: KubeTestServer, make_backend: BackendFactory, caplog: pytest.LogCaptureFixture
) -> None:
    backend = make_backend()
    client, ns = await backend._ensure()
    caplog.set_level(logging.DEBUG, logger="cwsandbox_async")
    for _ in range(2):  # Warn mode (the server's default): the field is dropped with a Warning
        spec = make_spec("warn")
        pod = build_pod(spec, backend.options, namespace=ns, driver=backend.driver_id)
        pod["spec"]["containers"][0]["imagPullPolicy"] = "Never"  # "imagePullPolicy", misspelled
        await client.request("POST", pods_path(ns), params=[("fieldValidation", "Warn")], body=pod)
        await k8s_server.delete_pod(spec.sandbox_id)
    records = [r for r in caplog.records if r.getMessage().startswith("k8s API warning")]
    assert [r.levelno for r in records] == [logging.WARNING, logging.DEBUG]
    assert "spec.containers[0].imagPullPolicy" in records[0].getMessage()
    assert client.warnings == {'unknown field "spec.containers[0].imagPullPolicy"': 2}


def test_warning_header_texts_are_unquoted() -> None:
    assert warning_texts(['299 - "unknown field \\"spec.x\\""', "199 agent plain", "garbage"]) == [
        'unknown field "spec.x"',
        "199 agent plain",
        "garbage",
    ]


async def test_the_plain_text_max_in_flight_429_is_retried_after_retry_after(
    k8s_server: KubeTestServer, make_backend: BackendFactory
) -> None:
    k8s_server.add_fault("status", method="POST", path=r"/pods$", status=429, text=MAX_IN_FLIGHT, retry_after=1)
    backend = make_backend()
    spec = make_spec("throttled")
    await backend.create(spec)
    posts = k8s_server.calls("POST", r"/pods$")
    assert len(posts) == 2
    assert posts[1].t - posts[0].t >= 0.95  # waited Retry-After (a lower bound only)
    await backend.destroy(spec.sandbox_id)
    await wait_no_pods(k8s_server)


@pytest.mark.parametrize("message", [SA_MISSING, QUOTA_UNCOUNTED])
async def test_create_waits_for_the_controllers(
    k8s_server: KubeTestServer, make_backend: BackendFactory, message: str
) -> None:
    k8s_server.add_fault("status", method="POST", path=r"/pods$", status=403, message=message, times=3)
    backend = make_backend()
    spec = make_spec("new-namespace")
    await backend.create(spec)
    assert len(k8s_server.calls("POST", r"/pods$")) == 4
    assert backend.client is not None and backend.client.statuses[403] == 3
    await backend.destroy(spec.sandbox_id)
    await wait_no_pods(k8s_server)


async def test_a_service_account_that_never_appears_fails_at_the_create_deadline(
    k8s_server: KubeTestServer, make_backend: BackendFactory
) -> None:
    k8s_server.add_fault("status", method="POST", path=r"/pods$", status=403, message=SA_MISSING, times=10_000)
    backend = make_backend()
    spec = make_spec("no-sa", create_timeout_seconds=3)
    start = time.monotonic()
    with anyio.fail_after(HANG_GUARD_SECONDS), pytest.raises(SandboxCreationError) as info:
        await backend.create(spec)
    assert time.monotonic() - start >= 1.5  # it kept trying (a lower bound only)
    assert info.value.reason == "ServiceAccountMissing" and info.value.infrastructure  # the controller's job
    assert len(k8s_server.calls("POST", r"/pods$")) >= 3
    assert k8s_server.live_pods() == []


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (QUOTA, "ExceededQuota"),
        ('pods "x" is forbidden: maximum cpu usage per Container is 1, but limit is 2', "LimitRange"),
        (
            'pods "x" is forbidden: User "system:serviceaccount:default:sb" cannot create resource "pods" '
            'in API group "" in the namespace "default"',
            "RBAC",
        ),
        ('pods "x" is forbidden: violates PodSecurity "restricted:latest": runAsNonRoot != true', "PodSecurity"),
        ('admission webhook "deny.example.com" denied the request', "Forbidden"),
    ],
)
async def test_a_refused_create_is_the_callers(
    k8s_server: KubeTestServer, make_backend: BackendFactory, message: str, reason: str
) -> None:
    k8s_server.add_fault("status", method="POST", path=r"/pods$", status=403, message=message)
    backend = make_backend()
    with pytest.raises(SandboxCreationError) as info:
        await backend.create(make_spec("refused"))
    assert info.value.reason == reason
    assert not info.value.infrastructure  # quota, limits, RBAC, policy: the caller's cluster configuration
    assert message in str(info.value)  # the server's words name the permission or the limit
    assert len(k8s_server.calls("POST", r"/pods$")) == 1  # not retried


async def test_a_refused_list_fails_the_create_fast_and_names_the_permission(
    k8s_server: KubeTestServer, make_backend: BackendFactory
) -> None:
    message = 'pods is forbidden: User "system:serviceaccount:default:sb" cannot list resource "pods"'
    k8s_server.add_fault("status", method="GET", path=r"/pods$", status=403, message=message, times=10_000)
    backend = make_backend()
    spec = make_spec("no-list", create_timeout_seconds=LONG_SECONDS)
    # Not the create timeout: the refusal ends the wait.
    with (
        anyio.fail_after(HANG_GUARD_SECONDS),
        pytest.raises(SandboxBackendUnavailableError, match="cannot list resource") as info,
    ):
        await backend.create(spec)
    assert not info.value.infrastructure
    await backend.destroy(spec.sandbox_id)
    await wait_no_pods(k8s_server)
