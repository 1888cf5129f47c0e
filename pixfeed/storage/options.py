"""Storage options: ``--storage-option KEY=VALUE``, the defaults pixfeed adds for
S3, and masking secrets in text (see pixfeed.storage.store)."""
from __future__ import annotations

import json
import os
import re
from typing import Iterable, Optional

from ..errors import OptionError

_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")
_SECRET_KEY = re.compile(r"secret|token|password|passwd|credential|^key$|access_key", re.I)
_S3_DEFAULTS = {"config_kwargs": {"connect_timeout": 5, "read_timeout": 30,
                                  "retries": {"max_attempts": 3, "mode": "standard"}}}


def parse_option(text: str) -> tuple:
    """``KEY=VALUE`` -> (key, value); the value is read as JSON when it is JSON (true, 8, {...})."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise OptionError(f"--storage-option {mask(text)!r}: expected KEY=VALUE, e.g. endpoint_url=http://host:9000")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def add_argument(parser) -> None:
    """``--storage-option KEY=VALUE`` (repeatable) on a command that takes URLs."""
    parser.add_argument("--storage-option", action="append", metavar="KEY=VALUE", default=[],
                        help="fsspec/s3fs option for URLs, e.g. endpoint_url=http://host:9000 or anon=true "
                             "(repeatable; credentials are better left to the environment or ~/.aws)")


def options_from_args(items: Optional[Iterable[str]]) -> dict:
    """``--storage-option`` values -> a storage_options dict; dotted keys nest (``config_kwargs.read_timeout=5``)."""
    out: dict = {}
    for text in items or ():
        key, value = parse_option(text)
        *parents, last = key.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return out


def _secrets(options: Optional[dict]) -> list:
    found = [os.environ[k] for k in _SECRET_ENV if os.environ.get(k)]

    def walk(d):
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v)
            elif isinstance(v, str) and v and _SECRET_KEY.search(str(k)):
                found.append(v)
    walk(options or {})
    return sorted(found, key=len, reverse=True)


def mask(text: str, options: Optional[dict] = None) -> str:
    """``text`` with every known secret (and any ``user:password@`` in a URL) replaced by ***."""
    for s in _secrets(options):
        if len(s) >= 4:
            text = text.replace(s, "***")
    return re.sub(r"(://[^/\s:@]+):[^/\s@]+@", r"\1:***@", text)


def with_defaults(url: str, options: Optional[dict]) -> dict:
    opts = dict(options or {})
    if url.startswith(("s3://", "s3a://")):
        for k, v in _S3_DEFAULTS.items():
            opts.setdefault(k, v)
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint and "endpoint_url" not in opts and "endpoint_url" not in opts.get("client_kwargs", {}):
            opts["endpoint_url"] = endpoint
    return opts
