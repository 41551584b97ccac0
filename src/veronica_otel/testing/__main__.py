"""Run the fake LLM server from a shell until Ctrl-C (or SIGTERM).

Usage::

    python -m veronica_otel.testing --port 8787 --output-tokens 20 --latency 0.05

It prints the base URLs to point the SDKs at, e.g.
``OPENAI_BASE_URL=http://127.0.0.1:8787/v1`` and
``ANTHROPIC_BASE_URL=http://127.0.0.1:8787``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from ._server import FakeLLMServer

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m veronica_otel.testing",
        description="Serve fake OpenAI and Anthropic APIs on localhost.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (127.0.0.1)")
    parser.add_argument("--port", type=int, default=8787, help="TCP port, 0 for any (8787)")
    parser.add_argument(
        "--output-tokens", type=int, default=20, help="output tokens per reply (20)"
    )
    parser.add_argument(
        "--input-tokens",
        type=int,
        default=None,
        help="fixed input tokens (default: request body bytes / 4)",
    )
    parser.add_argument(
        "--latency", type=float, default=0.0, help="seconds before each response (0)"
    )
    parser.add_argument(
        "--chunk-delay", type=float, default=0.0, help="seconds between stream chunks (0)"
    )
    parser.add_argument(
        "--runaway",
        action="store_true",
        help="play a runaway model: every reply calls another of the request's tools",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, serve until interrupted, and return the exit status.

    Args:
        argv: Command-line arguments without the program name; ``None`` reads ``sys.argv``.
    """
    args = _parser().parse_args(argv)
    try:
        server = FakeLLMServer(
            host=args.host,
            port=args.port,
            input_tokens=args.input_tokens,
            output_tokens=args.output_tokens,
            latency_s=args.latency,
            chunk_delay_s=args.chunk_delay,
            runaway=args.runaway,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    done = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    previous = signal.signal(signal.SIGTERM, _on_signal)
    try:
        with server:
            print(f"Fake LLM server listening on {server.base_url}")
            print(f"OPENAI_BASE_URL={server.openai_base_url}")
            print(f"ANTHROPIC_BASE_URL={server.anthropic_base_url}")
            print("Press Ctrl-C to stop.", flush=True)
            try:
                while not done.wait(0.5):
                    pass
            except KeyboardInterrupt:
                pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


if __name__ == "__main__":
    sys.exit(main())
