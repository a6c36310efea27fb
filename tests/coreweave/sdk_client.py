"""Drives the unmodified ``cwsandbox`` SDK through its documented calls; run in a subprocess by the tests.

    python tests/coreweave/sdk_client.py   # CWSANDBOX_BASE_URL / CWSANDBOX_API_KEY point at the server

Prints one JSON object with what each call returned.
"""

from __future__ import annotations

import json
import sys

from cwsandbox import Sandbox, SandboxDefaults, Session
from cwsandbox.exceptions import SandboxFileError


def main() -> None:
    out: dict[str, object] = {}
    defaults = SandboxDefaults(container_image="python:3.11", tags=("sdk-test",), max_lifetime_seconds=600)
    with Session(defaults, report_to=[]) as session:
        sb = session.sandbox()
        proc = sb.exec(["echo", "hello from the sdk"], timeout_seconds=30).result()
        out["exec"] = [proc.returncode, proc.stdout]
        proc = sb.exec(["sh", "-c", "printf 'err' >&2; exit 3"], timeout_seconds=30).result()
        out["exec_nonzero"] = [proc.returncode, proc.stderr]
        p = sb.exec(["cat"], stdin=True, timeout_seconds=30)
        assert p.stdin is not None
        p.stdin.write(b"piped\n").result()
        p.stdin.close().result()
        out["exec_stdin"] = p.result().stdout
        streamed = sb.exec(["sh", "-c", "echo one; echo two"], timeout_seconds=30)
        out["exec_stream"] = list(streamed.stdout)
        streamed.result()
        sb.write_file("/workspace/data.bin", bytes(range(256))).result()
        out["read_back"] = sb.read_file("/workspace/data.bin").result() == bytes(range(256))
        try:
            sb.read_file("/workspace/missing.txt").result()
            out["missing"] = "no error"
        except SandboxFileError as exc:
            out["missing"] = [type(exc).__name__, exc.filepath]
        listed = Sandbox.list(tags=["sdk-test"]).result()
        out["listed"] = [s.sandbox_id for s in listed]
        out["sandbox_id"] = sb.sandbox_id
        out["status"] = str(sb.get_status())
        out["exec_stats"] = sb.exec_stats
        sb.stop().result()
        out["stopped_status"] = str(sb.status)
        out["listed_after_stop"] = [s.sandbox_id for s in Sandbox.list(tags=["sdk-test"]).result()]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
