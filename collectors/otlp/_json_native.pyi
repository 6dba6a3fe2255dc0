"""Types of the OTLP/JSON transcoder (collectors/otlp/_json_native.c; its ``methods`` table)."""

from typing_extensions import Buffer

def transcode(body: Buffer, max_depth: int, /) -> bytes | None:
    """The protobuf bytes of the request the OTLP/JSON ``body`` encodes, or None to leave the body
    to Python (json.loads + build_request)."""
