"""Every Python block of README.md and docs/ runs, as written, as a program of its own.

Blocks are found by ``markdown_blocks`` (a new block is a new test, nothing to
register). Each runs as ``python block.py`` in a temporary directory, on the local
backend unless it says otherwise, with W&B offline and no network: the servers a
block talks to (an OpenAI-compatible chat endpoint, a Kubernetes API server) run
here on 127.0.0.1, speaking the real wire protocols. Blocks that need an optional
extra (TRL, ART) skip with the missing modules named when it is not installed.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio
import pytest
from markdown_blocks import ROOT, Block, blocks, doc_files

ALL_BLOCKS = [b for path in doc_files() for b in blocks(path)]
HEAVY = {"trl", "art"}  # extras whose import alone takes 10+ s


def _param(block: Block) -> object:
    marks = [pytest.mark.integration] if HEAVY & set(block.needs) else []
    return pytest.param(block, id=block.id, marks=marks)


# -- services a block may ask for ------------------------------------------------------------


@asynccontextmanager
async def _openai(env: dict[str, str], tmp: Path) -> AsyncIterator[None]:
    from openai_server import ScriptedChatServer

    server = ScriptedChatServer()
    env["OPENAI_BASE_URL"] = await server.start()
    env["OPENAI_API_KEY"] = "sk-test"
    try:
        yield
        assert server.requests, "the block never called the chat endpoint"
    finally:
        await server.stop()


@asynccontextmanager
async def _kubernetes(env: dict[str, str], tmp: Path) -> AsyncIterator[None]:
    from k8s.conftest import BWRAP, wait_no_pods
    from k8s.server import KubeTestServer

    if not BWRAP:
        pytest.skip("the Kubernetes test server runs pod commands in bubblewrap (unavailable)")
    server = KubeTestServer()
    url = await server.start()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": url}}],
        "users": [{"name": "test", "user": {"token": "test-token"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test", "namespace": "default"}}],
        "current-context": "test",
    }
    path = tmp / "kubeconfig"
    path.write_text(json.dumps(config))
    env["KUBECONFIG"] = str(path)
    try:
        yield
        created = [r for r in server.requests if r.method == "POST" and r.path.endswith("/pods")]
        assert created, "the block never created a pod"
        await wait_no_pods(server)  # the block deleted what it created
    finally:
        await server.stop()


@asynccontextmanager
async def _coreweave(env: dict[str, str], tmp: Path) -> AsyncIterator[None]:
    """The CoreWeave test server (real gRPC on 127.0.0.1, real local sandboxes) as ``CWSANDBOX_BASE_URL``."""
    pytest.importorskip("cwsandbox", reason="the coreweave extra (cwsandbox, grpcio) is not installed")
    from coreweave.server import CoreWeaveTestServer

    async with CoreWeaveTestServer(api_key="docs-test-key") as server:
        env["CWSANDBOX_BASE_URL"] = server.url
        env["CWSANDBOX_API_KEY"] = "docs-test-key"
        yield
        assert server.service.calls("CreateSandbox"), "the block never created a sandbox"
        assert not server.service.live(), "the block left sandboxes running"


@asynccontextmanager
async def _registry(env: dict[str, str], tmp: Path) -> AsyncIterator[None]:
    """A distribution registry on 127.0.0.1 serving busybox as the ``docker.io`` mirror, and a fresh image cache."""
    from images.docs_service import REGISTRY_BINARY, docs_registry

    if REGISTRY_BINARY is None:
        pytest.skip("the image blocks need a distribution registry binary (Debian's docker-registry)")
    with docs_registry(tmp) as extra:
        env.update(extra)
        yield


@asynccontextmanager
async def _tiny_model(env: dict[str, str], tmp: Path) -> AsyncIterator[None]:
    """A tiny random causal LM saved to disk, handed to the block as ``MODEL`` (no Hub access)."""
    env["MODEL"] = await anyio.to_thread.run_sync(_save_tiny_model, tmp / "tiny-model")
    yield


def _save_tiny_model(path: Path) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    try:
        from trl_grpo_integration import tiny_offline_model
    finally:
        sys.path.pop(0)
    model, tokenizer, _ = tiny_offline_model()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


SERVICES: dict[str, Callable[[dict[str, str], Path], AbstractAsyncContextManager[None]]] = {
    "openai": _openai,
    "kubernetes": _kubernetes,
    "coreweave": _coreweave,
    "tiny-model": _tiny_model,
    "registry": _registry,
}


def _env(tmp: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp),
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_X_DISABLE_STATS": "true",
        "WANDB_X_DISABLE_MACHINE_INFO": "true",
    }
    for key in (
        "WANDB_API_KEY",
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "KUBECONFIG",
        "MODEL",
        "WANDB_DISABLE_WEAVE",
        "CWSANDBOX_API_KEY",
        "CWSANDBOX_BASE_URL",
        "CWSANDBOX_IMAGE_CACHE",
        "CWSANDBOX_REGISTRY_MIRRORS",
        "CWSANDBOX_INSECURE_REGISTRIES",
        "CWSANDBOX_IMAGE_CACHE_MAX_BYTES",
    ):
        env.pop(key, None)
    return env


# -- the tests ---------------------------------------------------------------------------------


def test_the_docs_have_blocks_and_every_directive_is_known() -> None:
    assert len(ALL_BLOCKS) >= 8, [b.id for b in ALL_BLOCKS]
    for block in ALL_BLOCKS:
        unknown = set(block.services) - set(SERVICES)
        assert not unknown, f"{block.id}: unknown services {sorted(unknown)}"


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in ALL_BLOCKS])
def test_every_block_is_a_whole_program(block: Block) -> None:
    """It parses, and a block that awaits anything also starts its own event loop."""
    tree = ast.parse(block.source, filename=block.id)
    awaits = any(isinstance(n, (ast.Await, ast.AsyncWith, ast.AsyncFor)) for n in ast.walk(tree))
    runs = any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "run"
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id in ("asyncio", "anyio")
        for n in ast.walk(tree)
    )
    assert runs or not awaits, f"{block.id} awaits but never calls asyncio.run/anyio.run"


WEAVE = 'os.environ.setdefault("WANDB_DISABLE_WEAVE", "true")'


def test_blocks_and_examples_that_may_open_a_wandb_run_disable_weave() -> None:
    """With weave installed (ART pulls it in), wandb.init may stop at a weave API-key prompt."""
    examples = [ROOT / "examples" / "trl_grpo_integration.py", ROOT / "examples" / "art" / "train.py"]
    for path in examples:
        assert WEAVE in path.read_text(encoding="utf-8"), path
    for block in ALL_BLOCKS:
        if {"wandb", "trl", "art"} & set(block.needs):
            assert WEAVE in block.source, block.id


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} bytes"


def _seconds(s: float | None) -> str:
    if s is None:
        return "none"
    return f"{s / 3600:g} h" if s >= 3600 and s % 3600 == 0 else f"{s:g} s"


def _mib(n: int | None) -> str:
    return "unlimited" if n is None else _size(n << 20)


def _code_defaults() -> dict[str, str]:
    """The README's defaults table, computed from the code (the row names are the table's)."""
    import inspect

    from cwsandbox_async import Resources, Sandbox, SandboxDefaults
    from cwsandbox_async._validate import MAX_ARGV_BYTES, MAX_FILE_BYTES
    from cwsandbox_async.gatherer._gather import DEFAULT_LIMIT

    d, r = SandboxDefaults(), Resources()
    read_max = inspect.signature(Sandbox.read_file).parameters["max_bytes"].default
    return {
        "Exec timeout": _seconds(d.exec_timeout_seconds),
        "Output per stream": _size(d.max_output_bytes),
        "stdin, `write_file` data": _size(MAX_FILE_BYTES),
        "`read_file`": _size(read_max),
        "Command line (argv)": _size(MAX_ARGV_BYTES),
        "Paths": "absolute",
        "Memory": _mib(r.memory_mib),
        "Processes and threads": str(r.pids),
        "Size of a file a process writes": _mib(r.file_size_mib),
        "`/tmp`": _mib(r.tmp_mib),
        f"Working directory `{d.working_dir}`": _mib(r.workspace_mib),
        "CPU": "unlimited" if r.cpu is None and r.cpu_seconds is None else f"{r.cpu} cores",
        "Network": "all" if d.network else "none",
        "Sandbox lifetime": _seconds(d.max_lifetime_seconds),
        "Sandbox start": _seconds(d.create_timeout_seconds),
        "Other operations (files, stop)": _seconds(d.operation_timeout_seconds),
        "Items in flight (gatherer)": str(DEFAULT_LIMIT),
    }


def test_the_readme_defaults_table_is_the_codes() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme.split("<!-- defaults-table -->", 1)[1].strip().split("\n\n", 1)[0].splitlines()
    rows = {}
    for line in table[2:]:  # after the header and the |---| line
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0]] = cells[1]
    assert rows == _code_defaults()


def test_readme_exit_codes_are_the_clis() -> None:
    from cwsandbox_async.cli import EXIT_CODES

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    paragraph = readme.split("Exit codes:", 1)[1].split("\n\n", 1)[0]
    documented = {int(n) for n in re.findall(r"(?<![\w+])(\d{1,3})(?= )", paragraph) if n != "128"}
    assert documented == set(EXIT_CODES), (sorted(documented), sorted(EXIT_CODES))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("block", [_param(b) for b in ALL_BLOCKS])
async def test_block_runs(block: Block, tmp_path: Path, local_backend: None) -> None:
    missing = [m for m in block.needs if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (an optional extra)")
    env = _env(tmp_path)
    script = tmp_path / "block.py"
    script.write_text(block.source, encoding="utf-8")
    async with AsyncExitStack() as stack:
        for name in block.services:
            await stack.enter_async_context(SERVICES[name](env, tmp_path))
        with anyio.fail_after(block.timeout):
            proc = await anyio.run_process(
                [sys.executable, str(script)], cwd=tmp_path, env=env, check=False, stdin=subprocess.DEVNULL
            )
    out, err = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
    assert proc.returncode == 0, f"{block.id} exited {proc.returncode}\nstdout:\n{out[-4000:]}\nstderr:\n{err[-6000:]}"
