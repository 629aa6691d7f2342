"""``rllm-core gateway serve``: the session gateway as a standalone server.

For evaluation, or agents outside a training run: it renders chat requests with an installed
renderer plugin, samples from one or more vLLM servers through the ``sampler:vllm`` plugin
(rllm-sampler-vllm), and records every call in an installed trace store. The server and its
dependencies load only when the command runs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import click

from rllm_core.cli.output import EXIT_USAGE, console, err_console, fail
from rllm_core.plan.schema import GatewaySection

__all__ = ["gateway"]


@click.group()
def gateway() -> None:
    """The OpenAI-compatible session gateway."""


def _build(kind: str, name: str, values: dict[str, Any], *, needed_by: str | None = None) -> Any:
    """Build an installed component, turning lookup and config errors into usage errors.

    ``needed_by`` names the option that asked for the component, for the message when it is
    not installed."""
    from pydantic import ValidationError

    from rllm_core.errors import UnknownComponentError
    from rllm_core.plugins.manager import get_plugin_manager

    manager = get_plugin_manager()
    try:
        spec = manager.get(kind, name)
    except UnknownComponentError as exc:
        fail(f"{needed_by} needs {kind}:{name}: {exc}" if needed_by else str(exc), EXIT_USAGE)
    try:
        config = spec.validate_config(values)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or '(config)'}: {error['msg']}"
            for error in exc.errors()
        )
        fail(f"{kind.replace('_', ' ')} {name!r} rejects its options: {problems}", EXIT_USAGE)
    return spec.factory(config)


TOKEN_MODES = ("plain", "cumulative")
DEFAULT_TOKEN_MODE: str = GatewaySection.model_fields["token_mode"].default
"""A plan's ``[gateway].token_mode`` default: a gateway served alone records the tokens a run's
gateway would."""


def _token_mode(token_mode: str | None, legacy_cumulative: bool, legacy_plain: bool) -> str:
    """The token mode from ``--token-mode`` and the deprecated ``--cumulative`` / ``--plain``
    (kept for one release; each prints a warning naming its replacement)."""
    legacy = [
        (flag, mode)
        for flag, mode, given in (
            ("--cumulative", "cumulative", legacy_cumulative),
            ("--plain", "plain", legacy_plain),
        )
        if given
    ]
    if len(legacy) == 2:
        fail(
            "--cumulative and --plain contradict each other; pass one --token-mode"
            " (plain or cumulative)",
            EXIT_USAGE,
        )
    if not legacy:
        return token_mode or DEFAULT_TOKEN_MODE
    flag, mode = legacy[0]
    if token_mode is not None and token_mode != mode:
        fail(
            f"{flag} and --token-mode {token_mode} contradict each other; pass only"
            f" --token-mode ({flag} is deprecated)",
            EXIT_USAGE,
        )
    err_console.print(
        f"warning: {flag} is deprecated and will be removed in the next release; use"
        f" --token-mode {mode}",
        markup=False,
    )
    return mode


@gateway.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8000, show_default=True, type=int, help="Port (0: any free).")
@click.option(
    "--upstream",
    "upstreams",
    multiple=True,
    required=True,
    metavar="URL",
    help="A vLLM server (repeat for several), e.g. http://10.0.0.5:8000; needs the"
    " rllm-sampler-vllm plugin.",
)
@click.option("--upstream-model", default=None, help="Model name sent to the workers.")
@click.option(
    "--upstream-retry-budget",
    default=None,
    type=float,
    help="Seconds a call may spend retrying the workers and waiting for one to come back,"
    " then a 502 or 503 (the sampler's retry_budget_s).  [default: 60]",
)
@click.option(
    "--upstream-api-key",
    default=None,
    envvar="RLLM_UPSTREAM_API_KEY",
    help="Bearer token for the workers (env RLLM_UPSTREAM_API_KEY).",
)
@click.option("--renderer", required=True, metavar="NAME", help="Installed renderer, e.g. chatml.")
@click.option("--tokenizer", default=None, metavar="PATH", help="Local tokenizer folder.")
@click.option(
    "--literal-control-tokens",
    is_flag=True,
    help="Encode control-token text inside messages (a tool output holding <|im_end|>) as"
    " ordinary text, so it cannot forge a turn; off by default, as in the reference templates.",
)
@click.option(
    "--token-mode",
    type=click.Choice(TOKEN_MODES),
    default=None,
    help="plain: render the whole conversation every call; cumulative: extend the previous"
    f" call's prompt and sampled tokens (a plan's default).  [default: {DEFAULT_TOKEN_MODE}]",
)
@click.option("--cumulative", "legacy_cumulative", is_flag=True, hidden=True)
@click.option("--plain", "legacy_plain", is_flag=True, hidden=True)
@click.option(
    "--trace-store", default="memory", show_default=True, metavar="NAME", help="Installed store."
)
@click.option("--trace-dir", default=None, metavar="DIR", help="Directory for a disk store.")
@click.option("--model", default="policy", show_default=True, help="Model name served.")
@click.option("--no-auth", is_flag=True, help="Serve without a token (loopback hosts only).")
@click.option(
    "--token",
    default=None,
    envvar="RLLM_GATEWAY_TOKEN",
    help="The admin bearer token, which reaches every route (env RLLM_GATEWAY_TOKEN);"
    " generated when omitted.",
)
@click.option(
    "--max-body-bytes",
    default=8 * 1024 * 1024,
    show_default=True,
    type=int,
    help="Larger request bodies get a 413.",
)
@click.option("--max-prompt-tokens", default=None, type=int, help="Reject longer prompts.")
@click.option(
    "--max-tokens",
    default=256,
    show_default=True,
    type=int,
    help="Completion length when a request does not set one.",
)
@click.option(
    "--heartbeat-interval",
    default=10.0,
    show_default=True,
    type=float,
    help="Seconds before a slow stream starts with SSE keep-alive comments (a plain answer"
    " waits for its status).",
)
@click.option(
    "--request-timeout",
    default=1800.0,
    show_default=True,
    type=float,
    help="Seconds after which a model call is abandoned.",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Gateway processes behind a session-sharding front (each session stays in one).",
)
def serve(
    host: str,
    port: int,
    upstreams: tuple[str, ...],
    upstream_model: str | None,
    upstream_retry_budget: float | None,
    upstream_api_key: str | None,
    renderer: str,
    tokenizer: str | None,
    literal_control_tokens: bool,
    token_mode: str | None,
    legacy_cumulative: bool,
    legacy_plain: bool,
    trace_store: str,
    trace_dir: str | None,
    model: str,
    no_auth: bool,
    token: str | None,
    max_body_bytes: int,
    max_prompt_tokens: int | None,
    max_tokens: int,
    heartbeat_interval: float,
    request_timeout: float,
    log_level: str,
    workers: int,
) -> None:
    """Serve the gateway until interrupted.

    Agents use http://HOST:PORT/sessions/<session_id>/v1 as their OpenAI base URL and as
    their API key either the printed admin token or a session token, which reaches only that
    session's model routes (POST /sessions/<session_id>/token with the admin token mints one);
    traces are at /sessions/<session_id>/traces (admin token).
    """
    from rllm_core.gateway.server import Gateway, is_loopback, log_events, new_token
    from rllm_core.types import SamplingParams

    if no_auth and not is_loopback(host):
        fail(
            f"--no-auth is refused on {host!r}: anyone who can reach it could use the model;"
            " bind to 127.0.0.1 or drop --no-auth (a token is generated)",
            EXIT_USAGE,
        )
    if no_auth and token:
        fail("--no-auth and --token contradict each other; pass one", EXIT_USAGE)
    if max_tokens < 1:
        fail(f"--max-tokens is {max_tokens}; it must be at least 1", EXIT_USAGE)
    cumulative = _token_mode(token_mode, legacy_cumulative, legacy_plain) == "cumulative"
    log_events(log_level)
    if workers > 1:
        return _serve_sharded(
            click.get_current_context(),
            workers=workers,
            host=host,
            port=port,
            token=None if no_auth else (token or new_token()),
            token_given=token is not None,
            mode="cumulative" if cumulative else "plain",
            max_body_bytes=max_body_bytes,
            request_timeout=request_timeout,
            log_level=log_level,
        )

    sampler_keys: dict[str, Any] = {"urls": list(upstreams)}
    if upstream_model:
        sampler_keys["model"] = upstream_model
    if upstream_api_key:
        sampler_keys["api_key"] = upstream_api_key
    if upstream_retry_budget is not None:
        sampler_keys["retry_budget_s"] = upstream_retry_budget
    # Built first: it opens nothing, so a missing plugin or a bad URL leaves no store open.
    try:
        sampler = _build("sampler", "vllm", sampler_keys, needed_by="--upstream")
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    renderer_keys: dict[str, Any] = {"tokenizer": tokenizer} if tokenizer else {}
    # Sent only when set: a third-party renderer that forbids unknown keys still builds.
    if literal_control_tokens:
        renderer_keys["literal_control_tokens"] = True
    renderer_obj = _build("renderer", renderer, renderer_keys)
    store = _build("trace_store", trace_store, {"path": trace_dir} if trace_dir else {})
    try:
        server = Gateway(
            renderer=renderer_obj,
            sampler=sampler,
            trace_store=store,
            cumulative=cumulative,
            model=model,
            max_prompt_tokens=max_prompt_tokens,
            host=host,
            port=port,
            token=token,
            auth=not no_auth,
            max_body_bytes=max_body_bytes,
            heartbeat_interval_s=heartbeat_interval,
            request_timeout_s=request_timeout,
            default_params=SamplingParams(max_tokens=max_tokens),
            log_level="warning" if log_level in ("debug", "info") else log_level,
        )
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)

    def ready(url: str) -> None:
        mode = "cumulative" if server.engine.cumulative else "plain"
        console.print(f"rllm-core gateway on {url} ({mode} mode, renderer {renderer})")
        console.print(f"  agents: base_url {url}/sessions/<session_id>/v1")
        if server.token is None:
            console.print("  auth: none (loopback only)")
        else:
            if token is None:
                console.print(f"  admin token: {server.token}")
            else:
                console.print("  admin token: as given by --token")
            console.print(
                "  session tokens: POST /sessions/<session_id>/token with the admin token"
            )
        console.print(f"  upstreams: {', '.join(upstreams)}")
        sys.stdout.flush()

    try:
        _serve_until_stopped(lambda: server.serve(ready))
    except OSError as exc:
        fail(f"could not serve on {host}:{port}: {exc}")
    finally:
        store.close()


@gateway.command(hidden=True)
def worker() -> None:
    """Serve one gateway worker of a run (``[gateway].workers``); the run starts it with its
    spec and token in the environment (rllm_core.rollout.gateway_workers)."""
    from rllm_core.rollout.gateway_workers import serve_worker

    _serve_until_stopped(lambda: serve_worker(os.environ))


def _serve_until_stopped(serve: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``serve()`` on uvloop (when installed) until it returns, SIGINT or SIGTERM; SIGTERM
    ends the process through the normal exit path, so ``finally`` blocks close stores."""
    import asyncio
    import gc
    import signal

    from rllm_core.run.signals import handled

    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    # The gateway process keeps every session's messages and token lists alive: with the
    # default thresholds the cyclic collector rescans them all, often: 0.1-0.25 ms of CPU per
    # request in the overhead benchmark. Start-up objects are frozen out of collection and
    # young collections run less often; the collector still runs.
    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
    # uvicorn re-raises the signal that stopped it once it has shut down.
    try:
        with handled(lambda *_: sys.exit(0), (signal.SIGTERM,)):
            runner(serve())
    except KeyboardInterrupt:
        pass


