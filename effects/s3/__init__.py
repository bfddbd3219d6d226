"""s3.put_object, s3.copy_object, s3.delete_object: objects in allow-listed buckets, undoable.

Settings, `[integrations.s3]`:

    allow = ["agent-scratch/*", "reports/out/*"]    # bucket/prefix*, or bucket/exact-key
    endpoint_url = "http://127.0.0.1:9000"          # optional: an S3-compatible server
    region = "eu-west-1"                            # optional
    access_key_id_env = "BROKER_S3_KEY_ID"          # optional, with secret_access_key_env
    secret_access_key_env = "BROKER_S3_SECRET"      # (or *_file); else boto3's own chain
    session_token_env = "BROKER_S3_TOKEN"           # optional
    addressing_style = "path"                       # optional: auto | path | virtual

Nothing outside `allow` is read or written, whatever a request says. Every write is
conditional: what the broker saw of the target when it classified the request
(`reversible_for`) and, for a request that waits for a person, when it computed the
preview, is remembered with the request (`ctx.remember`; the broker drops it when the
request ends; what a person saw outranks a later classification). `apply`
sends that state to S3 as If-Match (its ETag) or If-None-Match: * (it did not exist),
so S3 refuses a write to an object that changed since the approver saw it (412 →
`failed`). Without such a record the agent's `if_match`/`if_none_match`, else the
state read just before the write, is the condition, so `previous` in the output is
exact. moto ignores the destination conditions of CopyObject, so a copy also compares
before it sends them (AWS enforces them).

Undo (`revert_preview`, `revert`) is one delete: of the version a put or copy created
(the previous version is current again), of a new key in an unversioned bucket, or of
the delete marker a delete left. Anything else cannot be undone and says why.

Modules, one per concern:

    settings     [integrations.s3], checked, and the allowlist (grants)
    errors       botocore's exceptions and S3's error codes → EffectFailed
    clients      boto3 clients with the host's credentials
    state        an object as the broker saw it, read from S3
    seen         what was observed, and at which stage (`ctx.remember`)
    conditions   the condition a write sends, and the reason for a 412
    bodies       the bytes a put writes
    previews     what an approver reads
    handler      what the three effects share; write: what put and copy share
    put_object, copy_object, delete_object   the three effects
"""

from __future__ import annotations

from effects.s3.copy_object import CopyObject
from effects.s3.delete_object import DeleteObject
from effects.s3.errors import REASONS, Op, botocore_reasons, translate
from effects.s3.put_object import PutObject

__all__ = [
    "REASONS",
    "CopyObject",
    "DeleteObject",
    "Op",
    "PutObject",
    "botocore_reasons",
    "translate",
]
