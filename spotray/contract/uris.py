"""Storage locations: ``s3://bucket/prefix`` and ``file:///path`` URIs, parsed without any S3 client.

The spec parser (spotray/contract/spec.py) and the CRD's rules (controller/crd.py) accept exactly
what ``parse_uri`` accepts; the stores (train/storage/store.py) open what it returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlparse

from spotray.contract.errors import InvalidUriError

_URI_EXAMPLE = "s3://my-bucket/runs/my-run (or file:///mnt/shared/runs/my-run for a shared volume)"


# --------------------------------------------------------------------------------------------- URIs


@dataclass(frozen=True)
class StorageUri:
    """A parsed ``s3://bucket/prefix`` or ``file:///path`` URI. ``prefix`` has no slashes at the ends."""

    scheme: str
    bucket: str
    prefix: str

    def __str__(self) -> str:
        if self.scheme == "file":
            return f"file://{self.prefix}" if self.prefix.startswith("/") else f"file:///{self.prefix}"
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def join(self, *parts: str) -> StorageUri:
        tail = "/".join(p.strip("/") for p in parts if p.strip("/"))
        prefix = f"{self.prefix.rstrip('/')}/{tail}" if self.prefix and tail else (self.prefix or tail)
        return StorageUri(self.scheme, self.bucket, prefix)


def _valid_bucket_name(name: str) -> bool:
    allowed = set("abcdefghijklmnopqrstuvwxyz0123456789.-")
    return 3 <= len(name) <= 63 and set(name) <= allowed and name[0].isalnum() and name[-1].isalnum()


def parse_uri(text: str) -> StorageUri:
    """Parse a checkpoint or dataset location; a plain absolute path means ``file://``."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidUriError("the storage URI is empty", f"give a URI such as {_URI_EXAMPLE}")
    text = text.strip()
    if text.startswith("/"):
        return StorageUri("file", "", text.rstrip("/") or "/")
    parsed = urlparse(text)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise InvalidUriError(
                f"'{text}' is not a file URI with an absolute path",
                "write it as file:///absolute/path (three slashes)",
            )
        return StorageUri("file", "", parsed.path.rstrip("/") or "/")
    if parsed.scheme in ("s3", "s3a"):
        bucket = parsed.netloc
        if not bucket:
            raise InvalidUriError(f"'{text}' names no bucket", f"write it as s3://BUCKET/PREFIX, e.g. {_URI_EXAMPLE}")
        if not _valid_bucket_name(bucket):
            raise InvalidUriError(
                f"'{bucket}' in '{text}' is not a valid S3 bucket name",
                "bucket names are 3-63 characters of lowercase letters, digits, '.' and '-', "
                "starting and ending with a letter or digit",
            )
        if parsed.query or parsed.fragment:
            raise InvalidUriError(f"'{text}' has a query or fragment", "remove everything after '?' or '#'")
        return StorageUri("s3", bucket, parsed.path.strip("/"))
    raise InvalidUriError(
        f"'{text}' is not an S3 or file URI (scheme '{parsed.scheme or 'none'}')",
        f"write it as {_URI_EXAMPLE}",
    )