_NOT_FOR_WORKERS = {"host", "port", "workers", "token", "no_auth", "trace_dir"}


def _worker_argv(ctx: click.Context, index: int, mode: str) -> list[str]:
    """``gateway serve``'s command line for worker ``index``: the options given, on a free
    port of the front's host (clients reach a session's worker directly), one process, a trace
    directory of its own."""
    argv = [sys.executable, "-m", "rllm_core", "gateway", "serve", "--port", "0"]
    argv += ["--host", ctx.params["host"]]
    for param in ctx.command.params:
        name = param.name
        value = ctx.params.get(name or "")
        if not isinstance(param, click.Option) or name in _NOT_FOR_WORKERS:
            continue
        if name in ("token_mode", "legacy_cumulative", "legacy_plain"):
            continue
        if param.is_flag:
            if value:
                argv.append(param.opts[0])
        elif param.multiple:
            for item in value or ():
                argv += [param.opts[0], str(item)]
        elif value is not None:
            argv += [param.opts[0], str(value)]
    argv += ["--token-mode", mode]
    trace_dir = ctx.params.get("trace_dir")
    if trace_dir:
        argv += ["--trace-dir", os.path.join(trace_dir, f"worker-{index}")]
    if ctx.params.get("no_auth"):
        argv.append("--no-auth")
    return argv


