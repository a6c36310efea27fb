"""Local sandboxes run from container images pulled from a real registry on loopback.

The image's root is an overlay of its layers (read-only, shared) and a private upper bounded by
``workspace_mib``; its ``Env``, ``WorkingDir`` and ``User`` apply; an image with no ``User`` runs as
root of the sandbox's user namespace, with no capability, and the supervisor holds against it. The
images are busybox (no Python: the agent needs nothing from the image), built offline by the image
tests' helpers and pushed to the registry their fixtures start.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from adversarial.test_supervisor import ATTACKS, HOG_INOTIFY, inotify_instances, supervisor_state
from guards import HANG_GUARD_SECONDS
from images.build import Entry, busybox_layer, make_image
from images.conftest import registry  # noqa: F401  (the fixture: a real registry on 127.0.0.1)
from images.push import Pusher
from images.servers import Registry

import cwsandbox_async as cwa
from cwsandbox_async.backends.local import LocalBackend
from cwsandbox_async.images import ImageOptions, list_images, prune

from .conftest import bwrap_problem

pytestmark = pytest.mark.skipif(bwrap_problem() is not None, reason=str(bwrap_problem()))


def _layer_with_app() -> list[Entry]:
    return [
        Entry("app", "dir", mode=0o755),
        Entry("app/hello.txt", data=b"from the image\n"),
        Entry("etc", "dir", mode=0o755),
        Entry("etc/passwd", data=b"root:x:0:0:root:/root:/bin/sh\nworker:x:1234:2345::/app:/bin/sh\n"),
        Entry("etc/group", data=b"root:x:0:\nstaff:x:50:\n"),
    ]


@dataclass
class Refs:
    root: str
    worker: str
    named: str


@pytest.fixture(scope="module")
def refs(registry: Registry) -> Refs:  # noqa: F811
    pusher = Pusher(registry.host)
    config = {"Env": ["PATH=/bin", "GREETING=hello", "SHARED=image"], "WorkingDir": "/app"}
    pusher.image("local/root", "v1", make_image([busybox_layer(), _layer_with_app()], config=config))
    pusher.image(
        "local/worker", "v1", make_image([busybox_layer(), _layer_with_app()], config={**config, "User": "1234"})
    )
    pusher.image(
        "local/named", "v1", make_image([busybox_layer(), _layer_with_app()], config={**config, "User": "worker:staff"})
    )
    return Refs(f"{registry.host}/local/root:v1", f"{registry.host}/local/worker:v1", f"{registry.host}/local/named:v1")


@pytest.fixture
def image_options(tmp_path: Path, registry: Registry) -> ImageOptions:  # noqa: F811
    return ImageOptions(cache_dir=tmp_path / "cache", auth_files=(), insecure_registries=frozenset({registry.host}))


@pytest.fixture
async def session(image_options: ImageOptions) -> AsyncIterator[cwa.Session]:
    defaults = cwa.SandboxDefaults(tags=(f"image-{uuid.uuid4().hex[:8]}",))
    async with cwa.Session(defaults, backend=LocalBackend(images=image_options), handle_signals=False) as s:
        yield s


async def _sh(sb: cwa.Sandbox, script: str) -> cwa.ExecResult:
    return await sb.exec(["sh", "-c", script], timeout_seconds=HANG_GUARD_SECONDS)


async def test_an_image_runs_as_its_root_with_its_env_and_working_directory(session: cwa.Session, refs: Refs) -> None:
    sb = await session.sandbox(image=refs.root)
    r = await _sh(sb, "id -u; id -g; pwd; echo $GREETING; cat hello.txt; ls -ln / | grep ' app$'")
    assert r.returncode == 0, r.stderr
    uid, gid, cwd, greeting, hello, app = r.stdout.splitlines()
    assert (uid, gid, cwd, greeting, hello) == ("0", "0", "/app", "hello", "from the image")
    assert app.split()[2:4] == ["0", "0"]  # the image's files are its root's (single-uid layers)
    # root of the sandbox's user namespace only: no capability, no new privileges
    status = (await sb.exec(["cat", "/proc/self/status"])).stdout
    caps = {k: v.strip() for k, v in (line.split(":", 1) for line in status.splitlines()) if k.startswith("Cap")}
    assert set(caps.values()) == {"0000000000000000"}, caps
    assert "NoNewPrivs:\t1" in status
    # it writes anywhere in its root: the image's directories and new ones at the top
    w = await _sh(sb, "echo edited > /app/hello.txt && mkdir /newdir && echo x > /newdir/f && cat /app/hello.txt")
    assert w.returncode == 0 and w.stdout == "edited\n", w
    # file calls (the native spawner, or a fork of PID 1) write as the image's root
    await sb.write_file("/app/written.txt", b"by the driver")
    assert await sb.read_file("/app/written.txt") == b"by the driver"
    assert (await _sh(sb, "ls -ln /app/written.txt")).stdout.split()[2:4] == ["0", "0"]
    # the agent needs nothing from the image (busybox has no Python): run_python imports the host's stdlib
    source = "import colorsys, fractions, json, os; print(json.dumps([os.getuid(), os.getcwd(), colorsys.__file__]))"
    p = await sb.run_python(source)  # colorsys and fractions: not preloaded, imported from disk in the sandbox
    assert p.returncode == 0 and p.stdout.startswith('[0, "/app", "/run/cwsandbox/python/'), p


async def test_the_sandboxs_own_env_and_working_directory_win(session: cwa.Session, refs: Refs) -> None:
    sb = await session.sandbox(image=refs.root, env={"SHARED": "sandbox"}, working_dir="/work")
    r = await _sh(sb, "echo $GREETING $SHARED; pwd; touch mine && ls")
    assert r.returncode == 0 and r.stdout == "hello sandbox\n/work\nmine\n", r


@pytest.mark.parametrize(("which", "ids"), [("worker", "1234 1234"), ("named", "1234 50")])
async def test_an_image_user_runs_the_commands_and_owns_the_files(
    session: cwa.Session, refs: Refs, which: str, ids: str
) -> None:
    sb = await session.sandbox(image=getattr(refs, which))
    r = await _sh(sb, "echo $(id -u) $(id -g); ls -ln /app/hello.txt; echo more >> /app/hello.txt && echo wrote")
    assert r.returncode == 0, r.stderr
    first, listing, wrote = r.stdout.splitlines()
    assert first == ids
    assert listing.split()[2] == "1234" and wrote == "wrote"


async def test_sandboxes_of_one_image_share_the_lowers_and_keep_their_writes(
    session: cwa.Session, refs: Refs, image_options: ImageOptions
) -> None:
    a, b = await session.sandbox(image=refs.root), await session.sandbox(image=refs.root)
    assert (await _sh(a, "echo a > /app/hello.txt && echo a > /mine")).returncode == 0
    r = await _sh(b, "cat /app/hello.txt; ls /mine 2>&1")
    assert r.stdout.startswith("from the image\n") and "No such file" in r.stdout, r
    on_disk = [p for p in (image_options.cache_dir / "layers").rglob("hello.txt")]
    assert len(on_disk) == 1 and on_disk[0].read_text() == "from the image\n"  # one copy, never written


async def test_the_upper_is_bounded_by_workspace_mib(session: cwa.Session, refs: Refs) -> None:
    sb = await session.sandbox(image=refs.root, resources=cwa.Resources(workspace_mib=4))
    r = await _sh(sb, "busybox dd if=/dev/zero of=/app/big bs=1048576 count=16 2>&1; busybox du -k /app/big")
    assert "No space left" in r.stdout, r
    assert int(r.stdout.split()[-2]) <= 4 * 1024


async def test_the_layer_cache_is_in_no_sandbox(session: cwa.Session, refs: Refs, image_options: ImageOptions) -> None:
    """The template's root holds the image cache's layers (every image's): below a locked, empty tmpfs in
    a host-root sandbox, and below the template's hidden root in an image sandbox."""
    plain = await session.sandbox()
    image = await session.sandbox(image=refs.root)
    layer = next(p for p in (image_options.cache_dir / "layers" / "sha256").iterdir() if (p / "app").is_dir())
    for path in (image_options.cache_dir, layer.parent.parent, layer.parent):  # a cache shared by all (0755),
        path.chmod(0o755)  # as a non-root driver's own uid would find its 0700 one: the hiding alone protects
    for sb, top in ((plain, "/.cwsandbox-layers"), (image, "/run/cwsandbox/template/.cwsandbox-layers")):
        reach = await _sh(sb, f"cat {top}/sha256/{layer.name}/app/hello.txt; ls -a {top}; busybox umount -l {top}")
        assert "from the image" not in reach.stdout and "sha256" not in reach.stdout, reach
        assert "umount" in reach.stderr, reach
    # the template's root (the host-root view) stays below a locked, empty tmpfs in an image sandbox
    below = await _sh(image, "busybox umount -l /run/cwsandbox/template; ls -a /run/cwsandbox/template; echo end")
    assert "umount" in below.stderr and "usr" not in below.stdout and below.stdout.endswith("end\n"), below


async def test_no_command_as_the_images_root_can_change_the_supervisor(session: cwa.Session, refs: Refs) -> None:
    sb = await session.sandbox(image=refs.root)
    pid = session.backend._boxes[sb.sandbox_id].runner.pid  # type: ignore[attr-defined]
    before = supervisor_state(pid)
    r = await sb.run_python(ATTACKS, timeout_seconds=HANG_GUARD_SECONDS)
    assert r.returncode == 0, r.stderr
    results = dict(line.rsplit(" ", 1) for line in r.stdout.splitlines())
    assert results and all(v == "EPERM" for v in results.values()), results
    assert supervisor_state(pid) == before
    ping_range = (await sb.exec(["cat", "/proc/sys/net/ipv4/ping_group_range"])).stdout
    escapes = await _sh(
        sb,
        "kill -9 1; echo 0 > /proc/1/oom_score_adj; echo 0 > /proc/self/oom_score_adj;"
        " busybox mount -t tmpfs x /app; busybox umount -l /proc; busybox chroot /app /bin/sh -c true;"
        " echo 1 > /proc/sys/kernel/shm_rmid_forced; echo '0 0' > /proc/sys/net/ipv4/ping_group_range;"
        " echo x > /sys/kernel/uevent_helper; busybox unshare -U true; echo done",
    )
    assert escapes.stdout == "done\n", escapes
    errors = escapes.stderr
    # ping_group_range: the sandbox's root is uid 0 of the user namespace that owns its network namespace
    # (refused: EACCES from the kernel, and /proc/sys is read-only besides)
    refused_all = ("oom_score_adj", "mount", "umount", "chroot", "shm_rmid_forced", "ping_group_range", "uevent_helper")
    for refused in (*refused_all, "unshare"):
        assert refused in errors, (refused, errors)
    assert (await sb.exec(["cat", "/proc/sys/net/ipv4/ping_group_range"])).stdout == ping_range
    assert (await sb.exec(["echo", "alive"])).stdout == "alive\n"


#: Forks children that sleep until it has made 40 or the kernel refuses; prints how many it made.
FORKS = """
import os, time
made = 0
for _ in range(40):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(3)
        os._exit(0)
    made += 1
print(made)
"""


async def test_limits_hold_against_the_images_root(session: cwa.Session, refs: Refs) -> None:
    sb = await session.sandbox(image=refs.root, resources=cwa.Resources(pids=16, memory_mib=64))
    bomb = await sb.run_python(FORKS, timeout_seconds=HANG_GUARD_SECONDS)
    assert bomb.returncode == 0 and int(bomb.stdout) <= 16 + 4, bomb  # pids.max: pids + the overhead
    hog = await sb.run_python("b = bytearray(256 << 20); print(len(b))", timeout_seconds=HANG_GUARD_SECONDS)
    assert hog.oom_killed, hog


async def test_a_pull_failure_is_image_pull_error_and_leaves_nothing(
    session: cwa.Session,
    refs: Refs,
    registry: Registry,  # noqa: F811
) -> None:
    tags = session.defaults.tags
    before = await session.backend.list(tags)
    with pytest.raises(cwa.ImagePullError) as missing:
        await session.sandbox(image=f"{registry.host}/local/absent:v1")
    assert missing.value.infrastructure is False
    with pytest.raises(cwa.ImagePullError) as down:
        await session.sandbox(image="127.0.0.1:1/local/root:v1")
    assert down.value.infrastructure is True
    assert await session.backend.list(tags) == before
    assert not session.backend._boxes  # type: ignore[attr-defined]


async def test_image_sandboxes_share_a_host_uid_but_not_their_per_user_limits(session: cwa.Session, refs: Refs) -> None:
    """A root driver runs every image sandbox as one host uid (``_host_uids``): the kernel counts inotify
    instances per user at every level of nested user namespaces, so one image sandbox holding all it may
    must still leave a neighbour image sandbox, and the driver, a full share of their own."""
    victim, neighbour = await session.sandbox(image=refs.root), await session.sandbox(image=refs.root)
    hog = HOG_INOTIFY.replace("print(len(held), flush=True)", "open('/tmp/held', 'w').write(str(len(held)))")
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: victim.run_python(hog, timeout_seconds=HANG_GUARD_SECONDS))
        with anyio.fail_after(HANG_GUARD_SECONDS):
            while not (held := (await victim.exec(["cat", "/tmp/held"])).stdout):  # noqa: ASYNC110 (a file in the sandbox)
                await anyio.sleep(0.05)
        assert 0 < int(held) <= 16
        assert inotify_instances(8) == 8  # the driver's own
        r = await neighbour.run_python(HOG_INOTIFY.replace("time.sleep(30)", ""), timeout_seconds=HANG_GUARD_SECONDS)
        assert int(r.stdout) == int(held)  # the neighbour gets a full share of its own
        tg.cancel_scope.cancel()


