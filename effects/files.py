"""files.write: one file below the host's export root, never outside it.

Settings, `[integrations.files]`:
    root = "/srv/agent-exports"          # required to use files.write; must exist
    per_sandbox = true                   # default: each sandbox writes below root/<sandbox>/
    protected_paths = ["bin/*", "*.sh"]  # optional: a person approves writes there

The path is canonical before the policy sees it (`./a`, `a//b`, `a/./b`, a trailing
`/` or `/.` are rewritten; `..`, absolute paths, control characters and non-NFC text
are refused), then walked component by component from a directory fd with O_NOFOLLOW,
so symbolic links inside the root are refused, not followed. With `per_sandbox` (the
default) sandboxes sharing a root never see each other's files, not even through
"exists" or "unchanged" in a result; `per_sandbox = false` shares one tree.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import uuid
from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from broker.errors import ConfigError, EffectFailed
from broker.models import Preview
from broker.typing import JSON, Params
from effects.base import Context, Handler
from effects.normal_forms import relative_path
from effects.textdiff import unified

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _parts(path: str) -> list[str]:
    return relative_path(path, "/params/path").split("/")


class FilesWrite(Handler):
    """Write one file below [integrations.files] root."""

    name = "files.write"
    identifying = ("path", "overwrite")
    reversible = True
    idempotent = True
    undo = (
        "a new file can be deleted; an overwrite (overwrite: true) replaces the old "
        "content for good"
    )
    config_keys = frozenset({"root", "per_sandbox", "protected_paths"})
    assess_inline = True  # reversible_for and protected_for read params and settings

    def check_config(self, settings: Mapping[str, Any]) -> None:
        super().check_config(settings)
        if "root" in settings:
            root = settings["root"]
            if not isinstance(root, str) or not Path(root).is_dir():
                raise ConfigError(f"integrations.files.root: {root!r} is not an existing directory")
        if not isinstance(settings.get("per_sandbox", True), bool):
            raise ConfigError("integrations.files.per_sandbox: expected true or false")
        globs = settings.get("protected_paths", [])
        if not isinstance(globs, list) or not all(isinstance(g, str) and g for g in globs):
            raise ConfigError("integrations.files.protected_paths: must be a list of globs")

    def canonical(self, params: Params, ctx: Context) -> Params:
        return {**params, "path": relative_path(params["path"], "/params/path")}

    def check(self, params: Params, ctx: Context) -> None:
        _parts(params["path"])

    def reversible_for(self, params: Params, ctx: Context) -> bool:
        return not params.get("overwrite", False)

    def protected_for(self, params: Params, ctx: Context) -> Sequence[str]:
        path = "/".join(_parts(params["path"]))
        globs = ctx.settings.get("protected_paths", [])
        return [path] if any(fnmatchcase(path, g) for g in globs) else []

    def _root(self, ctx: Context, create: bool = True) -> Path:
        """The directory this sandbox writes below; `create=False` (a preview, which
        changes nothing, in staged mode too) leaves a missing one missing."""
        root = ctx.settings.get("root")
        if not root:
            raise EffectFailed(
                "failed: files.write is not configured on this host ([integrations.files] root)"
            )
        if not ctx.settings.get("per_sandbox", True):
            return Path(root)
        mine = Path(root) / ctx.sandbox
        if not create:
            return mine
        try:
            os.mkdir(mine, 0o755)
        except FileExistsError:
            pass
        except OSError as exc:
            raise EffectFailed(f"failed: the export root is unavailable: {exc.strerror}") from exc
        return mine

    def preview(self, params: Params, ctx: Context) -> Preview:
        root = self._root(ctx, create=False)
        content: str = params["content"]
        target = root.joinpath(*_parts(params["path"]))
        data = content.encode("utf-8")
        facts = [("bytes", str(len(data))), ("sha256", hashlib.sha256(data).hexdigest())]
        body, kind = content, "text"
        try:
            old = self._read_existing(root, _parts(params["path"]))
        except EffectFailed as exc:
            facts.append(("refused", exc.reason))
            old = None
        if old is None:
            facts.append(("exists", "no: a new file"))
        else:
            facts.append(("exists", f"yes, {len(old)} bytes"))
            if old != data:
                facts.append(("overwrite", "yes" if params.get("overwrite") else "no: will fail"))
                body = unified(
                    old.decode("utf-8", "replace"),
                    content,
                    fromfile=f"{target} (now)",
                    tofile=f"{target} (after)",
                )
                kind = "diff"
        return Preview(
            title=f"write {len(data)} bytes to {target}",
            target=f"files: {target}",
            body=body,
            body_kind=kind,
            facts=tuple(facts),
        )

    def apply(self, params: Params, ctx: Context) -> JSON:
        root = self._root(ctx)
        parts = _parts(params["path"])
        data = params["content"].encode("utf-8")
        digest = hashlib.sha256(data).hexdigest()
        out: JSON = {"path": "/".join(parts), "bytes": len(data), "sha256": digest}
        dir_fd = self._open_parent(root, parts, create=True)
        try:
            existing = self._read_at(dir_fd, parts[-1], "/".join(parts))
            if existing == data:
                return {**out, "created": False, "changed": False}
            if existing is not None and not params.get("overwrite", False):
                raise EffectFailed(
                    f"failed: {out['path']} already exists with other content; "
                    "choose a new path, or set overwrite: true (which needs approval)"
                )
            tmp = f".{parts[-1]}.{uuid.uuid4().hex}.broker-tmp"
            fd = os.open(
                tmp,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o644,
                dir_fd=dir_fd,
            )
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            if existing is None:
                # link, not rename: it fails if another request created the file meanwhile
                try:
                    os.link(tmp, parts[-1], src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                except FileExistsError:
                    os.unlink(tmp, dir_fd=dir_fd)
                    return self._settle_race(params, dir_fd, parts, data, out)
                os.unlink(tmp, dir_fd=dir_fd)
            else:
                os.rename(tmp, parts[-1], src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            os.fsync(dir_fd)
            return {**out, "created": existing is None, "changed": True}
        finally:
            os.close(dir_fd)

    def _settle_race(
        self, params: Params, dir_fd: int, parts: list[str], data: bytes, out: JSON
    ) -> JSON:
        """Another request created the file first: same bytes is fine, else refuse."""
        if self._read_at(dir_fd, parts[-1], "/".join(parts)) == data:
            return {**out, "created": False, "changed": False}
        raise EffectFailed(
            f"failed: {out['path']} was created by another request meanwhile; "
            "choose a new path, or set overwrite: true (which needs approval)"
        )

    def _read_existing(self, root: Path, parts: list[str]) -> bytes | None:
        if not root.exists() and root.parent.is_dir():  # this sandbox has written nothing yet
            return None
        try:
            dir_fd = self._open_parent(root, parts, create=False)
        except FileNotFoundError:
            return None
        try:
            return self._read_at(dir_fd, parts[-1], "/".join(parts))
        finally:
            os.close(dir_fd)

    @staticmethod
    def _read_at(dir_fd: int, name: str, shown: str) -> bytes | None:
        try:
            fd = os.open(
                name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
            )
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise EffectFailed(
                    f"failed: {shown} is a symbolic link on the host; refusing to follow it"
                ) from exc
            raise EffectFailed(f"failed: cannot open {shown}: {exc.strerror}") from exc
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise EffectFailed(f"failed: {shown} exists and is not a regular file")
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    @staticmethod
    def _open_parent(root: Path, parts: list[str], *, create: bool) -> int:
        """An fd of the file's directory, walked from root without following links."""
        try:
            fd = os.open(root, _DIR_FLAGS)
        except OSError as exc:
            raise EffectFailed(f"failed: the export root is unavailable: {exc.strerror}") from exc
        try:
            for i, part in enumerate(parts[:-1]):
                nxt = _enter(fd, part, "/".join(parts[: i + 1]), create)
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd


def _enter(fd: int, part: str, where: str, create: bool) -> int:
    """An fd of directory `part` below `fd`, made first if absent and `create`: a
    directory another request made meanwhile is simply opened."""
    try:
        try:
            return os.open(part, _DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise
        try:
            os.mkdir(part, 0o755, dir_fd=fd)
        except FileExistsError:
            pass  # made by another request between our open and our mkdir
        return os.open(part, _DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise EffectFailed(
                f"failed: {where} is a symbolic link or not a directory on the host; "
                "refusing to follow it"
            ) from exc
        raise EffectFailed(f"failed: cannot open {where}: {exc.strerror}") from exc
