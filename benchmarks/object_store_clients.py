"""S3 clients for the object store: boto3 against obstore, on a moto server on this machine.

boto3 is measured as ``object_store:s3`` uses it: a client from its core, botocore, made on a
session that reads no AWS config file, profile or configured endpoint, with no
``Expect: 100-continue`` wait before a body (boto3's resource layer adds import time and
nothing the store calls).

For each client: the time to import it and to make its first client (in a fresh interpreter,
median of 5), and the latency of the calls ``object_store:s3`` makes: ``put`` of 1 KB and of
1 MB, ``get`` of 1 KB, ``put_if_absent`` of 1 KB that creates the key and that finds it, and
``list`` of a 100-key prefix from the middle (``start_after``). Before timing, each client must
pass the checks the object store contract needs:

- ``if_none_match``: a put with ``If-None-Match: *`` on an existing key is refused (HTTP 412)
  and leaves the object as it was;
- ``start_after``: a listing returns exactly the keys strictly after ``start_after``;
- ``plain_prefix``: a listing of prefix ``a`` returns ``ab`` as well as ``a/b`` (the port's
  string prefix), in one request, without listing a parent folder and filtering;
- ``odd_keys``: a key with a space, ``%``, ``+``, ``#``, ``?`` and non-ASCII letters comes back
  from ``list`` as it was written, and ``get`` finds it;
- ``explicit_credentials_only``: with ``AWS_SKIP_SIGNATURE=true`` and ``AWS_SESSION_TOKEN``
  set in the environment, a client given explicit credentials still signs its requests with
  them and sends no session token (measured against a local server that records headers).

moto answers every request in Python, so its own time is in every figure; both clients talk to
the same server, one after the other, so the differences are the clients' own. Latencies are
the median and 99th percentile of ``--calls`` calls (``--large-calls`` for 1 MB).

Run from the repository root after ``scripts/setup.sh``, with nothing else running::

    .venv/bin/pip install boto3 obstore 'moto[server]>=5.2.1'
    .venv/bin/python benchmarks/object_store_clients.py          # a table
    .venv/bin/python benchmarks/object_store_clients.py --json   # one JSON object

``--quick`` runs a few calls of each (a smoke test, not a measurement).
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _tables import right_aligned
from rllm_core.testing.s3 import S3Endpoint, moto_server

CLIENTS = ("boto3", "obstore")
DISTRIBUTIONS = {"boto3": "botocore", "obstore": "obstore"}
SMALL = os.urandom(1024)
LARGE = os.urandom(1024 * 1024)
LIST_KEYS = 100
ODD_KEY = "odd dir/naïve key %41+#?.bin"


# --------------------------------------------------------------------------------------------
# The two clients, each used the way object_store:s3 would use it
# --------------------------------------------------------------------------------------------


class Boto3Client:
    def __init__(self, endpoint: S3Endpoint, bucket: str) -> None:
        self._client = botocore_client(endpoint.url, endpoint)
        self._bucket = bucket

    def put(self, key: str, data: bytes) -> None:
        self._client.put_object(Bucket=self._bucket, Key=key, Body=data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._client.put_object(Bucket=self._bucket, Key=key, Body=data, IfNoneMatch="*")
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 412:
                return False
            raise
        return True

    def get(self, key: str) -> bytes:
        return self._client.get_object(Bucket=self._bucket, Key=key)["Body"].read()

    def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        keys: list[str] = []
        arguments: dict[str, Any] = {"Bucket": self._bucket, "Prefix": prefix}
        if start_after is not None:
            arguments["StartAfter"] = start_after
        while True:
            page = self._client.list_objects_v2(**arguments)
            keys += [item["Key"] for item in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return keys
            arguments["ContinuationToken"] = page["NextContinuationToken"]


class ObstoreClient:
    def __init__(self, endpoint: S3Endpoint, bucket: str) -> None:
        from obstore.store import S3Store

        self._store = S3Store(
            bucket,
            endpoint=endpoint.url,
            region=endpoint.region,
            access_key_id=endpoint.access_key_id,
            secret_access_key=endpoint.secret_access_key,
            client_options={"allow_http": True},
        )

    def put(self, key: str, data: bytes) -> None:
        import obstore

        obstore.put(self._store, key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        import obstore
        from obstore.exceptions import AlreadyExistsError

        try:
            obstore.put(self._store, key, data, mode="create")
        except AlreadyExistsError:
            return False
        return True

    def get(self, key: str) -> bytes:
        import obstore

        return bytes(obstore.get(self._store, key).bytes())

    def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        import obstore

        # obstore lists folders: list the prefix's folder and keep what matches the string.
        folder = prefix.rpartition("/")[0] or None
        keys = [
            item["path"]
            for batch in obstore.list(self._store, prefix=folder, offset=start_after)
            for item in batch
        ]
        return [k for k in keys if k.startswith(prefix)]


def botocore_client(url: str, endpoint: S3Endpoint) -> Any:
    import botocore.session
    from botocore.config import Config
    from botocore.handlers import add_expect_header

    session = botocore.session.Session(
        session_vars={
            "profile": (None, None, None, None),
            "config_file": (None, None, os.devnull, None),
            "credentials_file": (None, None, os.devnull, None),
            "ignore_configured_endpoint_urls": (None, None, True, None),
        }
    )
    client = session.create_client(
        "s3",
        region_name=endpoint.region,
        endpoint_url=url,
        aws_access_key_id=endpoint.access_key_id,
        aws_secret_access_key=endpoint.secret_access_key,
        config=Config(
            retries={"total_max_attempts": 1, "mode": "standard"},
            s3={"addressing_style": "path"},
        ),
    )
    client.meta.events.unregister("before-call.s3", add_expect_header)
    return client


def make_client(name: str, endpoint: S3Endpoint, bucket: str) -> Any:
    return {"boto3": Boto3Client, "obstore": ObstoreClient}[name](endpoint, bucket)


def plain_prefix_native(name: str, endpoint: S3Endpoint, bucket: str) -> bool:
    """Whether the client's own listing of prefix ``a`` returns ``ab`` (no folder filter)."""
    if name == "boto3":
        client = Boto3Client(endpoint, bucket)
        return "ab" in client.list("a")
    import obstore

    store = ObstoreClient(endpoint, bucket)._store
    return "ab" in [i["path"] for batch in obstore.list(store, prefix="a") for i in batch]