async def test_a_running_sandbox_holds_its_image_and_a_stopped_one_lets_it_go(
    session: cwa.Session, refs: Refs, image_options: ImageOptions
) -> None:
    sb = await session.sandbox(image=refs.root)
    kept = await prune(0, image_options)  # everything not held
    assert refs.root not in kept.removed and (await sb.exec(["cat", "hello.txt"])).stdout == "from the image\n"
    await sb.stop()
    gone = await prune(0, image_options)
    assert refs.root in gone.removed and not list_images(image_options)


#: A driver as an unprivileged user: one image sandbox and one host-root sandbox; prints what each saw.
NON_ROOT_DRIVER = """
import asyncio, json, os, pathlib, sys
import cwsandbox_async as cwa
from cwsandbox_async.backends.local import LocalBackend
from cwsandbox_async.images import ImageOptions

async def main():
    opts = ImageOptions(cache_dir=pathlib.Path(sys.argv[2]), auth_files=())
    async with cwa.Session(backend=LocalBackend(images=opts), handle_signals=False) as s:
        image = await s.sandbox(image=sys.argv[1])
        script = "id -u; ls -ln /app/hello.txt; echo new > /app/hello.txt && cat /app/hello.txt"
        r = await image.exec(["sh", "-c", script])
        plain = await s.sandbox()
        q = await plain.exec(["sh", "-c", "ls -a /.cwsandbox-layers; echo end"])
        print(json.dumps({"driver": os.getuid(), "image": r.stdout, "plain": q.stdout}))

asyncio.run(main())
"""


