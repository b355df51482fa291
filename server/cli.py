"""The ``sessionrt`` command line.

``sessionrt serve`` starts the HTTP/SSE server on the embedded defaults: the
SQLite database in the data directory (``$XDG_DATA_HOME/sessionrt``), the
built-in scripted model, loopback only.

``run``, ``sessions`` and ``log`` work on the same data directory through an
embedded host (the whole runtime in this process), or on a running server
with ``--url``. A data directory has one writer at a time: while ``serve``
holds it, use ``--url``. ``sessions``, ``log`` and ``export`` only read: on a
data directory they open the store read-only and change nothing (no recovery
sweep, no execution resumed). ``export SESSION > FILE`` prints a session as a
transfer document and ``import FILE`` creates a session from one. ``openapi``
prints the API's OpenAPI document (this version's, or with ``--url`` the
running server's).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import attrs

from actors.runtime import RuntimeConfig, check_data_dir
from protocol import codec
from protocol.client import ClientError, follow_log
from protocol.errors import DomainError, SessionNotFoundError, UnauthorizedError
from protocol.openapi import document
from protocol.operations import ExportQuery, InstructionEntryInput, SessionListQuery
from protocol.shapes import ModelRef, Session, SessionExport
from server._cli_run import Host, RunOptions, Sigint, open_host, run
from server.app import ServerSettings
from server.config import ConfigError, load_config, runtime_config
from server.logs import configure as configure_logs
from server.serve import serve
from storage import StorageError, StoreLockedError, is_server_url

__all__ = ["default_data_dir", "main"]

_PASSWORD_ENV = "SESSIONRT_SERVER_PASSWORD"
_MAX_PORT = 65535
_DESCRIPTION = (
    "sessionrt keeps LLM-agent sessions durable: every admitted prompt and every fact of a"
    " run lands in an append-only log on SQLite. `serve` runs the HTTP/SSE server (with a web"
    " console at /); `run`, `sessions` and `log` work on the data directory directly, or on"
    " a running server with --url."
)


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/sessionrt``, falling back to ``~/.local/share/sessionrt``."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base) / "sessionrt"


def _add_data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the database lives (default: $XDG_DATA_HOME/sessionrt)",
    )


def _add_host(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--url", type=_url, help="use the server at URL instead of an embedded runtime"
    )
    where.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="the embedded runtime's data directory (default: $XDG_DATA_HOME/sessionrt)",
    )
    parser.add_argument(
        "--password",
        default=None,
        help=f"the server's password, with --url (better: ${_PASSWORD_ENV})",
    )


def _url(value: str) -> str:
    parsed = urlsplit(value)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise argparse.ArgumentTypeError(f"expected an http(s)://host[:port] URL, got {value!r}")
    return value


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {value!r}") from None
    if not 0 <= port <= _MAX_PORT:
        raise argparse.ArgumentTypeError(
            f"a port is 0 to {_MAX_PORT} (0: any free one), got {port}"
        )
    return port


def _version() -> str:
    try:
        return importlib.metadata.version("sessionrt")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - run from a checkout
        return "unknown"


def _model(value: str) -> ModelRef:
    provider, slash, model = value.partition("/")
    if not slash or not provider or not model:
        raise argparse.ArgumentTypeError(f"expected PROVIDER/MODEL, got {value!r}")
    return ModelRef(id=model, provider_id=provider)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sessionrt", description=_DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"sessionrt {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the HTTP/SSE server")
    serve.add_argument("--host", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, help="port (default 4096; 0 = any)")
    _add_data_dir(serve)
    serve.add_argument(
        "--password",
        default=None,
        help=f"require this password (Basic or Bearer); visible to local users, prefer"
        f" ${_PASSWORD_ENV} or [server] password in --config",
    )
    serve.add_argument(
        "--cors-origin",
        action="append",
        default=None,
        metavar="ORIGIN",
        help="let web pages of ORIGIN (e.g. https://app.example) call the API; repeatable",
    )
    serve.add_argument(
        "--synchronous", choices=["FULL", "NORMAL"], help="SQLite durability (default FULL)"
    )
    serve.add_argument(
        "--database",
        default=None,
        metavar="PATH_OR_URL",
        help="the event log: a SQLite file, or postgresql://… (default: the data dir's file);"
        " a password in the URL is visible to local users: prefer PGPASSWORD or ~/.pgpass",
    )
    serve.add_argument(
        "--config", type=Path, help="a TOML file of [server], [runtime] and [providers] settings"
    )
    serve.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="log lines on stderr as text (default) or one JSON object each",
    )

    run = commands.add_parser("run", help="send a prompt and show the answer as it streams")
    run.add_argument("prompt", help="the prompt text")
    run.add_argument("--session", help="continue this session (default: a new one)")
    run.add_argument("--agent", help="switch the session to this agent")
    run.add_argument("--model", type=_model, help="switch the session to PROVIDER/MODEL")
    run.add_argument("--queue", action="store_true", help="queue behind the current turn")
    run.add_argument(
        "--config",
        type=Path,
        help="the embedded runtime's TOML settings ([runtime], [providers]); not with --url",
    )
    run.add_argument(
        "--no-follow",
        dest="follow",
        action="store_false",
        help="print the admission receipt as JSON and exit",
    )
    _add_host(run)

    sessions = commands.add_parser("sessions", help="list sessions, newest first")
    sessions.add_argument("--limit", type=int, default=50, help="at most N (default 50)")
    sessions.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _add_host(sessions)

    log = commands.add_parser("log", help="print a session's durable log, one event per line")
    log.add_argument("session", help="the session id")
    log.add_argument("--after", type=int, default=0, help="only events after this seq")
    log.add_argument("--follow", action="store_true", help="keep printing new events")
    _add_host(log)

    export = commands.add_parser("export", help="print a session as a JSON transfer document")
    export.add_argument("session", help="the session id")
    export.add_argument(
        "--sanitize", action="store_true", help="leave out file contents and tool outputs"
    )
    _add_host(export)

    import_ = commands.add_parser("import", help="create a session from a transfer document")
    import_.add_argument("file", type=Path, help="a document `sessionrt export` printed")
    _add_host(import_)

    instructions = commands.add_parser(
        "instructions",
        help="list a session's instruction entries, or set / rm one",
        description="Without an action: one JSON object {key, value} per line. `set KEY VALUE`"
        " stores VALUE (JSON; anything that is not JSON is taken as a string); `rm KEY`"
        " removes the entry. Changes reach the model at the session's next step.",
    )
    instructions.add_argument("session", help="the session id")
    instructions.add_argument(
        "action", nargs="*", metavar="set KEY VALUE | rm KEY", help="what to change"
    )
    _add_host(instructions)

    openapi = commands.add_parser("openapi", help="print the OpenAPI document")
    openapi.add_argument(
        "--url", type=_url, help="print the document the server at URL serves instead"
    )
    openapi.add_argument(
        "--password",
        default=None,
        help=f"the server's password, with --url (better: ${_PASSWORD_ENV})",
    )
    return parser


def _password(args: argparse.Namespace, from_file: str | None = None) -> str | None:
    """--password, else $SESSIONRT_SERVER_PASSWORD, else the file's; an empty one is an error."""
    if args.password is not None:
        # Any local user can read a command line (ps, /proc/PID/cmdline).
        _error(
            f"warning: --password is visible to every local user; set ${_PASSWORD_ENV}"
            " or [server] password in a --config file instead"
        )
        chosen, where = args.password, "--password"
    elif (env := os.environ.get(_PASSWORD_ENV)) is not None:
        chosen, where = env, f"${_PASSWORD_ENV}"
    else:
        chosen, where = from_file, "[server] password"
    if chosen is not None and not chosen:
        raise ConfigError(f"{where} is empty; unset it for no password, or give a real one")
    return chosen


