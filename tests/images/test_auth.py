"""Authentication against real registries: htpasswd (Basic) and a token realm (Bearer), with
credentials from the files container tools write (``$DOCKER_CONFIG/config.json``, podman's
``REGISTRY_AUTH_FILE``)."""

from __future__ import annotations

import base64
import dataclasses
import json
from pathlib import Path

import pytest

from cwsandbox_async import ImagePullError
from cwsandbox_async.images import ImageOptions, pull
from cwsandbox_async.images._credentials import default_auth_files, find_credentials
from cwsandbox_async.images._reference import parse_reference
from images.conftest import PASSWORD, USER, TokenSetup
from images.servers import Registry


def _docker_config(path: Path, host: str, user: str, password: str, *, split: bool = False) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    entry = (
        {"username": user, "password": password}
        if split
        else {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}
    )
    (path / "config.json").write_text(json.dumps({"auths": {host: entry}}))
    return path / "config.json"


async def test_basic_auth_with_docker_config(basic_registry: Registry, tmp_path: Path, options: ImageOptions) -> None:
    config = _docker_config(tmp_path / "docker", basic_registry.host, USER, PASSWORD)
    files = default_auth_files({"DOCKER_CONFIG": str(tmp_path / "docker"), "HOME": str(tmp_path)})
    assert files == (config,)
    image = await pull(f"{basic_registry.host}/private/busybox:v1", dataclasses.replace(options, auth_files=files))
    assert (image.layers[0] / "bin" / "busybox").is_file()


async def test_basic_auth_without_credentials_is_the_callers(basic_registry: Registry, options: ImageOptions) -> None:
    with pytest.raises(ImagePullError) as info:
        await pull(f"{basic_registry.host}/private/busybox:v1", options)
    assert info.value.infrastructure is False
    assert "needs credentials" in str(info.value) and "UNAUTHORIZED" in str(info.value)


async def test_basic_auth_refused_credentials(basic_registry: Registry, tmp_path: Path, options: ImageOptions) -> None:
    config = _docker_config(tmp_path / "docker", basic_registry.host, USER, "wrong", split=True)
    with pytest.raises(ImagePullError) as info:
        await pull(f"{basic_registry.host}/private/busybox:v1", dataclasses.replace(options, auth_files=(config,)))
    assert info.value.infrastructure is False
    assert "refused the credentials" in str(info.value)
    assert list((options.cache_dir / "images").iterdir()) == []


async def test_bearer_token_flow(token_registry: TokenSetup, tmp_path: Path, options: ImageOptions) -> None:
    """Podman's REGISTRY_AUTH_FILE: the token server gets these credentials, the registry the token."""
    host = token_registry.registry.host
    auth_file = tmp_path / "auth.json"
    auth_file.write_text(
        json.dumps({"auths": {f"{host}/private": {"auth": base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}}})
    )
    files = default_auth_files({"REGISTRY_AUTH_FILE": str(auth_file), "HOME": str(tmp_path)})
    assert files[0] == auth_file
    before = len(token_registry.tokens.requests)
    image = await pull(f"{host}/private/layered:v1", dataclasses.replace(options, auth_files=files))
    assert (image.layers[1] / "o" / "new").read_bytes() == b"new"
    asked = token_registry.tokens.requests[before:]
    assert len(asked) == 1, "one token serves the whole pull"
    assert asked[0]["scope"] == "repository:private/layered:pull"
    assert asked[0]["service"] == token_registry.tokens.SERVICE
    assert asked[0]["authorization"].startswith("Basic ")


async def test_bearer_token_refused(token_registry: TokenSetup, tmp_path: Path, options: ImageOptions) -> None:
    host = token_registry.registry.host
    config = _docker_config(tmp_path / "d", host, USER, "nope")
    with pytest.raises(ImagePullError) as info:
        await pull(f"{host}/private/layered:v1", dataclasses.replace(options, auth_files=(config,)))
    assert info.value.infrastructure is False
    assert "refused the credentials" in str(info.value) and "bad user name or password" in str(info.value)


def test_credential_lookup_rules(tmp_path: Path) -> None:
    hub = tmp_path / "hub.json"
    hub.write_text(
        json.dumps(
            {
                "auths": {
                    "https://index.docker.io/v1/": {"auth": base64.b64encode(b"hubuser:hubpass").decode()},
                    "reg.example:5000": {"auth": base64.b64encode(b"a:1").decode()},
                    "reg.example:5000/team": {"username": "b", "password": "2"},
                }
            }
        )
    )
    found = find_credentials(parse_reference("python:3.11"), (hub,))
    assert found is not None and (found.username, found.password) == ("hubuser", "hubpass")
    assert "hubpass" not in repr(found)
    team = find_credentials(parse_reference("reg.example:5000/team/app"), (hub,))
    other = find_credentials(parse_reference("reg.example:5000/other/app"), (hub,))
    assert team is not None and team.username == "b"
    assert other is not None and other.username == "a"
    assert find_credentials(parse_reference("ghcr.io/o/r"), (hub,)) is None
    assert find_credentials(parse_reference("python"), (tmp_path / "missing.json",)) is None
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ImagePullError) as info:
        find_credentials(parse_reference("python"), (broken,))
    assert info.value.infrastructure is False