def _system_python() -> str | None:
    """An interpreter an unprivileged user can run with this checkout and the virtualenv's packages."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            probe = subprocess.run(
                [candidate, "-c", "import sys; print(sys.version_info[:2] == (3, 11))"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if probe.stdout.strip() == "True":
                return candidate
    return None


@dataclass
class NonRoot:
    argv: list[str]
    env: dict[str, str]
    home: Path


@pytest.fixture
def non_root() -> Iterator[NonRoot]:
    """How to run a driver as ``nobody``: a system Python 3.11 with this checkout and the virtualenv's
    packages on its path, and a home (its image cache) of its own."""
    python, setpriv = _system_python(), shutil.which("setpriv")
    if os.geteuid() != 0 or python is None or setpriv is None:
        pytest.skip("needs root to become another user, setpriv, and a system Python 3.11")
    site = next(Path(sys.prefix, "lib").glob("python3.11/site-packages"))
    home = Path(tempfile.mkdtemp(prefix="cwsandbox-nobody-"))  # pytest's tmp_path is root's alone (0700)
    os.chown(home, 65534, 65534)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": f"{Path(cwa.__file__).parent.parent}:{site}"}
    argv = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", NON_ROOT_DRIVER]
    yield NonRoot(argv, env, home)
    shutil.rmtree(home)


async def test_a_driver_that_is_not_root_runs_images_on_its_own_uid(refs: Refs, non_root: NonRoot) -> None:
    """Without root (no idmapped mounts), the layers are the driver's files, which are the sandbox's user's
    inside: the image's root owns them; a host-root sandbox of that driver (the same uid) cannot see them."""
    argv = [*non_root.argv, refs.root, str(non_root.home / "images")]
    done = await anyio.run_process(argv, env=non_root.env, check=False)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    seen = json.loads(done.stdout)
    assert seen["driver"] == 65534
    uid, listing, content = seen["image"].splitlines()
    assert uid == "0" and listing.split()[2] == "0" and content == "new"
    assert seen["plain"] == "end\n"  # the layer cache is below an empty tmpfs it may not even list
