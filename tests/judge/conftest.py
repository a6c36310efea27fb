"""Fixtures for the judge tests: one Session per module, one sandbox per language, on the local backend."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
from settling_loop import ASYNCIO

import cwsandbox_async as cwa
from cwsandbox_async.judge import LANGUAGES, Language

#: rustc lives in rustup's toolchain directory here, under /root (not visible in a sandbox unless exposed).
RUST_TOOLCHAIN = os.environ.get(
    "CWSANDBOX_TEST_RUST_TOOLCHAIN", os.path.expanduser("~/.rustup/toolchains/stable-x86_64-unknown-linux-gnu")
)

HAVE_RUST = os.path.isdir(RUST_TOOLCHAIN)


def rust_language() -> Language:
    """The Rust entry pointed at the toolchain's own rustc (no rustup proxy, no cargo)."""
    rustc = f"{RUST_TOOLCHAIN}/bin/rustc"
    base = LANGUAGES["rust"]
    assert base.compile is not None
    return dataclasses.replace(base, compile=(rustc, *base.compile[1:]), version=(rustc, "--version"))


@pytest.fixture(scope="module")
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ASYNCIO


@pytest.fixture(scope="module")
async def local_session() -> AsyncIterator[cwa.Session]:
    from local.conftest import bwrap_problem

    if bwrap_problem() is not None:
        pytest.skip(str(bwrap_problem()))
    expose = [RUST_TOOLCHAIN] if HAVE_RUST else []
    defaults = cwa.SandboxDefaults(tags=("judge-tests",), resources=cwa.Resources(memory_mib=1536, pids=256))
    async with cwa.Session(defaults, backend="local", backend_options={"expose": expose}) as session:
        yield session
