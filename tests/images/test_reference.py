"""Image references as Docker names them, and the settings read from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from cwsandbox_async import SandboxValidationError
from cwsandbox_async.images import ImageOptions, ImageReferenceError, Platform, Reference, parse_reference

DIGEST = "sha256:" + "a" * 64


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("python:3.11", Reference("docker.io", "library/python", "3.11")),
        ("python", Reference("docker.io", "library/python", "latest")),
        ("user/repo", Reference("docker.io", "user/repo", "latest")),
        ("docker.io/python", Reference("docker.io", "library/python", "latest")),
        ("index.docker.io/library/python:3", Reference("docker.io", "library/python", "3")),
        ("localhost/x", Reference("localhost", "x", "latest")),
        ("localhost:5000/a/b:t", Reference("localhost:5000", "a/b", "t")),
        ("127.0.0.1:5000/repo", Reference("127.0.0.1:5000", "repo", "latest")),
        ("ghcr.io/org/img:v1.2-rc_3", Reference("ghcr.io", "org/img", "v1.2-rc_3")),
        (f"python@{DIGEST}", Reference("docker.io", "library/python", None, DIGEST)),
        (f"host:1/r:t@{DIGEST}", Reference("host:1", "r", "t", DIGEST)),
        ("a.b/c__d/e-f.g", Reference("a.b", "c__d/e-f.g", "latest")),
    ],
)
def test_parse(text: str, expected: Reference) -> None:
    assert parse_reference(text) == expected


def test_string_forms() -> None:
    ref = parse_reference(f"python:3.11@{DIGEST}")
    assert str(ref) == f"docker.io/library/python:3.11@{DIGEST}"
    assert ref.selector == DIGEST and ref.api_host == "registry-1.docker.io"
    assert parse_reference("python:3.11").selector == "3.11"


@pytest.mark.parametrize(
    "text",
    [
        "",
        " python",
        "Python",
        "a//b",
        "repo:",
        "repo:-bad",
        "repo@sha256:abc",
        "repo@md5:" + "a" * 32,
        "x/" + "a" * 300,
        "-x",
    ],
)
def test_bad_references(text: str) -> None:
    with pytest.raises(ImageReferenceError) as info:
        parse_reference(text)
    assert isinstance(info.value, SandboxValidationError) and info.value.infrastructure is False


def test_options_from_env(tmp_path: Path) -> None:
    env = {
        "CWSANDBOX_IMAGE_CACHE": str(tmp_path / "c"),
        "CWSANDBOX_INSECURE_REGISTRIES": "reg.lan:5000, other:80",
        "CWSANDBOX_REGISTRY_MIRRORS": "docker.io=127.0.0.1:5000,docker.io=m2:5000,ghcr.io=m3",
        "CWSANDBOX_IMAGE_CACHE_MAX_BYTES": "1000",
    }
    opts = ImageOptions.from_env(env)
    assert opts.cache_dir == tmp_path / "c"
    assert opts.insecure_registries == {"reg.lan:5000", "other:80"}
    assert opts.mirrors == {"docker.io": ("127.0.0.1:5000", "m2:5000"), "ghcr.io": ("m3",)}
    assert opts.max_cache_bytes == 1000
    assert opts.is_insecure("reg.lan:5000") and opts.is_insecure("127.0.0.1:9") and opts.is_insecure("[::1]:5")
    assert not opts.is_insecure("ghcr.io")
    default = ImageOptions.from_env({"HOME": str(tmp_path)})
    assert default.cache_dir == tmp_path / ".cache" / "cwsandbox_async" / "images"
    with pytest.raises(SandboxValidationError):
        ImageOptions.from_env({"CWSANDBOX_REGISTRY_MIRRORS": "nohost"})
    assert Platform.parse("linux/arm/v7") == Platform("linux", "arm", "v7")