def _serve(args: argparse.Namespace) -> int:
    file = load_config(args.config) if args.config is not None else {}
    server = file.get("server", {})
    flags: dict[str, Any] = {"synchronous": args.synchronous} if args.synchronous else {}
    if args.database is not None:
        flags["database"] = args.database
    config = runtime_config(file, args.data_dir, fallback_data_dir=default_data_dir(), **flags)
    check_data_dir(config.data_dir)
    host = args.host or server.pop("host", "127.0.0.1")
    port = args.port if args.port is not None else server.pop("port", 4096)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= _MAX_PORT:
        raise ConfigError(f"[server] port must be 0 to {_MAX_PORT}, got {port!r}")
    server.pop("host", None)
    server.pop("port", None)
    password = _password(args, server.pop("password", None))
    if args.cors_origin:
        server["cors_origins"] = [*server.get("cors_origins", []), *args.cors_origin]
    try:
        settings = ServerSettings(password=password, **server)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    secret_names = {*config.secret_env, _PASSWORD_ENV}
    secret_names |= {c.api_key_env for c in config.provider_configs.values() if c.api_key_env}
    secrets = [os.environ.get(name, "") for name in secret_names]
    if args.log_format == "json":
        # Text stays as it was: start and stop on stdout, warnings and errors on stderr.
        configure_logs("json", secrets=[*secrets, password or ""])
    asyncio.run(serve(config, settings, host=host, port=port))
    return 0


