"""``python -m cwsandbox_async.testing.coreweave``: serve the CoreWeave test server until stopped.

Prints the base URL (``http://127.0.0.1:PORT``) as the first line of stdout, then serves
until SIGINT/SIGTERM (or, with ``--until-stdin-closes``, until its stdin closes: for a
parent process that owns it). Every sandbox it made is destroyed on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import threading

from ._server import RPC_MODES, CoreWeaveTestServer


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m cwsandbox_async.testing.coreweave", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--api-key", default=None, help="require this Bearer token (default: accept any)")
    parser.add_argument(
        "--rpcs", choices=sorted(RPC_MODES), default="sdk", help="sdk: what the SDK calls (default); all: + Exec, Purge"
    )
    parser.add_argument("--start-delay", type=float, default=0.0, help="seconds a new sandbox stays CREATING")
    parser.add_argument("--until-stdin-closes", action="store_true", help="stop when stdin reaches EOF")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with CoreWeaveTestServer(api_key=args.api_key, port=args.port, rpcs=args.rpcs) as server:
        server.service.faults.start_delay = args.start_delay
        print(server.url, flush=True)
        if args.until_stdin_closes:  # a daemon thread: a blocked read never holds up the exit

            def wait_for_eof() -> None:
                sys.stdin.read()
                loop.call_soon_threadsafe(stop.set)

            threading.Thread(target=wait_for_eof, name="stdin-eof", daemon=True).start()
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    asyncio.run(serve(parse(argv)))


if __name__ == "__main__":
    main()
