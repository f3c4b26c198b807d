"""Identifiers in Engram's key alphabet.

Engram keys and scope names are ``[A-Za-z0-9._/-]``; the integrations store
identifiers that may hold anything (LangGraph thread ids and namespaces,
ADK app and user names), so each is escaped into one path segment:
``_XX`` per UTF-8 byte outside ``[A-Za-z0-9.-]``, and a lone ``_`` for the
empty string. The escaping is reversible and keeps ``/`` free as the
separator.
"""

from __future__ import annotations

_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-")


def escape(text: str) -> str:
    """``text`` in Engram's key alphabet, one path segment, reversible."""
    if not text:
        return "_"
    return "".join(
        ch if ch in _PLAIN else "".join(f"_{b:02X}" for b in ch.encode()) for ch in text
    )


def unescape(segment: str) -> str:
    if segment == "_":
        return ""
    out = bytearray()
    i = 0
    while i < len(segment):
        if segment[i] == "_":
            out.append(int(segment[i + 1 : i + 3], 16))
            i += 3
        else:
            out += segment[i].encode()
            i += 1
    return out.decode()
