"""Pushing test images through the registry v2 HTTP API (monolithic blob uploads), synchronously."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request

from images.build import ImageSpec, sha256

TIMEOUT = 30


class Pusher:
    """Pushes to ``http://host`` with an optional ``Authorization`` header."""

    def __init__(self, host: str, authorization: str | None = None) -> None:
        self.base = f"http://{host}"
        self.authorization = authorization

    @classmethod
    def basic(cls, host: str, user: str, password: str) -> Pusher:
        return cls(host, "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())

    def _do(
        self, method: str, url: str, data: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str]]:
        request = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
        if self.authorization:
            request.add_header("Authorization", self.authorization)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
                response.read()
                return response.status, dict(response.headers)
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and method == "HEAD":
                return 404, {}
            raise AssertionError(f"{method} {url}: {exc.code} {exc.read()[:300]!r}") from exc

    def blob(self, repo: str, data: bytes) -> None:
        digest = sha256(data)
        status, _ = self._do("HEAD", f"{self.base}/v2/{repo}/blobs/{digest}")
        if status == 200:
            return
        _, headers = self._do("POST", f"{self.base}/v2/{repo}/blobs/uploads/", b"")
        location = headers["Location"]
        if location.startswith("/"):
            location = self.base + location
        sep = "&" if "?" in location else "?"
        self._do(
            "PUT",
            f"{location}{sep}digest={urllib.parse.quote(digest)}",
            data,
            {"Content-Type": "application/octet-stream"},
        )

    def manifest(self, repo: str, tag: str, body: bytes, media_type: str) -> None:
        self._do("PUT", f"{self.base}/v2/{repo}/manifests/{tag}", body, {"Content-Type": media_type})

    def image(self, repo: str, tag: str, spec: ImageSpec) -> None:
        for data in spec.blobs.values():
            self.blob(repo, data)
        self.manifest(repo, tag, spec.manifest, spec.media_type)

    def index(self, repo: str, tag: str, images: list[ImageSpec], index: bytes) -> None:
        for spec in images:
            self.image(repo, spec.digest, spec)
        media = json.loads(index)["mediaType"]
        self.manifest(repo, tag, index, media)
