"""Secrets out of messages: every URL a message echoes is shown without its credentials.

A receiver URL may carry a token as ``https://user:token@host/...`` or in its query (``?token=...``); a message
that names a refused or failing URL (configuration errors, logs, reports) shows :func:`mask_urls` of it:
``https://***@host/path?token=***``. Paths are kept (they say which endpoint), user info and query values are not.
"""

from __future__ import annotations

import re

MASK = "***"
# scheme://[userinfo@]rest-of-URL up to whitespace or a quote
_URL_RE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#@\s'\"]*@)?(?P<rest>[^\s'\"]*)")
_SECRET_URL_RE = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?:[^/?#@\s]*@)?(?P<host>[A-Za-z0-9.\-]+(?::\d{1,5})?)")
_QUERY_VALUE_RE = re.compile(r"(?P<key>[?&;][^=&;#\s]*=)[^&;#\s]*")


def _mask(match: re.Match) -> str:
    rest = match["rest"]
    path, hashmark, fragment = rest.partition("#")
    path = _QUERY_VALUE_RE.sub(lambda m: m["key"] + MASK, path)
    return match["scheme"] + (f"{MASK}@" if match["userinfo"] else "") + path + (hashmark + MASK if hashmark
                                                                                  else "")


def mask_urls(text: str) -> str:
    """``text`` with the user info (``user:token@``), query values and fragment of every URL in it replaced by
    ``***``."""
    return _URL_RE.sub(_mask, text)


def secret_url(url: object) -> str:
    """A URL that is a secret as a whole (a Slack or webhook URL whose path holds the token) as messages show it:
    scheme and host only, ``https://hooks.slack.com/***``; anything else ``***``."""
    match = _SECRET_URL_RE.match(url) if isinstance(url, str) else None
    return f"{match['scheme']}{match['host']}/{MASK}" if match else MASK
