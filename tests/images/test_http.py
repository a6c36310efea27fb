"""The small parsers registry requests share: Retry-After, the registry's error words, challenges."""

from __future__ import annotations

import email.utils

from cwsandbox_async.images._auth import parse_challenge
from cwsandbox_async.images._http import registry_words, retry_after_seconds
from cwsandbox_async.images._manifest import Descriptor, select_platform
from cwsandbox_async.images._options import Platform


def test_retry_after_seconds_and_dates() -> None:
    assert retry_after_seconds("7") == 7.0
    assert retry_after_seconds(None) is None and retry_after_seconds("soon") is None
    now = 1_800_000_000.0
    assert retry_after_seconds(email.utils.formatdate(now + 30, usegmt=True), now=now) == 30.0
    assert retry_after_seconds(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0


def test_registry_words() -> None:
    body = b'{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}'
    assert registry_words(404, body) == "HTTP 404 (MANIFEST_UNKNOWN: manifest unknown)"
    assert registry_words(502, b"<html>bad gateway</html>") == "HTTP 502 (<html>bad gateway</html>)"
    assert registry_words(500, b"") == "HTTP 500"


def test_parse_challenge() -> None:
    found = parse_challenge(
        'Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push"'
    )
    assert found is not None and found.scheme == "bearer"
    assert found.params == {
        "realm": "https://auth.example/token",
        "service": "registry.example",
        "scope": "repository:a/b:pull,push",
    }
    basic = parse_challenge('Basic realm="Registry Realm"')
    assert basic is not None and basic.scheme == "basic" and basic.params == {"realm": "Registry Realm"}
    assert parse_challenge("") is None and parse_challenge(None) is None


def test_platform_variants() -> None:
    def d(arch: str, variant: str | None, n: int) -> Descriptor:
        return Descriptor("m", "sha256:" + str(n) * 64, 1, Platform("linux", arch, variant))

    arm = [d("arm", "v6", 1), d("arm", "v7", 2), d("arm64", None, 3), d("amd64", "v3", 4), d("amd64", None, 5)]
    assert select_platform(tuple(arm), Platform("linux", "arm", "v7")).digest.startswith("sha256:2")
    assert select_platform(tuple(arm), Platform("linux", "arm64", "v8")).digest.startswith("sha256:3")
    assert select_platform(tuple(arm), Platform("linux", "amd64")).digest.startswith("sha256:5")


def test_the_wait_honours_retry_after_up_to_the_cap() -> None:
    from tenacity import AsyncRetrying, RetryCallState

    from cwsandbox_async.images._http import Retryable, _Wait
    from cwsandbox_async.images._options import ImageOptions

    def state_with(exc: BaseException) -> RetryCallState:
        state = RetryCallState(AsyncRetrying(), None, (), {})
        state.set_exception((type(exc), exc, None))
        return state

    wait = _Wait(ImageOptions(max_backoff_seconds=30.0))
    assert wait(state_with(Retryable("429", retry_after=7.0))) == 7.0
    assert wait(state_with(Retryable("429", retry_after=600.0))) == 30.0
    assert 0.0 <= wait(state_with(Retryable("reset"))) <= 30.0
