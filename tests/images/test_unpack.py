"""Unpacking layers: what is kept, and what a hostile layer is refused (nothing written outside)."""

from __future__ import annotations

import gzip
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cwsandbox_async import ImagePullError
from cwsandbox_async.images import OPAQUE_XATTR, ImageOptions, pull
from cwsandbox_async.images._unpack import UnpackLimits, UnpackResult, unpack_layer
from images.build import MTIME, Entry, compress, make_image, sha256, tar_bytes
from images.push import Pusher
from images.servers import Registry

LIMITS = UnpackLimits(max_bytes=1 << 20, max_entries=1000)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the layer's root that a hostile layer aims at."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "victim").write_text("untouched")
    return path


def _unpack(tmp_path: Path, entries: list[Entry], how: str = "gzip", limits: UnpackLimits = LIMITS) -> Path:
    return _unpack_result(tmp_path, entries, how, limits)[0]


def _unpack_result(
    tmp_path: Path, entries: list[Entry], how: str = "gzip", limits: UnpackLimits = LIMITS
) -> tuple[Path, UnpackResult]:
    blob = tmp_path / "blob"
    raw = tar_bytes(entries)
    blob.write_bytes(compress(raw, how))
    root = tmp_path / "root"
    root.mkdir()
    result = unpack_layer(blob, root, limits, sha256(raw))
    assert result.diff_id == sha256(raw)
    return root, result


def test_kept_modes_links_mtimes_xattrs_whiteouts(tmp_path: Path) -> None:
    root, result = _unpack_result(
        tmp_path,
        [
            Entry("dir", "dir", mode=0o750),
            Entry("dir/exe", data=b"#!", mode=0o755, uid=1000, gid=1000, xattrs={"user.note": "kept"}),
            Entry("dir/suid", data=b"x", mode=0o4755),
            Entry("dir/hard", "hardlink", link="dir/exe"),
            Entry("dir/sym", "symlink", link="/etc/passwd"),
            Entry("dir/fifo", "fifo", mode=0o600),
            Entry("dir/.wh.gone"),
            Entry("opaque", "dir"),
            Entry("opaque/.wh..wh..opq"),
            Entry("forged", data=b"f", xattrs={"user.overlay.opaque": "y", "trusted.x": "1"}),
            Entry("dev/null", "chardev"),
        ],
    )
    assert (root / "dir").stat().st_mode & 0o7777 == 0o750
    assert (root / "dir" / "exe").stat().st_mode & 0o7777 == 0o755
    assert (root / "dir" / "suid").stat().st_mode & 0o7777 == 0o755, "set-uid is dropped in single-uid mode"
    assert (root / "dir" / "exe").stat().st_mtime == MTIME
    assert (root / "dir" / "hard").stat().st_ino == (root / "dir" / "exe").stat().st_ino
    assert os.readlink(root / "dir" / "sym") == "/etc/passwd"
    assert stat.S_ISFIFO((root / "dir" / "fifo").lstat().st_mode)
    whiteout = (root / "dir" / "gone").lstat()
    assert stat.S_ISCHR(whiteout.st_mode) and whiteout.st_rdev == os.makedev(0, 0)
    assert os.getxattr(root / "opaque", OPAQUE_XATTR) == b"y"
    assert os.getxattr(root / "dir" / "exe", "user.note") == b"kept"
    assert os.listxattr(root / "forged") == [], "a layer cannot forge overlay xattrs"
    assert not (root / "dev" / "null").exists(), "device nodes are skipped"
    assert (root / "dir" / "exe").stat().st_uid == os.geteuid(), "single-uid mode: the unpacker's uid"
    assert result.owners == {"dir/exe": (1000, 1000)}, "the original owner is recorded"
    assert result.setid_removed == ["dir/suid"] and result.devices_skipped == ["dev/null"]


