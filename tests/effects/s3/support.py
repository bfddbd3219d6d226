"""What the s3.* tests share: the handlers, contexts as the pipeline builds them, reads."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from broker.context import Memo
from broker.testing import make_context
from broker.validation import Validator
from effects import s3
from effects.base import Context

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


PUT, COPY, DELETE = s3.PutObject(), s3.CopyObject(), s3.DeleteObject()
VALIDATOR = Validator({h.name: h.schema for h in (PUT, COPY, DELETE)})


MEMOS: dict[tuple[Path, str], Memo] = {}


def ctx_for(
    tmp_path: Path,
    settings: dict[str, Any],
    request_id: str = "req-1",
    attachments: dict[str, Path] | None = None,
) -> Context:
    """A Context as the pipeline builds one, with secrets resolved from the environment;
    one Memo per request, as the broker keeps what was observed until apply."""

    return make_context(
        settings,
        integration="s3",
        sandbox="box",
        request_id=request_id,
        request_sha256=hashlib.sha256(request_id.encode()).hexdigest(),
        state_dir=tmp_path / "state",
        attachments=attachments or {},
        memo=MEMOS.setdefault((tmp_path, request_id), Memo()),
    )


def read(client: S3Client, bucket: str, key: str) -> bytes:
    return client.get_object(Bucket=bucket, Key=key)["Body"].read()


def exists(client: S3Client, bucket: str, key: str) -> bool:
    try:
        client.head_object(Bucket=bucket, Key=key)
    except ClientError:
        return False
    return True


def put(bucket: str, key: str, body: str, **more: Any) -> dict[str, Any]:
    return {"bucket": bucket, "key": key, "body": body, **more}


def facts(preview: Any) -> dict[str, str]:
    return dict(preview.facts)
