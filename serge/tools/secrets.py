"""A tool server's URL as it may be shown, and error texts with its secrets taken out.

An admin may register `http://user:PASSWORD@host/mcp?token=TOKEN`; the HTTP library's errors quote
the whole URL. Whatever a user, an export or the log sees of a server goes through here first: a
URL's password and query values become `***`, and every secret the registration holds (the URL's
password and query values, header values) is masked wherever it appears in a text. The MCP client logs
a server's whole URL (at debug) and quotes it in its errors: `scrub_logs` shows every URL in a log
record, its traceback included, as `shown_url` does.
"""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Iterable
from urllib.parse import parse_qsl, urlsplit, urlunsplit

MASK = "***"
URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")
MIN_SECRET = 4  # shorter values ("1", "on") would mask ordinary words


def shown_url(url: str) -> str:
    """`url` without its password and query values."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port  # a port that is no number ("host:1234:") raises too
    except ValueError:
        return MASK
    if ":" in host:
        host = f"[{host}]"
    netloc = (f"{parts.username}:{MASK}@" if parts.password is not None else
              f"{parts.username}@" if parts.username else "") + host + (f":{port}" if port else "")
    query = "&".join(f"{k}={MASK}" for k, _ in parse_qsl(parts.query, keep_blank_values=True))
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def secrets_of(url: str | None, header_values: Iterable[str] = ()) -> tuple[str, ...]:
    """The values a registration keeps secret."""
    found = [v for v in header_values if v]
    if url:
        try:
            parts = urlsplit(url)
            found.append(parts.password or "")
            found += [v for _, v in parse_qsl(parts.query, keep_blank_values=True)]
        except ValueError:
            pass
    return tuple(sorted({s for s in found if len(s) >= MIN_SECRET}, key=len, reverse=True))


def without_secrets(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every URL shown as `shown_url` shows it, and each of `secrets` masked."""
    text = URL.sub(lambda m: shown_url(m.group(0).rstrip(".,;)")) + m.group(0)[len(m.group(0).rstrip(".,;)")):],
                   text)
    for secret in secrets:
        text = text.replace(secret, MASK)
    return text


def scrub_logs() -> None:
    """Every log record of this process made with its URLs shown as `shown_url` shows them (once per process:
    the record factory is logging's own, shared by every logger)."""
    made = logging.getLogRecordFactory()
    if getattr(made, "scrubs_urls", False):
        return

    def scrubbed(*args, **kwargs) -> logging.LogRecord:
        record = made(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed call is logging's to report, when it formats the record
            return record
        if "://" in message:
            record.msg, record.args = without_secrets(message), None
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = without_secrets("".join(traceback.format_exception(*record.exc_info)).rstrip("\n"))
        return record

    scrubbed.scrubs_urls = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(scrubbed)
