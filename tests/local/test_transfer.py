"""``Sandbox.upload``/``download``: a directory as one archive, traversal-safe both ways.

The unpacker (``_archive.unpack``, the same code on the host and in the sandbox) is fed hostile
archives directly; real sandboxes check the round trip, and the traps a program can set for either
side: symlinks planted in the remote tree (leading out), a symlink already in the local target, and
one planted where an upload lands.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import cwsandbox_async as cwa
from cwsandbox_async import _archive
from cwsandbox_async._sandbox import Sandbox

from .conftest import local_session, requires_isolation

pytestmark = requires_isolation


@pytest.fixture
async def sb(tag: str) -> AsyncIterator[Sandbox]:
    async with local_session(tag) as s, s.sandbox() as box:
        yield box


def tree(root: Path) -> dict[str, object]:
    """Every path under ``root``: a file's bytes and mode, a link's target, a directory's None."""
    out: dict[str, object] = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(top, name)
            rel = str(p.relative_to(root))
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = None
            elif stat.S_ISREG(st.st_mode):
                out[rel] = (p.read_bytes(), st.st_mode & 0o777)
            else:
                out[rel] = "special"
    return out


async def test_a_tree_goes_up_and_comes_back_the_same(sb: Sandbox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg" / "deep").mkdir(parents=True)
    (src / "pkg" / "deep" / "data.bin").write_bytes(bytes(range(256)) * 64)
    (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (src / "run.sh").chmod(0o755)
    (src / "empty").mkdir()
    (src / "link").symlink_to("pkg/deep/data.bin")
    (src / "out-link").symlink_to("/etc/passwd")  # leads out: left out
    os.mkfifo(src / "fifo")  # not a file: left out
    up = await sb.upload(src, "/workspace/up")
    assert (up.files, sorted(up.skipped)) == (2, ["fifo", "out-link"])
    r = await sb.exec(["sh", "-c", "cd /workspace/up && ./run.sh && cat link | wc -c && ls -A | sort | tr '\\n' ' '"])
    assert r.stdout == "ran\n16384\nempty link pkg run.sh ", r.stderr
    back = tmp_path / "back"
    down = await sb.download("/workspace/up", back)
    assert (down.files, down.bytes) == (2, 16384 + len("#!/bin/sh\necho ran\n"))
    expected = tree(src)
    del expected["out-link"], expected["fifo"]
    assert tree(back) == expected


async def test_download_leaves_out_what_a_program_planted_to_lead_out(sb: Sandbox, tmp_path: Path) -> None:
    script = (
        "mkdir -p /workspace/res/sub && echo ok > /workspace/res/sub/ok.txt"
        " && ln -s /etc/passwd /workspace/res/passwd && ln -s ../../../../etc /workspace/res/sub/up"
        " && mkfifo /workspace/res/fifo"
    )
    assert (await sb.exec(["sh", "-c", script])).ok
    local = tmp_path / "res"
    got = await sb.download("/workspace/res", local)
    assert sorted(got.skipped) == ["fifo", "passwd", "sub/up"]
    assert tree(local) == {"sub": None, "sub/ok.txt": (b"ok\n", 0o644)}


async def test_download_never_writes_through_a_symlink_already_in_the_local_target(sb: Sandbox, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    local = tmp_path / "local"
    local.mkdir()
    (local / "sub").symlink_to(outside)
    assert (await sb.exec(["sh", "-c", "mkdir -p /workspace/t/sub && echo x > /workspace/t/sub/f"])).ok
    with pytest.raises(cwa.SandboxFileError, match="sub: not a directory"):
        await sb.download("/workspace/t", local)
    assert list(outside.iterdir()) == []


async def test_upload_never_writes_through_a_symlink_a_program_planted_where_it_lands(
    sb: Sandbox, tmp_path: Path
) -> None:
    assert (
        await sb.exec(["sh", "-c", "mkdir -p /tmp/elsewhere /workspace/up && ln -s /tmp/elsewhere /workspace/up/sub"])
    ).ok
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "f").write_text("x")
    with pytest.raises(cwa.SandboxFileError, match="sub: not a directory"):
        await sb.upload(src, "/workspace/up")
    assert (await sb.exec(["ls", "-A", "/tmp/elsewhere"])).stdout == ""


async def test_sizes_are_bounded_both_ways(sb: Sandbox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "big").write_bytes(b"x" * 5000)
    with pytest.raises(cwa.SandboxValidationError, match="more than 4096 bytes"):
        await sb.upload(src, "/workspace/up", max_bytes=4096)
    assert (await sb.exec(["sh", "-c", "mkdir -p /workspace/d && head -c 5000 /dev/zero > /workspace/d/big"])).ok
    with pytest.raises(cwa.SandboxFileError, match="more than 4096 bytes"):
        await sb.download("/workspace/d", tmp_path / "d", max_bytes=4096)
    with pytest.raises(cwa.SandboxFileError, match="not a directory"):
        await sb.download("/workspace/missing", tmp_path / "m")


# -- the unpacker against hostile archives (the same code runs in the sandbox for an upload) ------------
def archive(*members: tuple[tarfile.TarInfo, bytes]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    buf.seek(0)
    return buf


def member(name: str, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    return info


@pytest.mark.parametrize(
    ("members", "refusal"),
    [
        ([(member("../escaped"), b"x")], "climbs out"),
        ([(member("a/../../escaped"), b"x")], "climbs out"),
        ([(member("/abs-escaped"), b"x")], "not a relative path"),
        ([(member("out", tarfile.SYMTYPE, link="/etc"), b"")], "leads out"),
        ([(member("out", tarfile.SYMTYPE, link="../.."), b"")], "leads out"),
        ([(member("d/up", tarfile.SYMTYPE, link="../../x"), b"")], "leads out"),
        ([(member("hard", tarfile.LNKTYPE, link="/etc/passwd"), b"")], "neither"),
        ([(member("dev", tarfile.CHRTYPE), b"")], "neither"),
        ([(member("fifo", tarfile.FIFOTYPE), b"")], "neither"),
    ],
)
def test_the_unpacker_refuses_what_leads_out_or_is_not_a_file(
    tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes]], refusal: str
) -> None:
    root = tmp_path / "deep" / "root"
    with pytest.raises(_archive.ArchiveError, match=refusal):
        _archive.unpack(archive(*members), str(root), 1 << 20, 100)
    assert [p.name for p in tmp_path.rglob("*")] == ["deep", "root"]


def test_the_unpacker_does_not_walk_through_a_link_an_earlier_member_made(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "real").mkdir(parents=True)
    hostile = archive(
        (member("inside", tarfile.SYMTYPE, link="real"), b""),  # stays inside: made
        (member("inside/f"), b"through the link"),  # but never walked through
    )
    with pytest.raises(_archive.ArchiveError, match="inside: not a directory"):
        _archive.unpack(hostile, str(root), 1 << 20, 100)
    assert list((root / "real").iterdir()) == []


def test_the_unpacker_drops_setuid_and_never_writes_into_a_fifo(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    os.mkfifo(root / "fifo")
    _archive.unpack(archive((member("suid", mode=0o4755), b"#!")), str(root), 1 << 20, 100)
    assert (root / "suid").stat().st_mode & 0o7777 == 0o755
    with pytest.raises(_archive.ArchiveError, match="fifo: No such device or address"):  # opened, never blocked on
        _archive.unpack(archive((member("fifo"), b"x")), str(root), 1 << 20, 100)


def test_the_unpacker_bounds_bytes_and_members(tmp_path: Path) -> None:
    with pytest.raises(_archive.ArchiveError, match="more than 10 bytes"):
        _archive.unpack(archive((member("f"), b"x" * 11)), str(tmp_path / "a"), 10, 100)
    many = archive(*[(member(f"f{i}"), b"") for i in range(5)])
    with pytest.raises(_archive.ArchiveError, match="more than 3 members"):
        _archive.unpack(many, str(tmp_path / "b"), 1 << 20, 3)
