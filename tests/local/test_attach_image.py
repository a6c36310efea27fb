"""Attach to a sandbox run from an image: the attached handle runs commands as the creator's do (the
image's environment and working directory), from the registry entry alone."""

from __future__ import annotations

import pytest
from images.conftest import registry  # noqa: F401  (the fixture: a real registry on 127.0.0.1)

import cwsandbox_async as cwa
from cwsandbox_async.backends.local import LocalBackend
from cwsandbox_async.images import ImageOptions

from .test_image_sandbox import Refs, image_options, refs, session  # noqa: F401  (fixtures)

pytestmark = pytest.mark.usefixtures("registry")


async def test_an_attached_image_sandbox_keeps_the_images_env_and_working_directory(
    session: cwa.Session,  # noqa: F811
    refs: Refs,  # noqa: F811
    image_options: ImageOptions,  # noqa: F811
) -> None:
    sb = await session.sandbox(image=refs.root)
    async with cwa.Session(backend=LocalBackend(images=image_options), handle_signals=False) as other:
        attached = await other.attach(sb.sandbox_id)
        r = await attached.exec(["sh", "-c", "pwd; echo $GREETING; cat hello.txt"])
        assert (r.returncode, r.stdout) == (0, "/app\nhello\nfrom the image\n"), r.stderr
