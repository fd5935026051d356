"""A moto S3 server on 127.0.0.1 for the remote tests (reads and writes), stopped on exit."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest


@contextlib.contextmanager
def moto_server() -> Iterator[tuple[str, Any]]:
    """(endpoint URL, a boto3 S3 client of it with the test keys); skips without moto or boto3."""
    server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    srv = server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    srv.start()
    try:
        host, port = srv.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        yield endpoint, boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                     aws_access_key_id="testing", aws_secret_access_key="testing")
    finally:
        srv.stop()
