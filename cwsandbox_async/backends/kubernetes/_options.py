"""Options of the Kubernetes backend: one frozen dataclass, validated once, before any I/O."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from ..._errors import SandboxValidationError
from ..._validate import validate_number, validate_option_names, validate_optional_str

__all__ = ["TIMEOUT_DEFAULTS", "KubernetesOptions"]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_PULL_POLICIES = ("Always", "IfNotPresent", "Never")


#: The timeouts and budgets (seconds) and their defaults. ``None`` means the default; a value
#: must be a finite number > 0.
#:
#: - ``request_timeout_seconds``: one REST attempt (a call and its retries get twice that).
#: - ``file_timeout_seconds``: one ``read_file``/``write_file`` stream.
#: - ``max_retry_after_seconds``: the longest ``Retry-After`` honoured.
#: - ``kill_grace_seconds``: between SIGTERM and SIGKILL when a command's timeout fires in the pod.
#: - ``exec_slack_seconds``: past an exec's timeout and kill grace, how long the client still waits
#:   for its status before it gives the stream up (and kills the command's session).
#: - ``drain_seconds``: after an exec's status, how long to wait for the server to close.
#: - ``kill_timeout_seconds``: budget of one background cleanup (killing an abandoned command's
#:   session, reaping a pod whose create landed after its destroy).
#: - ``death_grace_seconds``: once the watch reports a pod dead mid-exec, how long to wait for the
#:   exec's own status before giving up on the stream (a dying container's stream may hang).
#: - ``death_settle_seconds``: once an exec ended like a killed container (exit 137, a hang, no
#:   status) and the container is found not running, how long to wait for the pod's status to
#:   say why (``OOMKilled`` is the program's fault; an eviction is not).
#: - ``default_lifetime_seconds``: ``activeDeadlineSeconds`` of a pod whose sandbox has no
#:   ``max_lifetime_seconds``: every pod ends by itself, even if its driver is SIGKILLed.
#: - ``credential_timeout_seconds``: one run of a kubeconfig credential (exec) plugin.
#: - ``token_refresh_seconds``: how long a token read from a file is used before it is read again.
#: - ``max_backoff_seconds``: the longest pause between retries (REST calls, the shared watch).
#: - ``ws_heartbeat_seconds``: WebSocket ping interval on exec streams (keeps idle load balancers open).
#: - ``watch_stale_seconds``: a pod waiter that heard nothing from a healthy watch this long GETs its pod.
#: - ``watch_down_poll_seconds``: the same while the watch is down.
#: - ``unschedulable_grace_seconds``: how long an Unschedulable pod may wait for capacity (0: fail at once).
TIMEOUT_DEFAULTS: dict[str, float] = {
    "request_timeout_seconds": 30.0,
    "file_timeout_seconds": 300.0,
    "max_retry_after_seconds": 30.0,
    "kill_grace_seconds": 2.0,
    "exec_slack_seconds": 3.0,
    "drain_seconds": 1.0,
    "kill_timeout_seconds": 10.0,
    "death_grace_seconds": 1.0,
    "death_settle_seconds": 10.0,
    "default_lifetime_seconds": 6 * 3600.0,
    "credential_timeout_seconds": 60.0,
    "token_refresh_seconds": 60.0,
    "max_backoff_seconds": 5.0,
    "ws_heartbeat_seconds": 30.0,
    "watch_stale_seconds": 30.0,
    "watch_down_poll_seconds": 5.0,
}


@dataclass(frozen=True)
class KubernetesOptions:
    """Everything ``KubernetesBackend(**options)`` accepts; see the backend's docstring for each field
    and ``TIMEOUT_DEFAULTS`` for the timeouts (``None``: the default).

    Raises ``SandboxValidationError`` for an unknown option or a value of the wrong type or range.
    """

    # where: connection and credentials (default: kubeconfig, then in-cluster)
    namespace: str | None = None
    kubeconfig: str | None = None
    context: str | None = None
    in_cluster: bool | None = None
    service_account_dir: str = "/var/run/secrets/kubernetes.io/serviceaccount"
    server: str | None = None
    token: str | None = None
    token_file: str | None = None
    ca_file: str | None = None
    client_cert_file: str | None = None
    client_key_file: str | None = None
    insecure_skip_tls_verify: bool = False
    tls_server_name: str | None = None
    proxy_url: str | None = None
    # what: the pod
    image: str | None = None
    image_pull_policy: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    runtime_class_name: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    run_as_user: int = 65532
    run_as_group: int = 65532
    host_users: bool | None = None
    read_only_root_filesystem: bool = False
    termination_grace_seconds: int = 1
    # how: API etiquette
    qps: float = 50.0
    burst: int = 100
    max_in_flight: int = 32
    request_timeout_seconds: float = TIMEOUT_DEFAULTS["request_timeout_seconds"]
    max_retries: int = 5
    max_retry_after_seconds: float = TIMEOUT_DEFAULTS["max_retry_after_seconds"]
    watch_timeout_seconds: int = 300
    file_timeout_seconds: float = TIMEOUT_DEFAULTS["file_timeout_seconds"]
    unschedulable_grace_seconds: float = 0.0
    # how: exec cleanup and pod deaths (see TIMEOUT_DEFAULTS)
    kill_grace_seconds: float = TIMEOUT_DEFAULTS["kill_grace_seconds"]
    exec_slack_seconds: float = TIMEOUT_DEFAULTS["exec_slack_seconds"]
    drain_seconds: float = TIMEOUT_DEFAULTS["drain_seconds"]
    kill_timeout_seconds: float = TIMEOUT_DEFAULTS["kill_timeout_seconds"]
    death_grace_seconds: float = TIMEOUT_DEFAULTS["death_grace_seconds"]
    death_settle_seconds: float = TIMEOUT_DEFAULTS["death_settle_seconds"]
    default_lifetime_seconds: float = TIMEOUT_DEFAULTS["default_lifetime_seconds"]
    credential_timeout_seconds: float = TIMEOUT_DEFAULTS["credential_timeout_seconds"]
    token_refresh_seconds: float = TIMEOUT_DEFAULTS["token_refresh_seconds"]
    max_backoff_seconds: float = TIMEOUT_DEFAULTS["max_backoff_seconds"]
    ws_heartbeat_seconds: float = TIMEOUT_DEFAULTS["ws_heartbeat_seconds"]
    watch_stale_seconds: float = TIMEOUT_DEFAULTS["watch_stale_seconds"]
    watch_down_poll_seconds: float = TIMEOUT_DEFAULTS["watch_down_poll_seconds"]
    sweep_on_close: bool = True

    def __post_init__(self) -> None:
        for name in ("namespace", "kubeconfig", "context", "server", "token", "token_file", "ca_file"):
            validate_optional_str(getattr(self, name), name)
        for name in ("client_cert_file", "client_key_file", "tls_server_name", "proxy_url", "image"):
            validate_optional_str(getattr(self, name), name)
        validate_optional_str(self.runtime_class_name, "runtime_class_name")
        if self.namespace is not None and not _DNS_LABEL.match(self.namespace):
            raise SandboxValidationError(f"namespace {self.namespace!r} is not a valid Kubernetes name")
        if self.image_pull_policy is not None and self.image_pull_policy not in _PULL_POLICIES:
            raise SandboxValidationError(f"image_pull_policy must be one of {_PULL_POLICIES}")
        if (self.client_cert_file is None) != (self.client_key_file is None):
            raise SandboxValidationError("client_cert_file and client_key_file go together")
        for name in ("insecure_skip_tls_verify", "read_only_root_filesystem", "sweep_on_close"):
            if not isinstance(getattr(self, name), bool):
                raise SandboxValidationError(f"{name} must be a bool")
        for name in ("in_cluster", "host_users"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                raise SandboxValidationError(f"{name} must be a bool or None")
        for name, default in TIMEOUT_DEFAULTS.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)
            validate_number(getattr(self, name), name)
        if self.unschedulable_grace_seconds is None:
            object.__setattr__(self, "unschedulable_grace_seconds", 0.0)
        validate_number(self.qps, "qps")
        for name in ("burst", "max_in_flight", "watch_timeout_seconds"):
            validate_number(getattr(self, name), name, integer=True)
        for name in ("run_as_user", "run_as_group", "max_retries", "termination_grace_seconds"):
            validate_number(getattr(self, name), name, integer=True, allow_zero=True)
        validate_number(self.unschedulable_grace_seconds, "unschedulable_grace_seconds", allow_zero=True)
        if self.run_as_user == 0:
            raise SandboxValidationError("run_as_user must not be 0: sandboxes run as non-root (runAsNonRoot)")
        for name in ("node_selector", "labels", "annotations"):
            value = getattr(self, name)
            if not isinstance(value, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                raise SandboxValidationError(f"{name} must be a mapping of str to str")
            object.__setattr__(self, name, dict(value))
        secrets = self.image_pull_secrets
        if (
            isinstance(secrets, str)
            or not isinstance(secrets, Sequence)
            or not all(isinstance(s, str) for s in secrets)
        ):
            raise SandboxValidationError("image_pull_secrets must be a sequence of secret names")
        object.__setattr__(self, "image_pull_secrets", tuple(secrets))
        tols = self.tolerations
        if not isinstance(tols, Sequence) or not all(isinstance(t, Mapping) for t in tols):
            raise SandboxValidationError("tolerations must be a sequence of mappings (Kubernetes Toleration objects)")
        object.__setattr__(self, "tolerations", tuple(dict(t) for t in tols))

    @classmethod
    def from_kwargs(cls, options: Mapping[str, Any]) -> KubernetesOptions:
        validate_option_names(options, (f.name for f in fields(cls)), "kubernetes backend")
        return cls(**options)