# --------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------


class _HeaderRecorder(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, str]]] = []

    def do_PUT(self) -> None:
        self.seen.append({k.lower(): v for k, v in self.headers.items()})
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("ETag", '"0"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def explicit_credentials_only(name: str) -> bool:
    recorder = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HeaderRecorder)
    thread = threading.Thread(target=recorder.serve_forever, daemon=True)
    thread.start()
    try:
        host, port = recorder.server_address[:2]
        endpoint = S3Endpoint(url=f"http://{host}:{port}")
        _HeaderRecorder.seen = []
        with _environment({"AWS_SKIP_SIGNATURE": "true", "AWS_SESSION_TOKEN": "ambient"}):
            make_client(name, endpoint, "bucket").put("probe", b"x")
        headers = _HeaderRecorder.seen[-1]
        return (
            f"Credential={endpoint.access_key_id}/" in headers.get("authorization", "")
            and "x-amz-security-token" not in headers
        )
    finally:
        recorder.shutdown()
        thread.join()


def checks(name: str, endpoint: S3Endpoint) -> dict[str, bool]:
    bucket = endpoint.create_bucket()
    client = make_client(name, endpoint, bucket)
    client.put("cond", b"first")
    refused = client.put_if_absent("cond", b"second") is False
    created = client.put_if_absent("cond-new", b"x") is True
    for key in ("s/1", "s/2", "s/3", "s/30", "a/b", "ab"):
        client.put(key, b"x")
    client.put(ODD_KEY, b"odd")
    return {
        "if_none_match": refused and created and client.get("cond") == b"first",
        "start_after": client.list("s/", start_after="s/2") == ["s/3", "s/30"]
        and client.list("s/", start_after="s/25") == ["s/3", "s/30"]
        and client.list("s/", start_after="s/30") == [],
        "plain_prefix": plain_prefix_native(name, endpoint, bucket),
        "odd_keys": client.list("odd dir/") == [ODD_KEY] and client.get(ODD_KEY) == b"odd",
        "explicit_credentials_only": explicit_credentials_only(name),
    }


# --------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------


_IMPORT_PROBE = """
import sys, time
started = time.perf_counter()
if sys.argv[1] == "boto3":
    import botocore.session
    from botocore.config import Config
    imported = time.perf_counter()
    botocore.session.Session().create_client(
        "s3", region_name="us-east-1", endpoint_url="http://127.0.0.1:9",
        aws_access_key_id="k", aws_secret_access_key="s",
        config=Config(retries={"total_max_attempts": 1, "mode": "standard"}),
    )
else:
    from obstore.store import S3Store
    imported = time.perf_counter()
    S3Store("bucket", endpoint="http://127.0.0.1:9", region="us-east-1",
            access_key_id="k", secret_access_key="s", client_options={"allow_http": True})
print(imported - started, time.perf_counter() - imported)
"""


