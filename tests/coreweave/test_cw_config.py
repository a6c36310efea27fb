"""Options, credentials, lazy import, and the status-code table (no server needed)."""

from __future__ import annotations

import os
import subprocess
import sys

import anyio
import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from guards import HANG_GUARD_SECONDS

from cwsandbox_async import (
    SandboxBackendUnavailableError,
    SandboxCreationError,
    SandboxFileError,
    SandboxNotRunningError,
    SandboxTimeoutError,
    SandboxTransportError,
    SandboxValidationError,
)
from cwsandbox_async.backends import load_backend
from cwsandbox_async.backends.coreweave import CoreWeaveOptions
from cwsandbox_async.backends.coreweave._errors import RpcFailure, translate

C = grpc.StatusCode


def test_import_does_not_load_grpc() -> None:
    code = (
        "import sys, cwsandbox_async\n"
        "heavy = [m for m in ('grpc', 'cwsandbox', 'google.protobuf', 'cwsandbox_async.backends.coreweave')"
        " if m in sys.modules]\n"
        "print(heavy)\n"
        "from cwsandbox_async.backends import load_backend\n"
        "load_backend('coreweave', base_url='http://127.0.0.1:9')\n"
        "print('grpc' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=HANG_GUARD_SECONDS
    )
    assert out.stdout.split() == ["[]", "True"]


def test_unknown_and_bad_options_are_validation_errors() -> None:
    with pytest.raises(SandboxValidationError, match="unknown coreweave"):
        load_backend("coreweave", base_ur="http://x")
    for bad in (
        {"base_url": "ftp://host"},
        {"base_url": "https://host/path"},
        {"max_in_flight": 0},
        {"request_timeout_seconds": float("nan")},
        {"auth": "password"},
        {"exec_rpc": "fast"},
        {"annotations": {"a": 1}},
    ):
        with pytest.raises(SandboxValidationError):
            CoreWeaveOptions(**bad)  # type: ignore[arg-type]


def test_endpoint_and_credentials_follow_the_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CWSANDBOX_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("CWSANDBOX_BASE_URL", raising=False)
    opts = CoreWeaveOptions()
    assert (opts.endpoint().target, opts.endpoint().secure) == ("api.cwsandbox.com:443", True)
    with pytest.raises(SandboxBackendUnavailableError, match="CWSANDBOX_API_KEY") as info:
        opts.auth_metadata(opts.endpoint())
    assert info.value.infrastructure is False  # missing credentials are the caller's to fix
    monkeypatch.setenv("CWSANDBOX_BASE_URL", "http://127.0.0.1:5000")
    ep = opts.endpoint()
    assert (ep.target, ep.secure) == ("127.0.0.1:5000", False)
    assert opts.auth_metadata(ep) == ()  # a local insecure test server needs no key
    monkeypatch.setenv("CWSANDBOX_API_KEY", "k1")
    assert opts.auth_metadata(ep) == (("authorization", "Bearer k1"),)
    assert CoreWeaveOptions(api_key="k2").auth_metadata(ep) == (("authorization", "Bearer k2"),)
    monkeypatch.setenv("WANDB_API_KEY", "w1")
    wandb = CoreWeaveOptions(auth="wandb", wandb_entity="team", wandb_project="rl").auth_metadata(ep)
    assert wandb == (("x-wandb-api-key", "w1"), ("x-entity-id", "team"), ("x-project-name", "rl"))


def _error(code: grpc.StatusCode, reason: str | None = None, delay: float | None = None) -> grpc.aio.AioRpcError:
    details = []
    if reason is not None:
        info = any_pb2.Any()
        info.Pack(error_details_pb2.ErrorInfo(reason=reason, domain="cwsandbox.com"))
        details.append(info)
    if delay is not None:
        retry = any_pb2.Any()
        retry.Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=int(delay), nanos=0)))
        details.append(retry)
    trailing = grpc.aio.Metadata()
    if details:
        blob = status_pb2.Status(code=code.value[0], message="m", details=details).SerializeToString()
        trailing.add("grpc-status-details-bin", blob)
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, details="m")


def test_error_details_are_parsed() -> None:
    f = RpcFailure.parse(_error(C.RESOURCE_EXHAUSTED, "CWSANDBOX_RUNNER_OVERLOADED", 3))
    assert (f.reason, f.retry_delay, f.retryable, f.refused_before_start) == (
        "CWSANDBOX_RUNNER_OVERLOADED",
        3,
        True,
        True,
    )
    # a client-side message-size overflow is RESOURCE_EXHAUSTED too, but nothing to retry
    assert RpcFailure.parse(_error(C.RESOURCE_EXHAUSTED)).retryable is False
    # a bare UNAVAILABLE (broken connection) is retryable for reads, but an exec may have run
    bare = RpcFailure.parse(_error(C.UNAVAILABLE))
    assert (bare.retryable, bare.refused_before_start) == (True, False)
    # reasons of other domains are not honoured
    other = _error(C.NOT_FOUND)
    assert RpcFailure.parse(other).reason is None


