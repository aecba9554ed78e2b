"""Text transforms the pruner applies: blob stripping, head/tail trimming, stubs, digests.

Written by hand because they are a few lines each and must be byte-deterministic (the
provider's prompt cache only hits on identical bytes); no library does "replace base64
runs with a sized placeholder".
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from typing import Any

# A data URI with a base64 payload, e.g. "data:image/png;base64,iVBOR...".
_DATA_URI = re.compile(r"data:([\w.+-]+/[\w.+-]+)?((?:;[\w.+-]+=[\w.+-]+)*);base64,[A-Za-z0-9+/=\r\n]+")
# A bare base64 run of >= 1024 chars. The look-behind anchors matches at run starts, so the
# scan stays linear on 10 MB outputs (no retry from every position inside a short run).
_B64_RUN = re.compile(r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{1024,}={0,2}")
_B64_MIN = 1024

# Content-block types that carry binary payloads (OpenAI, Anthropic, LangChain v0/v1).
_BINARY_BLOCKS = frozenset(
    {"image", "image_url", "input_image", "file", "input_file", "audio", "input_audio", "document", "video"}
)


def digest(text: str, n: int = 8) -> str:
    """Short stable hex digest (sha1 is enough: this names, it does not protect)."""
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:n]


def human_size(n: int) -> str:
    if n < 10_000:
        return f"{n:,} chars"
    if n < 10_000_000:
        return f"{n / 1000:.1f} KB"
    return f"{n / 1_000_000:.1f} MB"


_HAS_DIGIT, _HAS_UPPER, _HAS_LOWER = re.compile(r"\d"), re.compile(r"[A-Z]"), re.compile(r"[a-z]")


def _b64_placeholder(m: re.Match[str]) -> str:
    run = m.group(0)
    probe = run[:4096]
    # Encoded binary mixes digits, upper and lower case; a long run of one letter class
    # (a padding line, a hex-free identifier) is text, not a blob.
    if not (_HAS_DIGIT.search(probe) and _HAS_UPPER.search(probe) and _HAS_LOWER.search(probe)):
        return run
    return f"[base64 data removed: {human_size(len(run))}]"


def strip_blobs_text(text: str) -> str:
    """Replace data URIs and long base64 runs with a placeholder naming type and size."""
    if len(text) < _B64_MIN and "base64," not in text:
        return text

    def _uri(m: re.Match[str]) -> str:
        mime = m.group(1) or "application/octet-stream"
        return f"[{mime} data removed: {human_size(len(m.group(0)))} base64]"

    out = _DATA_URI.sub(_uri, text) if "base64," in text else text
    if len(out) >= _B64_MIN:
        out = _B64_RUN.sub(_b64_placeholder, out)
    return text if out == text else out


def _block_mime(block: Mapping[str, Any]) -> str:
    btype = str(block.get("type", "binary"))
    for key in ("mime_type", "media_type", "format"):
        if isinstance(block.get(key), str):
            return str(block[key])
    for inner in block.values():
        if isinstance(inner, Mapping):
            for key in ("mime_type", "media_type", "format"):
                if isinstance(inner.get(key), str):
                    return str(inner[key])
            url = inner.get("url")
            if isinstance(url, str) and url.startswith("data:"):
                return url[5 : url.find(";")] if ";" in url else btype
    url = block.get("url") or block.get("image_url")
    if isinstance(url, str) and url.startswith("data:") and ";" in url:
        return url[5 : url.find(";")]
    return btype


def _block_size(block: Any) -> int:
    if isinstance(block, str):
        return len(block)
    if isinstance(block, Mapping):
        return sum(_block_size(v) for v in block.values())
    if isinstance(block, (list, tuple)):
        return sum(_block_size(v) for v in block)
    return 0


def _map_blocks(content: Any, on_text: Callable[[str], str], on_block: Callable[[Mapping[str, Any]], Any]) -> Any:
    """``content`` (a string, or a list of string and dict blocks) with ``on_text`` applied
    to its strings and ``on_block`` to its dict blocks; the *same object* when nothing
    changed (so unchanged messages are not copied)."""
    if isinstance(content, str):
        return on_text(content)
    if not isinstance(content, list):
        return content
    out = [on_text(b) if isinstance(b, str) else on_block(b) if isinstance(b, Mapping) else b for b in content]
    return out if any(new is not old for new, old in zip(out, content, strict=True)) else content


def _with_text(block: Mapping[str, Any], fn: Callable[[str], str]) -> Any:
    """``block`` with ``fn`` applied to its ``text``; the same block when unchanged."""
    text = fn(block["text"])
    return block if text is block["text"] else {**block, "text": text}


def _strip_block(block: Mapping[str, Any]) -> Any:
    btype = block.get("type")
    if isinstance(btype, str) and btype in _BINARY_BLOCKS:
        return {"type": "text", "text": f"[{btype} removed: {_block_mime(block)}, {human_size(_block_size(block))}]"}
    if isinstance(block.get("text"), str):
        return _with_text(block, strip_blobs_text)
    return block


def strip_blobs(content: Any) -> Any:
    """Content with binary blocks and base64 payloads replaced; returns the *same object*
    when nothing changed (so unchanged messages are not copied)."""
    return _map_blocks(content, strip_blobs_text, _strip_block)


def head_tail(text: str, head: int, tail: int, threshold: int) -> str:
    """``text`` if at most ``threshold`` chars, else its head and tail around a marker."""
    if len(text) <= threshold:
        return text
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut:,} chars trimmed ...]\n{text[len(text) - tail :] if tail else ''}"


def map_strings(value: Any, fn: Any) -> Any:
    """Apply ``fn`` to every string inside a JSON-like value; same object when unchanged."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, Mapping):
        changed = False
        new: dict[Any, Any] = {}
        for k, v in value.items():
            nv = map_strings(v, fn)
            changed = changed or nv is not v
            new[k] = nv
        return new if changed else value
    if isinstance(value, list):
        items = [map_strings(v, fn) for v in value]
        return items if any(a is not b for a, b in zip(items, value, strict=False)) else value
    return value


def map_content_text(content: Any, fn: Any) -> Any:
    """Apply ``fn`` to the text of ``content`` (a string, or each text block of a list)."""

    def on_block(block: Mapping[str, Any]) -> Any:
        if block.get("type", "text") == "text" and isinstance(block.get("text"), str):
            return _with_text(block, fn)
        return block

    return _map_blocks(content, fn, on_block)
