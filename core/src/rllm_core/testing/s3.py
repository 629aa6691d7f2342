"""An S3 endpoint on this machine for tests and benchmarks: moto's server on 127.0.0.1.

moto (``pip install 'moto[server]>=5.2.1'``) keeps every bucket in memory and answers the S3
API over HTTP, conditional writes (``If-None-Match: *``) and ``StartAfter`` listings included,
so a store under test talks to it exactly as it talks to S3. moto is imported only when a
server starts.

pytest fixtures (registered by :mod:`rllm_core.testing.pytest_plugin`):

- ``s3_server`` (session): an :class:`S3Endpoint` on a free port; the test is skipped when
  moto is not installed.
- ``s3_bucket``: the name of a fresh, empty bucket on ``s3_server``.

Outside pytest, :func:`moto_server` starts a server for a ``with`` block and
:func:`moto_object_store` hands out an ``object_store:s3`` on a fresh bucket.

The endpoint carries its own dummy credentials (:attr:`S3Endpoint.credentials`): nothing here
reads or sets the process environment.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["MOTO_MISSING", "S3Endpoint", "moto_object_store", "moto_server"]

MOTO_MISSING = "moto is not installed: pip install 'moto[server]>=5.2.1' to run the S3 tests"
"""Why an S3 test is skipped when moto cannot be imported."""

_buckets = itertools.count()


@dataclass(frozen=True)
class S3Endpoint:
    """Where a test S3 server answers, and the credentials it accepts (any, for moto)."""

    url: str
    region: str = "us-east-1"
    access_key_id: str = "rllm-test-access-key"
    secret_access_key: str = "rllm-test-secret-key"

    @property
    def credentials(self) -> dict[str, str]:
        """The plan keys of ``object_store:s3`` that hold the credentials."""
        return {
            "access_key_id": self.access_key_id,
            "secret_access_key": self.secret_access_key,
        }

    def store_config(self, bucket: str, **keys: Any) -> dict[str, Any]:
        """The plan keys of an ``object_store:s3`` on ``bucket`` of this endpoint, plus
        ``keys``."""
        return {
            "bucket": bucket,
            "endpoint_url": self.url,
            "region": self.region,
            **self.credentials,
            **keys,
        }

    def create_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh unique name unless ``name`` is given); return its name."""
        name = name or f"rllm-test-{next(_buckets)}-{uuid.uuid4().hex[:8]}"
        request = urllib.request.Request(f"{self.url}/{name}", method="PUT")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise RuntimeError(
                f"the S3 server at {self.url} refused to create bucket {name!r}"
                f" (HTTP {exc.code}): {detail}"
            ) from exc
        return name

    @contextlib.contextmanager
    def checking_credentials(self) -> Iterator[None]:
        """Make the server check credentials for the ``with`` block: it then refuses every
        request, as S3 refuses an unknown access key (HTTP 403 ``InvalidAccessKeyId``)."""
        self._set_free_requests("0")
        try:
            yield
        finally:
            self._set_free_requests("inf")

    def _set_free_requests(self, count: str) -> None:
        request = urllib.request.Request(
            f"{self.url}/moto-api/reset-auth",
            data=count.encode(),
            headers={"Content-Type": "text/plain"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()


@contextlib.contextmanager
def moto_server() -> Iterator[S3Endpoint]:
    """Run moto's S3 server on 127.0.0.1 (a free port) for the ``with`` block.

    The server is moto's own WSGI application on werkzeug's threaded server, as
    ``moto.server.ThreadedMotoServer`` runs it, except that it handles one request at a time:
    moto checks ``If-None-Match`` and then stores the object in two steps with no lock between
    them, where S3 does both at once, so two concurrent conditional writes could both succeed.
    Serving requests one by one makes each of them atomic, as on S3.

    Raises ``ImportError`` (with :data:`MOTO_MISSING`) when moto is not installed.
    """
    try:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server
    except ImportError as exc:
        raise ImportError(MOTO_MISSING) from exc

    application = DomainDispatcherApplication(create_backend_app)
    one_at_a_time = threading.Lock()

    def serialized(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        with one_at_a_time:
            body = application(environ, start_response)
            try:
                return [b"".join(body)]
            finally:
                close = getattr(body, "close", None)
                if close is not None:
                    close()

    # werkzeug logs every request at INFO; keep test and benchmark output readable.
    requests_log = logging.getLogger("werkzeug")
    level = requests_log.level
    requests_log.setLevel(logging.WARNING)
    server = make_server(
        "127.0.0.1", 0, serialized, threaded=True, request_handler=MotoRequestHandler
    )
    thread = threading.Thread(target=server.serve_forever, name="moto-s3", daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield S3Endpoint(url=f"http://{host}:{port}")
    finally:
        server.shutdown()
        thread.join()
        server.server_close()
        requests_log.setLevel(level)


@contextlib.contextmanager
def moto_object_store(**keys: Any) -> Iterator[Any]:
    """An ``object_store:s3`` on a fresh bucket of a moto server started for the block, built
    from plan keys (``keys`` add to or replace them) through the installed plugins; ``None``
    when moto or rllm-object-store-s3 is not installed."""
    from rllm_core.errors import UnknownComponentError
    from rllm_core.plugins.manager import PluginManager

    try:
        component = PluginManager().get("object_store", "s3")
        server = moto_server()
        endpoint = server.__enter__()
    except (ImportError, UnknownComponentError):
        endpoint = None
    if endpoint is None:
        yield None
        return
    with contextlib.ExitStack() as stack:
        stack.push(server)
        store = component.build(endpoint.store_config(endpoint.create_bucket(), **keys))
        stack.callback(store.close)
        yield store