@pytest.mark.parametrize(
    "entries",
    [
        [Entry("../outside/victim", data=b"owned")],
        [Entry("/abs", data=b"owned")],
        [Entry("a/../../outside/victim", data=b"owned")],
        [Entry("link", "symlink", link="../outside"), Entry("link/victim", data=b"owned")],
        [Entry("link", "symlink", link="/"), Entry("link/tmp/owned", data=b"owned")],
        [Entry("d", "dir"), Entry("d/up", "symlink", link="../.."), Entry("d/up/outside/victim", data=b"owned")],
        [Entry("hard", "hardlink", link="../outside/victim")],
        [Entry("hard", "hardlink", link="/etc/passwd")],
        [Entry("link", "symlink", link="../outside/victim"), Entry("hard", "hardlink", link="missing")],
        [Entry("link", "symlink", link="../outside"), Entry("link/.wh.victim")],
        [Entry("link", "symlink", link="../outside"), Entry("link/.wh..wh..opq")],
    ],
    ids=[
        "dotdot",
        "absolute",
        "dotdot-inside",
        "write-through-symlink",
        "symlink-to-root",
        "symlink-up",
        "hardlink-outside",
        "hardlink-absolute",
        "hardlink-missing",
        "whiteout-through-symlink",
        "opaque-through-symlink",
    ],
)
def test_hostile_layer_is_refused(tmp_path: Path, outside: Path, entries: list[Entry]) -> None:
    with pytest.raises(ImagePullError) as info:
        _unpack(tmp_path, entries)
    assert info.value.infrastructure is False
    assert "layer refused" in str(info.value)
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    assert (outside / "victim").read_text() == "untouched"


def test_a_zstd_layer(tmp_path: Path) -> None:
    pytest.importorskip("backports.zstd", reason="the zstd extra is not installed")
    root = _unpack(tmp_path, [Entry("d", "dir"), Entry("d/f", data=b"zstd" * 1000)], how="zstd")
    assert (root / "d" / "f").read_bytes() == b"zstd" * 1000


def test_expansion_past_the_bound_is_refused(tmp_path: Path) -> None:
    bomb = [Entry("zeros", data=b"\0" * (8 << 20))]
    blob = gzip.compress(tar_bytes(bomb))
    assert len(blob) < 64 << 10
    with pytest.raises(ImagePullError, match=r"expands past|files pass"):
        _unpack(tmp_path, bomb)


def test_a_sparse_file_past_the_bound_is_refused(tmp_path: Path) -> None:
    """A GNU sparse member is a few bytes of tar that unpack to megabytes of zeros: the bound
    counts what is written, not only what is read."""
    tar = shutil.which("tar")
    if tar is None:
        pytest.skip("GNU tar is not installed")
    work = tmp_path / "work"
    work.mkdir()
    with open(work / "holes", "wb") as f:
        f.truncate(8 << 20)
        f.seek(0, 2)
        f.write(b"x")
    subprocess.run(
        [tar, "--format=gnu", "-cSf", str(tmp_path / "layer.tar"), "-C", str(work), "holes"], check=True, timeout=60
    )
    blob = tmp_path / "layer.tar"
    assert blob.stat().st_size < 64 << 10
    (tmp_path / "root").mkdir()
    with pytest.raises(ImagePullError, match="files pass"):
        unpack_layer(blob, tmp_path / "root", LIMITS)


def test_a_tar_stream_past_the_bound_is_refused_before_it_is_read_into_memory(tmp_path: Path) -> None:
    """Headers count too: a pax header is read whole into memory by tarfile."""
    huge_header = [Entry("f", data=b"", xattrs={"user.big": "x" * (2 << 20)})]
    with pytest.raises(ImagePullError, match="expands past"):
        _unpack(tmp_path, huge_header)


def test_entries_past_the_bound_are_refused(tmp_path: Path) -> None:
    many = [Entry(f"f{i}") for i in range(50)]
    with pytest.raises(ImagePullError, match="more than 20 entries"):
        _unpack(tmp_path, many, limits=UnpackLimits(1 << 20, 20))


