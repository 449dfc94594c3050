"""Host names and origins as browsers write them: the parsing the browser-safety layer (``browser.py``) and the
settings' checks of ``--allowed-hosts`` and ``--cors-origins`` (``settings.py``) share."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}


def split_host(value: str) -> tuple[str, int | None] | None:
    """``name[:port]`` → (lower-case name, IPv6 kept in brackets; port or None); None if malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        name, rest = value[: end + 1], value[end + 1 :]
        if end < 0 or (rest and not rest.startswith(":")):
            return None
        port = rest[1:] if rest else None
    elif ":" in value:
        name, _, port = value.partition(":")
    else:
        name, port = value, None
    if not name or (port is not None and not (port.isdigit() and 0 < int(port) < 65536)):
        return None
    if name.startswith("["):  # as browsers write it: compressed
        try:
            name = f"[{ipaddress.IPv6Address(name[1:-1])}]"
        except ValueError:
            return None
    return name, int(port) if port is not None else None


def normalize_origin(entry: str) -> str:
    """A ``--cors-origins`` entry as browsers write Origin: lower case, no trailing slash, no default port."""
    entry = entry.strip().lower().rstrip("/")
    if entry in ("*", "null"):
        return entry
    parts = urlsplit(entry)
    if not parts.scheme or not parts.netloc or parts.path or parts.query or parts.fragment or "@" in parts.netloc:
        raise ValueError(f"cors origin {entry!r} is not an origin: write scheme://host[:port], 'null' or '*'")
    hostport = split_host(parts.netloc)
    if hostport is None:
        raise ValueError(f"cors origin {entry!r} has a malformed host or port")
    name, port = hostport
    keep = port is not None and port != DEFAULT_PORTS.get(parts.scheme)
    return f"{parts.scheme}://{name}:{port}" if keep else f"{parts.scheme}://{name}"