# -- commands on a host -----------------------------------------------------------------------


async def _run(host: Host, args: argparse.Namespace, sigint: Sigint) -> int:
    options = RunOptions(
        text=args.prompt,
        session_id=args.session,
        agent=args.agent,
        model=args.model,
        queue=args.queue,
        follow=args.follow,
        remote=bool(args.url),
    )
    return await run(host, options, sigint, sys.stdout, sys.stderr)


async def _sessions(host: Host, args: argparse.Namespace, sigint: Sigint) -> int:
    page = await host.sessions.list(SessionListQuery(limit=args.limit))
    return _print_sessions(page.data, args)


def _print_sessions(sessions: Sequence[Session], args: argparse.Namespace) -> int:
    if args.json:
        rows = [codec.to_json(session) for session in sessions]
        print(json.dumps(rows, indent=2, ensure_ascii=False))
        return 0
    table = [("ID", "UPDATED", "TITLE")]
    for session in sessions:
        updated = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(session.time.updated / 1000))
        table.append((session.id, updated, session.title))
    widths = [max(len(row[i]) for row in table) for i in range(2)]
    for row in table:
        print(f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]}".rstrip())
    return 0


async def _log(host: Host, args: argparse.Namespace, sigint: Sigint) -> int:
    async def lines() -> int:
        events = follow_log(host.sessions, args.session, args.after, follow=args.follow)
        async for event in events:
            if event.event == "log.synced":
                continue  # the end-of-replay marker: no event of the session
            print(json.dumps(event.data, ensure_ascii=False), flush=True)
        return 0

    code = await sigint.guard(lines())
    if code is None:  # Ctrl-C: the normal way to stop following
        return 0 if args.follow else 130
    return code


async def _export(host: Host, args: argparse.Namespace, sigint: Sigint) -> int:
    document = await host.sessions.export(args.session, ExportQuery(sanitize=args.sanitize))
    sys.stdout.write(json.dumps(codec.to_json(document), indent=2, ensure_ascii=False) + "\n")
    return 0


async def _import(host: Host, args: argparse.Namespace, sigint: Sigint) -> int:
    try:
        raw = await asyncio.to_thread(args.file.read_bytes)
    except OSError as exc:
        _error(f"cannot read {args.file}: {exc.strerror}")
        return 1
    document = codec.from_json(SessionExport, codec.loads(raw))
    session = await host.sessions.import_session(document)
    print(session.id)
    return 0


def _entry_action(action: Sequence[str]) -> tuple[str, str, Any] | None:
    """``set KEY VALUE`` / ``rm KEY`` as (verb, key, value); None to list."""
    if not action:
        return None
    if action[0] == "set" and len(action) == 3:
        try:
            value: Any = json.loads(action[2])
        except ValueError:
            value = action[2]
        return "set", action[1], value
    if action[0] == "rm" and len(action) == 2:
        return "rm", action[1], None
    raise ConfigError("instructions takes no action, `set KEY VALUE` or `rm KEY`")


async def _instructions(host: Host, args: argparse.Namespace, sigint: Sigint) -> int:
    action = _entry_action(args.action)
    if action is None:
        for entry in await host.instructions.list(args.session):
            print(json.dumps(codec.to_json(entry), ensure_ascii=False), flush=True)
    elif action[0] == "set":
        await host.instructions.put(args.session, action[1], InstructionEntryInput(value=action[2]))
    else:
        await host.instructions.remove(args.session, action[1])
    return 0


