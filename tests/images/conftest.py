"""Fixtures of the image tests: real registries on 127.0.0.1 (anonymous, htpasswd, token), started
once per session and stopped at its end; test images pushed through the HTTP API.

Without Debian's ``docker-registry`` (``apt-get install docker-registry``), the tests that need a
registry skip with that reason.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cwsandbox_async.images import ImageOptions
from images.build import Entry, ImageSpec, busybox_layer, make_image, make_index
from images.push import Pusher
from images.servers import REGISTRY_BINARY, FaultProxy, Registry, TokenServer

USER, PASSWORD = "tester", "s3cret-pass"


def _need_registry() -> None:
    if REGISTRY_BINARY is None:
        pytest.skip("the distribution registry is not installed (apt-get install docker-registry)")


@dataclass
class Images:
    """What the session pushed to the anonymous registry, by name."""

    busybox: ImageSpec
    layered: ImageSpec
    zstd: ImageSpec | None  # None without the zstd extra
    amd64: ImageSpec
    arm64: ImageSpec
    index: bytes


def layered_image() -> ImageSpec:
    """A base layer and a layer with whiteouts and an opaque directory over it."""
    base = [
        Entry("a", data=b"a"),
        Entry("b", data=b"b"),
        Entry("d", "dir"),
        Entry("d/x", data=b"x"),
        Entry("d/y", data=b"y"),
        Entry("o", "dir"),
        Entry("o/p", data=b"p"),
        Entry("o/q", data=b"q"),
        Entry("gone", "dir"),
        Entry("gone/inner", data=b"inner"),
    ]
    top = [
        Entry(".wh.a"),
        Entry("d", "dir"),
        Entry("d/.wh.x"),
        Entry("o", "dir"),
        Entry("o/.wh..wh..opq"),
        Entry("o/new", data=b"new"),
        Entry(".wh.gone"),
        Entry("b", data=b"b2"),
    ]
    return make_image([base, top], config={"Env": ["LAYERED=1"]})


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    _need_registry()
    server = Registry(tmp_path_factory.mktemp("registry"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def images(registry: Registry) -> Images:
    pusher = Pusher(registry.host)
    busybox = make_image(
        [busybox_layer()],
        config={"Env": ["PATH=/bin", "GREETING=hello"], "WorkingDir": "/tmp", "User": "0", "Cmd": ["sh"]},
    )
    pusher.image("test/busybox", "latest", busybox)
    layered = layered_image()
    pusher.image("test/layered", "v1", layered)
    zstd_image: ImageSpec | None = None
    if importlib.util.find_spec("backports.zstd") is not None:
        zstd_image = make_image(
            [[Entry("z", data=b"zstd layer " * 1000)], [Entry("g", data=b"gzip layer")]], compression=["zstd", "gzip"]
        )
        pusher.image("test/zstd", "v1", zstd_image)
    amd64 = make_image([[Entry("arch", data=b"amd64")]], config={"Env": ["ARCH=amd64"]})
    arm64 = make_image([[Entry("arch", data=b"arm64")]], arch="arm64", variant="v8", config={"Env": ["ARCH=arm64"]})
    index = make_index([(amd64, "amd64", None), (arm64, "arm64", "v8")])
    pusher.index("test/multi", "v1", [amd64, arm64], index)
    return Images(busybox, layered, zstd_image, amd64, arm64, index)


@pytest.fixture(scope="session")
def basic_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A registry behind htpasswd (bcrypt, from apache2-utils' ``htpasswd -B``)."""
    _need_registry()
    htpasswd = shutil.which("htpasswd")
    if htpasswd is None:
        pytest.skip("htpasswd is not installed (apt-get install apache2-utils)")
    root = tmp_path_factory.mktemp("basic-registry")
    line = subprocess.run(
        [htpasswd, "-Bbn", USER, PASSWORD], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    (root / "htpasswd").write_text(line)
    server = Registry(root, {"htpasswd": {"realm": "cwsandbox-test", "path": str(root / "htpasswd")}})
    Pusher.basic(server.host, USER, PASSWORD).image("private/busybox", "v1", make_image([busybox_layer()]))
    yield server
    server.stop()


@dataclass
class TokenSetup:
    registry: Registry
    tokens: TokenServer


@pytest.fixture(scope="session")
def token_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TokenSetup]:
    """A registry that trusts the tokens of a token server of ours (Bearer, as Docker Hub and ghcr)."""
    _need_registry()
    pytest.importorskip("cryptography", reason="the token server signs with cryptography")
    root = tmp_path_factory.mktemp("token-registry")
    tokens = TokenServer(root, USER, PASSWORD)
    server = Registry(root, tokens.registry_auth())
    pusher = Pusher(server.host, "Bearer " + tokens.sign("private/layered", ["pull", "push"]))
    pusher.image("private/layered", "v1", layered_image())
    yield TokenSetup(server, tokens)
    server.stop()
    tokens.stop()


@pytest.fixture
def proxy(registry: Registry) -> Iterator[FaultProxy]:
    server = FaultProxy(registry.host)
    yield server
    server.stop()


@pytest.fixture
def options(tmp_path: Path) -> ImageOptions:
    """A private cache, no credential files of the user's, quick retries."""
    return ImageOptions(cache_dir=tmp_path / "cache", auth_files=(), max_backoff_seconds=0.5, attempts=4)
