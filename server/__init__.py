"""The front door: the command line now; the aiohttp HTTP/SSE app and the
embedded host come next. Nothing depends on this package."""

from server.cli import main

__all__ = ["main"]
