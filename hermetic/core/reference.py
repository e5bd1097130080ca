"""Image references: the grammar of ``base:`` and of push/pull arguments, always pinned by digest.

``[HOST/]REPO[:TAG]@sha256:<hex>`` (the store first, then HOST's registry; no host: store-only),
``oci:PATH@sha256:<hex>`` / ``oci-archive:PATH@sha256:<hex>`` (a layout or its tar), ``docker:sha256:<hex>`` (an
image of the local engine, by ID)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Literal

from hermetic.core.canonical import is_sha256_hex
from hermetic.core.display import escape_controls

_REPO_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
DEFAULT_REGISTRY = "registry-1.docker.io"


DIGEST_GRAMMAR = "sha256:<64 lowercase hex digits>"


def is_digest(value: object) -> bool:
    """True for ``sha256:<64 lowercase hex>``, the only digest hermetic reads or writes."""
    if not isinstance(value, str):
        return False
    algo, sep, hexpart = value.partition(":")
    return sep == ":" and algo == "sha256" and is_sha256_hex(hexpart)


def is_tag(value: object) -> bool:
    """True for a tag of the Distribution grammar (``[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}``)."""
    return isinstance(value, str) and _TAG.fullmatch(value) is not None


def show_value(value: object) -> str:
    """A value from outside, quoted for a one-line message: control characters escaped, cut at 100 characters."""
    return escape_controls(repr(value) if not isinstance(value, str) else f"'{value}'", limit=100)


def check_digest(value: object, what: str, error: type[Exception] = ValueError) -> str:
    """``value`` if it is a digest, else ``error`` naming it: what a digest string passes before it becomes a
    path, a URL or a store ref. The caller picks the error: UsageError for what the user typed (64),
    IntegrityError for what a registry or a stored document said (65)."""
    if not is_digest(value):
        raise error(f"{what}: {show_value(value)} is not a digest ({DIGEST_GRAMMAR})")
    return value  # type: ignore[return-value]


@dataclass(frozen=True)
class ImageName:
    """``[host/]repository[:tag][@digest]`` split into parts."""

    host: str | None
    repository: str
    tag: str | None
    digest: str | None

    @property
    def has_host(self) -> bool:
        return self.host is not None

    def registry_host(self) -> str:
        return self.host or DEFAULT_REGISTRY

    def registry_repository(self) -> str:
        # Docker Hub's official images live under library/.
        if self.host is None and "/" not in self.repository:
            return "library/" + self.repository
        return self.repository

    def __str__(self) -> str:
        s = (self.host + "/" if self.host else "") + self.repository
        if self.tag:
            s += ":" + self.tag
        if self.digest:
            s += "@" + self.digest
        return s


def parse_image_arg(ref: str, hint: str | None = None, prefix: str = "") -> ImageName:
    """``ref`` as a user typed it, parsed; else a UsageError saying what is wrong (after ``prefix``)."""
    from hermetic.core.errors import UsageError

    try:
        return parse_image_name(ref)
    except ValueError as e:
        raise UsageError(f"{prefix}{e}", hint=hint) from None


def parse_pinned(ref: str, digest: str, why: str, hint: Callable[[ImageName], str]) -> ImageName:
    """``ref`` parsed and pinned by digest, else a UsageError: ``digest`` names the digest in the form's hint,
    ``why`` ends the message of one not pinned, ``hint(name)`` is its hint."""
    from hermetic.core.errors import UsageError

    name = parse_image_arg(ref, f"write HOST[:PORT]/REPO@sha256:<{digest}>")
    if name.digest is None:
        raise UsageError(f"{ref} is not pinned by digest{why}", hint=hint(name))
    return name


def parse_image_name(ref: str) -> ImageName:
    """Parse a Docker-style reference; ValueError says what is wrong."""
    if not ref or ref != ref.strip():
        raise ValueError(f"empty or padded image reference: {ref!r}")
    rest, digest = ref, None
    if "@" in ref:
        rest, _, digest = ref.partition("@")
        _check_digest(ref, digest)
    host = None
    first, slash, remainder = rest.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        host, rest = first, remainder
    tag = None
    last_slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > last_slash:
        rest, tag = rest[:colon], rest[colon + 1:]
        if not _TAG.match(tag):
            raise ValueError(f"{ref}: invalid tag {tag!r}")
    if not rest:
        raise ValueError(f"{ref}: missing repository name")
    for comp in rest.split("/"):
        if not _REPO_COMPONENT.match(comp):
            raise ValueError(f"{ref}: invalid repository component {comp!r} (lowercase letters, digits, '.', '_', '-')")
    return ImageName(host, rest, tag, digest)


@dataclass(frozen=True)
class BaseReference:
    """A base image reference as hermetic.yaml writes it, parsed: by name, OCI layout, archive or engine ID."""

    kind: Literal["name", "oci", "oci-archive", "docker"]
    digest: str  # "sha256:<hex>": manifest digest, or image ID for kind "docker"
    name: ImageName | None = None  # kind "name"
    path: str | None = None  # kinds "oci", "oci-archive"
    raw: str = ""


def parse_base_reference(ref: str) -> BaseReference:
    if not isinstance(ref, str) or not ref:
        raise ValueError("must be an image reference pinned by digest")
    for prefix in ("oci-archive:", "oci:"):
        if ref.startswith(prefix):
            path, at, digest = ref[len(prefix):].rpartition("@")
            if not at or not path:
                raise ValueError(f"{ref}: needs @sha256:<manifest digest> after the path")
            _check_digest(ref, digest)
            return BaseReference(kind=prefix[:-1], digest=digest, path=path, raw=ref)  # type: ignore[arg-type]
    if ref.startswith("docker:"):
        digest = ref[len("docker:"):]
        _check_digest(ref, digest)
        return BaseReference(kind="docker", digest=digest, raw=ref)
    if ref.startswith("sha256:"):
        raise ValueError(f"{ref}: a bare digest is ambiguous; write docker:{ref} for an engine image ID, or NAME@{ref}")
    name = parse_image_name(ref)
    if name.digest is None:
        raise ValueError(f"{ref} is a tag without a digest; pin it by digest: hermetic base pin {ref}")
    return BaseReference(kind="name", digest=name.digest, name=name, raw=ref)


def _check_digest(ref: str, digest: str) -> None:
    if not is_digest(digest):
        raise ValueError(f"{ref}: digest must be {DIGEST_GRAMMAR}")
