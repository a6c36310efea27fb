"""Whiteouts and opaque directories as a real overlay mount sees them (``unshare -Urm``, overlayfs
with ``userxattr``, as the local backend mounts inside its user namespace), unpacked by a root
driver and by an unprivileged one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from cwsandbox_async.images import ImageOptions, pull
from images.conftest import Images
from images.servers import Registry

#: Mount the overlay in a new user and mount namespace and list what it shows: "<type> <path>"
#: per entry, then the content of the files that must be there.
LIST_MERGED = (
    'mount -t overlay overlay -o "userxattr,lowerdir=$1,upperdir=$2,workdir=$3" "$4" && cd "$4"'
    " && find . -mindepth 1 -printf '%y %P\\n' | sort && cat b d/y o/new"
)
#: a and gone/ (with its content) whited out, d/x whited out, o opaque (p, q hidden), b replaced.
EXPECTED = "d d\nd o\nf b\nf d/y\nf o/new\nb2ynew"

AS_NOBODY = """
import json, os, subprocess, sys
sys.path.insert(0, sys.argv[1])
from cwsandbox_async.images._unpack import UnpackLimits, unpack_layer
work, blobs, diff_ids, script = sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5]
os.setgroups([]); os.setgid(65534); os.setuid(65534)
layers = []
for i, (blob, diff_id) in enumerate(zip(blobs, diff_ids)):
    root = os.path.join(work, f"layer{i}"); os.mkdir(root); layers.append(root)
    unpack_layer(blob, root, UnpackLimits(1 << 20, 100), diff_id)
dirs = [os.path.join(work, n) for n in ("upper", "work", "merged")]
for d in dirs: os.mkdir(d)
out = subprocess.run(["unshare", "-Urm", "sh", "-c", script, "sh", ":".join(reversed(layers)), *dirs],
                     capture_output=True, text=True, timeout=60)
print(out.stdout, end=""); print(out.stderr, end="", file=sys.stderr); sys.exit(out.returncode)
"""


def _need_unshare() -> None:
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")


def _merged(tmp_path: Path, layers: tuple[Path, ...]) -> str:
    _need_unshare()
    dirs = [tmp_path / n for n in ("upper", "work", "merged")]
    for d in dirs:
        d.mkdir()
    lower = ":".join(str(p) for p in reversed(layers))  # overlay lists the top layer first
    out = subprocess.run(
        ["unshare", "-Urm", "sh", "-c", LIST_MERGED, "sh", lower, *map(str, dirs)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode != 0 and "Operation not permitted" in out.stderr:
        pytest.skip(f"user namespaces or overlay mounts are not allowed here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


async def test_whiteouts_and_opaque_dirs_through_a_real_overlay(
    registry: Registry, images: Images, options: ImageOptions, tmp_path: Path
) -> None:
    image = await pull(f"{registry.host}/test/layered:v1", options)
    assert _merged(tmp_path, image.layers) == EXPECTED


def test_an_unprivileged_driver_unpacks_the_same_overlay(
    images: Images, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Whiteouts (char 0/0, which the kernel lets anyone make since 5.8) and the opaque xattr
    (``user.*``, on one's own files) need no privilege: nobody unpacks, nobody mounts."""
    _need_unshare()
    if os.geteuid() != 0:
        pytest.skip("runs as root to become nobody; an unprivileged run of the suite tests this already")
    import json

    spec = images.layered
    manifest = json.loads(spec.manifest)
    blobs = []
    for i, layer in enumerate(manifest["layers"]):
        blob = tmp_path / f"blob{i}"
        blob.write_bytes(spec.blobs[layer["digest"]])
        blobs.append(str(blob))
    # pytest's tmp_path is private to root: nobody works in a directory of its own under /tmp
    work = Path(tempfile.mkdtemp(prefix="cwsandbox-images-nobody-"))
    request.addfinalizer(lambda: shutil.rmtree(work, ignore_errors=True))
    os.chmod(work, 0o777)
    for blob in blobs:
        os.chmod(blob, 0o644)
        shutil.copy(blob, work)
    blobs = [str(work / Path(b).name) for b in blobs]
    package_root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            AS_NOBODY,
            package_root,
            str(work),
            json.dumps(blobs),
            json.dumps(spec.diff_ids),
            LIST_MERGED,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if out.returncode != 0 and "Operation not permitted" in out.stderr:
        pytest.skip(f"user namespaces or overlay mounts are not allowed for nobody here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == EXPECTED
    assert (work / "layer1" / "a").lstat().st_uid == 65534