CASES = [
    (C.NOT_FOUND, "CWSANDBOX_SANDBOX_NOT_FOUND", "exec", SandboxNotRunningError, True),
    (C.FAILED_PRECONDITION, None, "exec", SandboxNotRunningError, True),
    (C.NOT_FOUND, "CWSANDBOX_FILE_NOT_FOUND", "read /x", SandboxFileError, False),
    (C.FAILED_PRECONDITION, "CWSANDBOX_FILE_IS_DIRECTORY", "read /x", SandboxFileError, False),
    (C.UNAUTHENTICATED, None, "list", SandboxBackendUnavailableError, False),
    (C.PERMISSION_DENIED, None, "create sandbox", SandboxBackendUnavailableError, False),
    (C.INVALID_ARGUMENT, "CWSANDBOX_INVALID_REQUEST", "create sandbox", SandboxValidationError, False),
    (C.RESOURCE_EXHAUSTED, "CWSANDBOX_RUNNER_CAPACITY_EXHAUSTED", "create sandbox", SandboxCreationError, True),
    (C.UNAVAILABLE, None, "create sandbox", SandboxBackendUnavailableError, True),
    (C.UNAVAILABLE, None, "exec", SandboxTransportError, True),
    (C.DEADLINE_EXCEEDED, None, "get sandbox", SandboxTimeoutError, True),
    (C.DEADLINE_EXCEEDED, "CWSANDBOX_COMMAND_TIMEOUT", "exec", SandboxTimeoutError, False),
    (C.INTERNAL, None, "exec", SandboxTransportError, True),
    (C.UNIMPLEMENTED, None, "purge sandboxes", SandboxBackendUnavailableError, True),
]


@pytest.mark.parametrize(("code", "reason", "what", "cls", "infra"), CASES)
def test_status_table(code: grpc.StatusCode, reason: str | None, what: str, cls: type, infra: bool) -> None:
    path = "/x" if what.startswith("read") else None
    err = translate(RpcFailure.parse(_error(code, reason)), what, sandbox_id="sbx-1", path=path)
    assert type(err) is cls
    assert err.infrastructure is infra
    assert err.sandbox_id == "sbx-1"


@pytest.mark.parametrize("code", list(grpc.StatusCode))
def test_every_status_code_maps_to_a_library_error(code: grpc.StatusCode) -> None:
    err = translate(RpcFailure.parse(_error(code)), "exec")
    assert err.message


FORKS_WITH_A_CHANNEL = """
import asyncio, os
import cwsandbox_async.backends.coreweave  # before grpc: the backend's fork setting
import grpc.aio

async def main():
    channel = grpc.aio.insecure_channel("127.0.0.1:1")  # nothing listens: grpc's threads are busy retrying
    try:
        await asyncio.wait_for(channel.channel_ready(), 0.5)
    except asyncio.TimeoutError:
        pass
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    await channel.close()

asyncio.run(main())
"""


@pytest.mark.parametrize("setting", [None, "1"])
async def test_a_fork_beside_a_channel_is_quiet(setting: str | None) -> None:
    """grpc.aio has no fork support; left on, grpc logs fork_posix.cc's INFO line on every fork. The backend
    turns it off before grpc loads, unless the user set GRPC_ENABLE_FORK_SUPPORT (then theirs wins)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    if setting is not None:
        env["GRPC_ENABLE_FORK_SUPPORT"] = setting
    with anyio.fail_after(HANG_GUARD_SECONDS):
        proc = await anyio.run_process([sys.executable, "-c", FORKS_WITH_A_CHANNEL], env=env, check=True)
    noisy = b"skipping fork() handlers" in proc.stderr
    assert noisy is (setting == "1"), proc.stderr.decode()


async def test_tls_material_is_loaded_off_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from cwsandbox_async.backends.coreweave import _channel
    from cwsandbox_async.backends.coreweave._options import CoreWeaveOptions, parse_base_url

    loaded_in: list[threading.Thread] = []
    real = _channel.ssl_credentials

    def recording() -> grpc.ChannelCredentials:
        loaded_in.append(threading.current_thread())
        return real()

    monkeypatch.setattr(_channel, "ssl_credentials", recording)
    opts = CoreWeaveOptions(api_key="k")
    channel = await _channel.open_channel(opts, parse_base_url("https://127.0.0.1:1"), ())
    await channel.aclose()
    assert len(loaded_in) == 1 and loaded_in[0] is not threading.main_thread()
    plain = await _channel.open_channel(opts, parse_base_url("http://127.0.0.1:1"), ())
    await plain.aclose()
    assert len(loaded_in) == 1  # no TLS, nothing to load