def test_wrong_diff_id_is_refused(tmp_path: Path) -> None:
    blob = tmp_path / "blob"
    blob.write_bytes(compress(tar_bytes([Entry("f", data=b"x")]), "gzip"))
    (tmp_path / "root").mkdir()
    with pytest.raises(ImagePullError, match="not the sha256:"):
        unpack_layer(blob, tmp_path / "root", LIMITS, "sha256:" + "1" * 64)


def test_corrupt_archive_is_the_images(tmp_path: Path) -> None:
    blob = tmp_path / "blob"
    blob.write_bytes(b"\x1f\x8b" + b"garbage" * 100)
    (tmp_path / "root").mkdir()
    with pytest.raises(ImagePullError) as info:
        unpack_layer(blob, tmp_path / "root", LIMITS)
    assert info.value.infrastructure is False


def _exists(path: str) -> bool:
    return os.path.lexists(path)


async def test_hostile_image_through_the_registry_leaves_nothing(
    registry: Registry, options: ImageOptions, tmp_path: Path
) -> None:
    good = [Entry("fine", data=b"fine")]
    evil = [Entry("escape", "symlink", link="/tmp"), Entry("escape/pwned", data=b"x")]
    spec = make_image([good, evil])
    Pusher(registry.host).image("test/hostile", "v1", spec)
    with pytest.raises(ImagePullError) as info:
        await pull(f"{registry.host}/test/hostile:v1", options)
    assert info.value.infrastructure is False
    assert not _exists("/tmp/pwned")
    assert list((options.cache_dir / "images").iterdir()) == []
    assert list((options.cache_dir / "tmp").iterdir()) == []
    # neither the refused layer nor the good one it came with is kept (no other pull was running)
    assert list((options.cache_dir / "layers" / "sha256").iterdir()) == []
    assert list((options.cache_dir / "blobs" / "sha256").iterdir()) == []


REMOVE_AS_NOBODY = """
import os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from cwsandbox_async.images._safefs import remove_tree
from cwsandbox_async.images._unpack import UnpackLimits, UnpackResult, unpack_layer
work = Path(sys.argv[2])
os.setgroups([]); os.setgid(65534); os.setuid(65534)
root = work / "layer"; root.mkdir()
unpack_layer(work / "blob", root, UnpackLimits(1 << 20, 100))
assert (root / "locked").stat().st_mode & 0o777 == 0
remove_tree(root)
print(root.exists(), (work / "outside" / "victim").exists())
"""


def test_an_unprivileged_driver_removes_what_it_unpacked(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Directories a layer makes read-only or mode 000 (as nobody: no override) still go, and a
    symlink in them to a directory outside is not followed."""
    if os.geteuid() != 0:
        pytest.skip("runs as root to become nobody")
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="cwsandbox-images-nobody-"))
    request.addfinalizer(lambda: shutil.rmtree(work, ignore_errors=True))
    (work / "outside").mkdir()
    (work / "outside" / "victim").write_text("x")
    os.chmod(work / "outside", 0o555)
    entries = [
        Entry("ro", "dir", mode=0o555),
        Entry("ro/f", data=b"x", mode=0o444),
        Entry("locked", "dir", mode=0o000),
        Entry("locked/inner", "dir", mode=0o000),
        Entry("locked/inner/f", data=b"x"),
        Entry("locked/out", "symlink", link=str(work / "outside")),
    ]
    (work / "blob").write_bytes(compress(tar_bytes(entries), "gzip"))
    os.chmod(work, 0o777)
    os.chmod(work / "blob", 0o644)
    package_root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run(
        [sys.executable, "-c", REMOVE_AS_NOBODY, package_root, str(work)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]
    assert (work / "outside").stat().st_mode & 0o777 == 0o555, "the symlinked directory kept its mode"
