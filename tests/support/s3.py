"""A local S3 for tests: moto's ``ThreadedMotoServer`` on 127.0.0.1 (a free port), a bucket
created, fake credentials and a region in the environment (replica processes inherit it)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from unittest import mock

AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@contextlib.contextmanager
def local_s3(bucket: str) -> Iterator[str]:
    """Yields the endpoint URL; the server stops on exit."""
    import s3fs
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        with mock.patch.dict(os.environ, AWS_ENV):
            s3fs.S3FileSystem(endpoint_url=endpoint).mkdir(bucket)
            yield endpoint
    finally:
        server.stop()