def _serve_sharded(
    ctx: click.Context,
    *,
    workers: int,
    host: str,
    port: int,
    token: str | None,
    token_given: bool,
    mode: str,
    max_body_bytes: int,
    request_timeout: float,
    log_level: str,
) -> None:
    """Serve ``workers`` gateway processes behind a session-sharding front until
    interrupted (see :mod:`rllm_core.gateway.shards`)."""
    from rllm_core.gateway.serving import AsgiServer
    from rllm_core.gateway.shards import ShardFront, WorkerProcesses

    env = {"COLUMNS": "1000"}
    if token is not None:
        env["RLLM_GATEWAY_TOKEN"] = token
    processes = WorkerProcesses(lambda index: _worker_argv(ctx, index, mode), workers, env=env)
    try:
        urls = processes.start()
    except RuntimeError as exc:
        fail(str(exc))
    front = ShardFront(
        urls,
        processes=processes,
        request_timeout_s=request_timeout,
        max_body_bytes=max_body_bytes,
    )
    server = AsgiServer(
        front,
        host=host,
        port=port,
        log_level="warning" if log_level in ("debug", "info") else log_level,
        on_close=front.aclose,
        name="rllm-gateway-front",
    )

    async def serve() -> None:
        url = await server.astart()
        params = ctx.params
        console.print(
            f"rllm-core gateway on {url} ({mode} mode, renderer {params['renderer']},"
            f" {workers} workers)"
        )
        console.print(
            f"  agents: base_url {url}/sessions/<session_id>/v1 (through the front), or the"
            " owning worker's, which POST /sessions/<session_id>/token answers as base_url"
        )
        if token is None:
            console.print("  auth: none (loopback only)")
        else:
            shown = "as given by --token" if token_given else token
            console.print(f"  admin token: {shown}")
            console.print(
                "  session tokens: POST /sessions/<session_id>/token with the admin token"
            )
        console.print(f"  workers: {', '.join(urls)}")
        console.print(f"  upstreams: {', '.join(params['upstreams'])}")
        sys.stdout.flush()
        await server.wait()

    try:
        _serve_until_stopped(serve)
    except OSError as exc:
        fail(f"could not serve on {host}:{port}: {exc}")
    finally:
        processes.stop()