def measure_import(name: str, runs: int) -> dict[str, float]:
    imports, clients = [], []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", _IMPORT_PROBE, name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        imports.append(float(out[0]))
        clients.append(float(out[1]))
    return {
        "import_ms": statistics.median(imports) * 1e3,
        "first_client_ms": statistics.median(clients) * 1e3,
    }


def _timed(call: Callable[[int], Any], calls: int) -> dict[str, float]:
    times = []
    for i in range(calls):
        started = time.perf_counter()
        call(i)
        times.append(time.perf_counter() - started)
    ordered = sorted(times)
    return {
        "p50_ms": statistics.median(ordered) * 1e3,
        "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3,
    }


def measure_calls(name: str, endpoint: S3Endpoint, calls: int, large_calls: int) -> dict:
    client = make_client(name, endpoint, endpoint.create_bucket())
    for i in range(LIST_KEYS):
        client.put(f"list/{i:04d}", SMALL)
    client.put("get/small", SMALL)
    middle = f"list/{LIST_KEYS // 2 - 1:04d}"
    assert len(client.list("list/", start_after=middle)) == LIST_KEYS // 2
    return {
        "put_1kb": _timed(lambda i: client.put(f"put/{i}", SMALL), calls),
        "put_1mb": _timed(lambda i: client.put(f"large/{i}", LARGE), large_calls),
        "get_1kb": _timed(lambda i: client.get("get/small"), calls),
        "put_if_absent_creates": _timed(lambda i: client.put_if_absent(f"new/{i}", SMALL), calls),
        "put_if_absent_exists": _timed(lambda i: client.put_if_absent("get/small", SMALL), calls),
        "list_50_of_100": _timed(lambda i: client.list("list/", start_after=middle), calls),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    load = os.getloadavg()[0]
    results: dict[str, Any] = {"clients": {}}
    with moto_server() as endpoint:
        for name in CLIENTS:
            results["clients"][name] = {
                "distribution": DISTRIBUTIONS[name],
                "version": importlib.metadata.version(DISTRIBUTIONS[name]),
                **measure_import(name, args.import_runs),
                "checks": checks(name, endpoint),
                "calls": measure_calls(name, endpoint, args.calls, args.large_calls),
            }
    results["setup"] = {
        "calls": args.calls,
        "large_calls": args.large_calls,
        "import_runs": args.import_runs,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "load_average_before": load,
    }
    return results


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


CALLS = (
    ("put_1kb", "put 1 KB"),
    ("put_1mb", "put 1 MB"),
    ("get_1kb", "get 1 KB"),
    ("put_if_absent_creates", "put_if_absent 1 KB, creates"),
    ("put_if_absent_exists", "put_if_absent 1 KB, exists"),
    ("list_50_of_100", "list 50 of 100 (start_after)"),
)


def render(results: dict[str, Any]) -> str:
    clients = results["clients"]
    setup = results["setup"]
    names = list(clients)
    lines = [
        f"S3 clients on a moto server: {setup['calls']} calls per row ({setup['large_calls']}"
        f" for 1 MB); load average before {setup['load_average_before']:.2f}",
        "",
    ]
    rows = [
        ["version", *(f"{clients[n]['distribution']} {clients[n]['version']}" for n in names)],
        ["import ms", *(f"{clients[n]['import_ms']:.0f}" for n in names)],
        ["first client ms", *(f"{clients[n]['first_client_ms']:.0f}" for n in names)],
    ]
    for key, label in CALLS:
        rows.append(
            [
                f"{label} p50 / p99 ms",
                *(
                    f"{clients[n]['calls'][key]['p50_ms']:.2f} / "
                    f"{clients[n]['calls'][key]['p99_ms']:.2f}"
                    for n in names
                ),
            ]
        )
    for check in clients[names[0]]["checks"]:
        rows.append(
            [f"check {check}", *("yes" if clients[n]["checks"][check] else "NO" for n in names)]
        )
    lines += right_aligned(["", *names], rows, left=1)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--calls", type=int, default=300, help="timed calls per small row")
    parser.add_argument("--large-calls", type=int, default=30, help="timed 1 MB puts")
    parser.add_argument("--import-runs", type=int, default=5, help="fresh interpreters per client")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    args = parser.parse_args(argv)
    if args.quick:
        args.calls, args.large_calls, args.import_runs = 5, 2, 1
    results = run(args)
    print(json.dumps(results, indent=2) if args.json else render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
