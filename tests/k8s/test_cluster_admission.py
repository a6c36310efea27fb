"""What only a real kube-apiserver does to a pod create: its decoder, admission plugins and controllers.

Each test runs the backend as a ServiceAccount with the docs' Role in a namespace of its own.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

from cwsandbox_async import SandboxCreationError, SandboxValidationError
from cwsandbox_async.backends.kubernetes._inventory import pods_path
from cwsandbox_async.backends.kubernetes._manifest import build_pod
from cwsandbox_async.testing.contract import make_request, make_spec

from .real import tenant

RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}


async def test_a_misspelled_field_is_a_validation_error_not_dropped(real_cluster: Any) -> None:
    async with tenant(real_cluster) as t:
        backend = t.backend(tolerations=[{"key": "gpu", "operater": "Exists"}])  # "operator", misspelled
        try:
            with pytest.raises(
                SandboxValidationError, match=r'unknown field "spec\.tolerations\[0\]\.operater"'
            ) as info:
                await backend.create(make_spec("typo"))
            assert not info.value.infrastructure
        finally:
            await backend.aclose()
        assert await t.pods() == []


async def test_the_servers_warn_mode_drops_the_field_and_the_warning_is_logged(
    real_cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """What the backend protects against: without Strict, the real server answers 201 without the field."""
    caplog.set_level(logging.WARNING, logger="cwsandbox_async")
    async with tenant(real_cluster) as t:
        backend = t.backend()
        try:
            client, ns = await backend._ensure()
            spec = make_spec("warn")
            pod = build_pod(spec, backend.options, namespace=ns, driver=backend.driver_id)
            pod["spec"]["containers"][0]["imagPullPolicy"] = "Never"  # "imagePullPolicy", misspelled
            made = await client.request("POST", pods_path(ns), params=[("fieldValidation", "Warn")], body=pod)
            assert "imagPullPolicy" not in made["spec"]["containers"][0]  # silently dropped
            assert client.warnings == {'unknown field "spec.containers[0].imagPullPolicy"': 1}
            assert any("imagPullPolicy" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
            await backend.destroy(spec.sandbox_id)
        finally:
            await backend.aclose()
        await t.wait_no_pods()


async def test_a_pod_security_restricted_namespace_accepts_the_backends_pods(real_cluster: Any) -> None:
    async with tenant(real_cluster, labels=RESTRICTED) as t:
        backend = t.backend()
        try:
            spec = make_spec("psa")
            await backend.create(spec)
            r = await backend.exec(spec.sandbox_id, make_request("id", "-u"))
            assert (r.returncode, r.stdout) == (0, b"65532\n")
            await backend.destroy(spec.sandbox_id)
            assert backend.client is not None and backend.client.warnings == {}
        finally:
            await backend.aclose()
        await t.wait_no_pods()


async def test_a_resource_quota_refusal_is_the_callers(real_cluster: Any) -> None:
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "pods"}, "spec": {"hard": {"pods": "1"}}}
    async with tenant(real_cluster) as t:
        quota["metadata"]["namespace"] = t.namespace  # type: ignore[index]
        await t.apply([quota])
        backend = t.backend()
        try:
            first = make_spec("quota")
            await backend.create(first)  # may meet "status unknown for quota" first: waited for, not refused
            with pytest.raises(SandboxCreationError, match="exceeded quota") as info:
                await backend.create(make_spec("quota"))
            assert info.value.reason == "ExceededQuota" and not info.value.infrastructure
            await backend.destroy(first.sandbox_id)
        finally:
            await backend.aclose()
        await t.wait_no_pods()


def _component_pid(cluster: Any, name: str) -> int:
    (pid,) = [c.pid for c in cluster.components if c.name == name]
    return int(pid)


async def test_create_is_retried_until_the_namespaces_service_account_exists(real_cluster: Any) -> None:
    """The ServiceAccount admission plugin refuses pods (403) until ``default`` exists. The controller-manager
    is paused while the account is missing, so the refusal is certain, then resumed: the create succeeds."""
    async with tenant(real_cluster) as t:
        backend = t.backend()
        kcm = _component_pid(real_cluster, "kube-controller-manager")
        try:
            await backend.list([])  # connected, so the counts below are the create's
            assert backend.client is not None
            os.kill(kcm, signal.SIGSTOP)
            try:
                await t.kubectl("-n", t.namespace, "delete", "serviceaccount", "default")
                spec = make_spec("no-sa", create_timeout_seconds=60)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(backend.create, spec)
                    with anyio.fail_after(HANG_GUARD_SECONDS):
                        while backend.client.statuses[403] < 2:  # noqa: ASYNC110 - waiting for the refusals
                            await anyio.sleep(0.05)
                    os.kill(kcm, signal.SIGCONT)  # the serviceaccounts controller recreates "default"
            finally:
                os.kill(kcm, signal.SIGCONT)
            assert (await backend.exec(spec.sandbox_id, make_request("true"))).returncode == 0
            assert backend.client.calls["POST"] >= 3
            await backend.destroy(spec.sandbox_id)
        finally:
            await backend.aclose()
        await t.wait_no_pods()


def _flow_control(ns: str) -> list[dict[str, Any]]:
    """A priority level of one seat that rejects (no queue), for the tenant's ServiceAccount only."""
    level = {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "PriorityLevelConfiguration",
        "metadata": {"name": f"tiny-{ns}"},
        "spec": {
            "type": "Limited",
            "limited": {"nominalConcurrencyShares": 1, "borrowingLimitPercent": 0, "limitResponse": {"type": "Reject"}},
        },
    }
    schema = {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": f"tiny-{ns}"},
        "spec": {
            "priorityLevelConfiguration": {"name": f"tiny-{ns}"},
            "matchingPrecedence": 100,
            "rules": [
                {
                    "subjects": [{"kind": "ServiceAccount", "serviceAccount": {"name": "cwsandbox", "namespace": ns}}],
                    "resourceRules": [
                        {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "namespaces": ["*"]},
                    ],
                }
            ],
        },
    }
    return [level, schema]


async def test_api_priority_and_fairness_429s_are_retried_after_retry_after(real_cluster: Any) -> None:
    """The real server's 429 (plain text, ``Retry-After``) on a priority level of about one seat: every call
    still succeeds, after retries that honoured the header."""
    async with tenant(real_cluster) as t:
        objects = _flow_control(t.namespace)
        await t.apply(objects)
        backend = t.backend(qps=10_000, burst=10_000, max_in_flight=200, max_retries=20)
        try:
            await backend.list([])
            assert backend.client is not None
            with anyio.fail_after(240):
                async with anyio.create_task_group() as tg:
                    for _ in range(400):
                        tg.start_soon(backend.list, ["x"])
            assert backend.client.statuses[429] > 0, backend.client.statuses  # throttled for real
            assert backend.client.retries >= backend.client.statuses[429]
        finally:
            await backend.aclose()
            for obj in objects:
                await t.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "--wait=false")
