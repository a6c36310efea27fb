"""Generated pod manifests: valid against the official OpenAPI models, hardened, labelled for sweeping."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cwsandbox_async as cwa
from cwsandbox_async import SandboxCreationError, SandboxValidationError
from cwsandbox_async._types import Resources, SandboxDefaults, SandboxSpec
from cwsandbox_async.backends.kubernetes import KubernetesOptions
from cwsandbox_async.backends.kubernetes._manifest import build_pod, label_value, tag_key, tags_of
from cwsandbox_async.backends.kubernetes._options import TIMEOUT_DEFAULTS

from .conftest import TEST_IMAGE, BackendFactory, needs_bwrap, wait_no_pods
from .openapi import psa_restricted_violations, validate_pod
from .server import KubeTestServer

FULL_OPTIONS: dict[str, Any] = {
    "image": TEST_IMAGE,
    "image_pull_policy": "IfNotPresent",
    "image_pull_secrets": ["regcred"],
    "runtime_class_name": "gvisor",
    "node_selector": {"pool": "sandboxes"},
    "tolerations": [{"key": "sandbox", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
    "labels": {"team": "rl"},
    "annotations": {"owner": "rl-team"},
    "host_users": False,
    "read_only_root_filesystem": True,
}


def spec(*tags: str, **overrides: Any) -> SandboxSpec:
    return SandboxSpec("sbx-0123456789ab", "sess01", SandboxDefaults(tags=tags).with_overrides(**overrides))


def pod_for(s: SandboxSpec, **options: Any) -> dict[str, Any]:
    opts = KubernetesOptions(**{"image": TEST_IMAGE, **options})
    return build_pod(s, opts, namespace="sandboxes", driver="drv000000001")


@pytest.mark.parametrize(
    "options",
    [{}, FULL_OPTIONS],
    ids=["defaults", "every-option"],
)
@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"resources": Resources(cpu=0.5, memory_mib=512, tmp_mib=64, workspace_mib=2048), "max_lifetime_seconds": 90.5},
        {"resources": Resources(cpu=None, memory_mib=None, tmp_mib=None, workspace_mib=None)},
        {"max_lifetime_seconds": None, "working_dir": "/tmp", "env": {"A": "1", "B": "x y"}, "network": True},
    ],
    ids=["plain", "limits", "no-limits", "workdir-tmp"],
)
def test_manifests_validate(options: dict[str, Any], overrides: dict[str, Any]) -> None:
    pod = pod_for(spec("rl", "step:12", "a/b=c", **overrides), **options)
    assert validate_pod(pod) == []
    assert psa_restricted_violations(pod) == []


def test_the_spec_is_hardened() -> None:
    pod = pod_for(spec("x", max_lifetime_seconds=90.5), **FULL_OPTIONS)
    ps = pod["spec"]
    (main,) = ps["containers"]
    sc = main["securityContext"]
    assert ps["securityContext"]["runAsNonRoot"] is True and ps["securityContext"]["runAsUser"] == 65532
    assert ps["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["readOnlyRootFilesystem"] is True
    assert ps["automountServiceAccountToken"] is False and ps["enableServiceLinks"] is False
    assert ps["restartPolicy"] == "Never" and ps["terminationGracePeriodSeconds"] == 1
    assert ps["activeDeadlineSeconds"] == 91
    assert ps["runtimeClassName"] == "gvisor" and ps["hostUsers"] is False
    assert ps["imagePullSecrets"] == [{"name": "regcred"}] and ps["nodeSelector"] == {"pool": "sandboxes"}
    assert "trap" in main["command"][-1] and "TERM" in main["command"][-1]


def test_resources_map_to_limits_and_volumes() -> None:
    pod = pod_for(spec(resources=Resources(cpu=1.5, memory_mib=300, tmp_mib=10, workspace_mib=20)))
    (main,) = pod["spec"]["containers"]
    assert main["resources"] == {
        "limits": {"cpu": "1500m", "memory": "300Mi"},
        "requests": {"cpu": "1500m", "memory": "300Mi"},
    }
    vols = {v["name"]: v["emptyDir"] for v in pod["spec"]["volumes"]}
    assert vols == {"tmp": {"sizeLimit": "10Mi"}, "workspace": {"sizeLimit": "20Mi"}}
    assert {m["mountPath"] for m in main["volumeMounts"]} == {"/tmp", "/workspace"}


def test_labels_carry_tags_session_and_owner() -> None:
    tags = ("rl", "a" * 100, "exp=12/run:3")
    pod = pod_for(spec(*tags))
    labels = pod["metadata"]["labels"]
    assert labels["app.kubernetes.io/managed-by"] == "cwsandbox-async"
    assert labels["cwsandbox.io/driver"] == "drv000000001" and labels["cwsandbox.io/session"] == "sess01"
    for t in tags:
        assert labels[tag_key(t)] == label_value(t)
    assert tags_of(pod) == tags
    assert json.loads(pod["metadata"]["annotations"]["cwsandbox.io/tags"]) == list(tags)


def test_bad_input_is_a_validation_error() -> None:
    with pytest.raises(SandboxValidationError, match="pod name"):
        build_pod(
            SandboxSpec("Not_A_Pod_Name", "s", SandboxDefaults()),
            KubernetesOptions(image="x"),
            namespace="n",
            driver="d",
        )
    with pytest.raises(SandboxValidationError, match="needs an image"):
        build_pod(SandboxSpec("sbx-1", "s", SandboxDefaults()), KubernetesOptions(), namespace="n", driver="d")
    with pytest.raises(SandboxValidationError, match="unknown kubernetes backend option"):
        KubernetesOptions.from_kwargs({"imagee": "x"})
    for bad in (
        {"run_as_user": 0},
        {"qps": -1},
        {"namespace": "Bad_NS"},
        {"tolerations": "x"},
        {"client_cert_file": "c"},
    ):
        with pytest.raises(SandboxValidationError):
            KubernetesOptions(**bad)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.from_regex(r"^[A-Za-z0-9][A-Za-z0-9_.:=/-]{0,127}$", fullmatch=True), max_size=6, unique=True))
def test_tags_always_become_valid_labels(tags: list[str]) -> None:
    pod = pod_for(spec(*tags))
    assert validate_pod(pod) == []
    assert tags_of(pod) == tuple(tags)
    assert len({tag_key(t) for t in tags}) == len(tags)


def test_psa_checker_catches_what_restricted_forbids() -> None:
    pod = pod_for(spec())
    bad = json.loads(json.dumps(pod))
    sc = bad["spec"]["containers"][0]["securityContext"]
    sc["allowPrivilegeEscalation"] = True
    sc["capabilities"] = {"add": ["SYS_ADMIN"]}
    bad["spec"]["securityContext"]["seccompProfile"] = {"type": "Unconfined"}
    del sc["seccompProfile"]
    assert len(psa_restricted_violations(bad)) == 4
    assert validate_pod({**pod, "spec": {**pod["spec"], "bogus": 1}}) != []


@needs_bwrap
async def test_the_server_received_the_hardened_labelled_pod(
    k8s_server: KubeTestServer, make_backend: BackendFactory
) -> None:
    async with cwa.Session({"tags": ("rl", "step:3")}, backend=make_backend(), handle_signals=False) as s:
        sb = await s.sandbox()
        (post,) = k8s_server.calls("POST", r"/pods$")
        body = post.body
        assert validate_pod(body) == [] and psa_restricted_violations(body) == []
        assert body["metadata"]["labels"]["cwsandbox.io/session"] == s.session_id
        assert body["metadata"]["name"] == sb.sandbox_id
        assert tags_of(body) == ("rl", "step:3")
    await wait_no_pods(k8s_server)


@needs_bwrap
async def test_an_invalid_option_is_refused_by_the_api_server(
    k8s_server: KubeTestServer, make_backend: BackendFactory
) -> None:
    backend = make_backend(tolerations=[{"key": "k", "operator": "Sometimes"}])
    async with cwa.Session(backend=backend, handle_signals=False) as s:
        with pytest.raises(SandboxCreationError) as info:
            await s.sandbox()
    assert info.value.reason == "Invalid" and "Sometimes" in info.value.message
    await wait_no_pods(k8s_server)


@needs_bwrap
async def test_loaded_by_name_through_a_session(k8s_server: KubeTestServer) -> None:
    from cwsandbox_async.backends import load_backend
    from cwsandbox_async.backends.kubernetes import KubernetesBackend

    with pytest.raises(SandboxValidationError, match="unknown kubernetes backend option"):
        load_backend("kubernetes", server=k8s_server.url, imag="typo")
    options = {"server": k8s_server.url, "image": TEST_IMAGE}
    async with cwa.Session(backend="kubernetes", backend_options=options, handle_signals=False) as s:
        assert isinstance(s.backend, KubernetesBackend) and s.backend.isolation == "pod"
        async with s.sandbox() as sb:
            r = await sb.exec("echo $((6 * 7))")
            assert r.stdout == "42\n" and r.ok
            await sb.write_file("/workspace/hello.txt", "héllo")
            assert await sb.read_file("/workspace/hello.txt") == "héllo".encode()
    await wait_no_pods(k8s_server)


def test_every_pod_has_a_finite_deadline() -> None:
    opts = KubernetesOptions(image=TEST_IMAGE, default_lifetime_seconds=1234.5)
    forever = SandboxSpec("sbx-forever", "s", SandboxDefaults(max_lifetime_seconds=None))
    assert build_pod(forever, opts, namespace="ns", driver="d")["spec"]["activeDeadlineSeconds"] == 1235
    bounded = SandboxSpec("sbx-bounded", "s", SandboxDefaults(max_lifetime_seconds=60))
    assert build_pod(bounded, opts, namespace="ns", driver="d")["spec"]["activeDeadlineSeconds"] == 60


@pytest.mark.parametrize("name", sorted(TIMEOUT_DEFAULTS))
def test_timeouts_none_means_the_default_and_must_be_positive(name: str) -> None:
    assert getattr(KubernetesOptions(**{name: None}), name) == TIMEOUT_DEFAULTS[name]
    assert getattr(KubernetesOptions(**{name: 2.5}), name) == 2.5
    for bad in (0, -1, float("nan"), float("inf"), "5", True):
        with pytest.raises(SandboxValidationError, match=name):
            KubernetesOptions(**{name: bad})
