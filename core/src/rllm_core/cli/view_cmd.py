"""``rllm-core view``: a local web page over run folders, their episodes and traces."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from rllm_core.cli.output import EXIT_USAGE, console, fail


@click.command("view")
@click.argument("path", type=click.Path(path_type=Path), default="runs", required=False)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--port", default=0, show_default=True, type=int, help="Port to bind (0 picks a free one)."
)
@click.option(
    "--token",
    envvar="RLLM_VIEW_TOKEN",
    metavar="TOKEN",
    help="Required of every request; needed to bind a host other than loopback"
    " (env RLLM_VIEW_TOKEN).",
)
def view(path: Path, host: str, port: int, token: str | None) -> None:
    """Serve a read-only web page over the run folders in PATH (default: runs), or one run
    folder, until interrupted.

    The page lists the runs (status, steps, reward, wall time, components), draws a run's
    metrics as curves (several runs overlaid), lists its episodes with filters and shows one
    episode turn by turn with its tokens, logprobs and resets, from the same files and trace
    store as `runs show` and `traces show`. A run still writing is read as it goes. Binding a
    host other than loopback needs --token; the page is then opened at /?token=TOKEN. Exit 2
    when PATH is neither a run folder nor a directory, or another host is asked without a
    token.
    """
    import asyncio
    import signal

    from rllm_core.addresses import is_loopback
    from rllm_core.gateway.serving import AsgiServer
    from rllm_core.inspection import InspectionError
    from rllm_core.run.signals import handled
    from rllm_core.view import RunsView, ViewApp

    if not is_loopback(host) and not token:
        fail(
            f"--host {host!r} is not loopback: anyone who can reach it could read the runs;"
            " pass --token TOKEN (or set RLLM_VIEW_TOKEN), or keep the default 127.0.0.1",
            EXIT_USAGE,
        )
    try:
        runs = RunsView(path)
    except InspectionError as exc:
        fail(str(exc), EXIT_USAGE)
    server = AsgiServer(ViewApp(runs, token=token), host=host, port=port, name="rllm-view")

    async def serve() -> None:
        url = await server.astart()
        shown = f"{url}/?token=<token>" if token else f"{url}/"
        what = f"run {runs.single}" if runs.single else f"the runs in {runs.root}"
        console.print(f"rllm-core view of {what} on {shown}", markup=False, soft_wrap=True)
        sys.stdout.flush()
        await server.wait()

    try:
        with handled(lambda *_: sys.exit(0), (signal.SIGTERM,)):
            asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        fail(f"could not serve on {host}:{port}: {exc}")
