"""Whiteouts and opaque directories as a real overlay mount sees them (``unshare -Urm``, overlayfs
with ``userxattr``, as the local backend mounts inside its user namespace)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cwsandbox_async.images import ImageOptions, pull
from images.conftest import Images
from images.servers import Registry

LIST_MERGED = """
import json, os, subprocess, sys
lower, upper, work, merged = sys.argv[1:5]
subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                f"userxattr,lowerdir={lower},upperdir={upper},workdir={work}", merged], check=True)
seen = {}
for root, dirs, files in os.walk(merged):
    for name in files:
        path = os.path.join(root, name)
        seen[os.path.relpath(path, merged)] = open(path).read()
    for name in dirs:
        seen[os.path.relpath(os.path.join(root, name), merged) + "/"] = ""
print(json.dumps(seen))
"""


def _merged(tmp_path: Path, layers: tuple[Path, ...]) -> dict[str, str]:
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    for name in ("upper", "work", "merged"):
        (tmp_path / name).mkdir()
    lower = ":".join(str(p) for p in reversed(layers))  # overlay lists the top layer first
    out = subprocess.run(
        [
            "unshare",
            "-Urm",
            sys.executable,
            "-c",
            LIST_MERGED,
            lower,
            *(str(tmp_path / n) for n in ("upper", "work", "merged")),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode != 0 and "Operation not permitted" in out.stderr:
        pytest.skip(f"user namespaces or overlay mounts are not allowed here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    result: dict[str, str] = json.loads(out.stdout)
    return result


async def test_whiteouts_and_opaque_dirs_through_a_real_overlay(
    registry: Registry, images: Images, options: ImageOptions, tmp_path: Path
) -> None:
    image = await pull(f"{registry.host}/test/layered:v1", options)
    assert _merged(tmp_path, image.layers) == {
        "b": "b2",  # replaced by the top layer
        "d/": "",
        "d/y": "y",  # d/x whited out, d/y from below
        "o/": "",
        "o/new": "new",  # o is opaque: p and q from below are hidden
    }  # a and gone/ (with its content) are whited out
