"""The bytes a put writes: inline text, base64, or a stored attachment."""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from broker.errors import EffectFailed, InvalidParams
from broker.typing import Params
from effects.base import Context
from effects.s3.state import SHOW_MAX


@dataclass(frozen=True)
class Body:
    """The bytes a put writes: inline (body, body_b64) or a stored attachment."""

    data: bytes | None
    path: Path | None
    size: int
    sha256: str
    content_type: str

    @classmethod
    def of(cls, params: Params, ctx: Context) -> Body:
        if "body" in params:
            data = str(params["body"]).encode("utf-8")
            kind = "text/plain; charset=utf-8"
        elif "body_b64" in params:
            data = decode_b64(str(params["body_b64"]))
            kind = "application/octet-stream"
        else:
            path = attachment_path(params, ctx)
            digest = hashlib.sha256()
            with path.open("rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
            return cls(
                None,
                path,
                path.stat().st_size,
                digest.hexdigest(),
                params.get("content_type") or "application/octet-stream",
            )
        return cls(
            data,
            None,
            len(data),
            hashlib.sha256(data).hexdigest(),
            params.get("content_type") or kind,
        )

    def head(self) -> bytes | None:
        """All of the bytes when they are small enough to show."""
        if self.size > SHOW_MAX:
            return None
        if self.data is not None:
            return self.data
        assert self.path is not None
        return self.path.read_bytes()[: SHOW_MAX + 1]

    @contextmanager
    def stream(self) -> Iterator[bytes | IO[bytes]]:
        if self.data is not None:
            yield self.data
            return
        assert self.path is not None
        with self.path.open("rb") as f:
            yield f


def decode_b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidParams(
            "/params/body_b64", "body_b64 is not valid base64", "bad_base64"
        ) from exc


def attachment_path(params: Params, ctx: Context) -> Path:
    name = str(params["body_attachment"])
    try:
        path = ctx.attachment(name)
    except EffectFailed as exc:
        raise InvalidParams(
            "/params/body_attachment",
            f"no attachment named {name!r} came with the request; list it in 'attachments' "
            f"and write <request>.{name}.bin before the request",
            "missing_attachment",
        ) from exc
    if not path.is_file():
        raise InvalidParams(
            "/params/body_attachment", f"attachment {name!r} is not stored", "missing_attachment"
        )
    return path