_Command = Callable[[Host, argparse.Namespace, Sigint], Coroutine[Any, Any, int]]
_ON_HOST: dict[str, _Command] = {
    "run": _run,
    "sessions": _sessions,
    "log": _log,
    "export": _export,
    "import": _import,
    "instructions": _instructions,
}
#: Commands that only read: on a data directory, the runtime opens read-only.
_READ_ONLY: frozenset[str] = frozenset({"sessions", "log", "export"})


async def _on_host(
    command: _Command, args: argparse.Namespace, data_dir: Path, config: RuntimeConfig | None
) -> int:
    sigint = Sigint()
    release = sigint.install()
    try:
        password = _password(args) if args.url else None
        # `run` acts where it is run: its new session's tools work in the caller's directory.
        directory = os.getcwd() if args.command == "run" else None
        async with open_host(args.url, password, data_dir, config, directory=directory) as host:
            return await command(host, args, sigint)
    finally:
        release()


def _on_host_sync(args: argparse.Namespace) -> int:
    data_dir = args.data_dir or default_data_dir()
    config = None
    if getattr(args, "config", None) is not None:
        if args.url:
            raise ConfigError("--config is for the embedded runtime; not with --url")
        config = runtime_config(load_config(args.config), args.data_dir, fallback_data_dir=data_dir)
        data_dir = config.data_dir
    check_data_dir(data_dir)
    reads_only = args.command in _READ_ONLY or (
        args.command == "instructions" and _entry_action(args.action) is None
    )
    if reads_only and not args.url:
        config = attrs.evolve(config or RuntimeConfig(data_dir=data_dir), read_only=True)
        target = config.database_target
        if not is_server_url(target) and not Path(target).exists():
            # Nothing was ever written here; a reader creates nothing either.
            if args.command == "sessions":
                return _print_sessions([], args)
            _error(f"session {args.session} not found")
            return 1
    try:
        return asyncio.run(_on_host(_ON_HOST[args.command], args, data_dir, config))
    except StoreLockedError:
        _error(
            f"the data directory {data_dir} is in use by another process"
            " (a running `sessionrt serve`?); talk to it with --url"
        )
        return 1
    except SessionNotFoundError as exc:
        _error(f"session {exc.fields.get('sessionID', '')} not found")
        return 1
    except UnauthorizedError as exc:
        hint = f"; pass --password or set ${_PASSWORD_ENV}" if args.url else ""
        _error(f"{exc.tag}: {exc.message}{hint}")
        return 1
    except DomainError as exc:
        _error(f"{exc.tag}: {exc.message}")
        return 1
    except ClientError as exc:
        where = f" {args.url}" if args.url else ""
        if exc.reason == "transport":
            _error(f"cannot reach the server{where}: {exc.message}")
        else:
            _error(f"unexpected answer from the server{where}: {exc.message}")
        return 1


def _openapi(args: argparse.Namespace) -> int:
    doc = asyncio.run(_remote_document(args)) if args.url else document()
    print(json.dumps(doc, indent=2, ensure_ascii=False))
    return 0


async def _remote_document(args: argparse.Namespace) -> Any:
    password = _password(args)
    headers = {"Authorization": f"Bearer {password}"} if password else {}
    url = args.url.rstrip("/") + "/doc"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
            http.get(url, headers=headers) as response,
        ):
            if response.status == 401:
                raise ConfigError(
                    f"UnauthorizedError: the server wants a password; pass --password or set"
                    f" ${_PASSWORD_ENV}"
                )
            if response.status != 200:
                raise ConfigError(
                    f"unexpected answer from the server {args.url}: {response.status}"
                )
            return await response.json()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ConfigError(
            f"cannot reach the server {args.url}: {str(exc) or type(exc).__name__}"
        ) from None


def _error(message: str) -> None:
    print(f"sessionrt: {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "openapi":
            return _openapi(args)
        if args.command in _ON_HOST:
            return _on_host_sync(args)
    except ConfigError as exc:
        _error(str(exc))
        return 1
    except DomainError as exc:  # the runtime refused its configuration (a bad default_directory)
        _error(f"{exc.tag}: {exc.message}")
        return 1
    except (StorageError, OSError) as exc:
        if isinstance(exc, BrokenPipeError):
            # The reader went away (`sessionrt log ... | head`): not an error of ours.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        _error(str(exc))
        return 1
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 130
    return 2  # pragma: no cover - argparse rejects unknown commands first


if __name__ == "__main__":
    sys.exit(main())
