"""The `Content-Disposition` of a download: the file's own name, quoted so no name can break the header, with RFC
6266's `filename*` (RFC 8187 UTF-8 percent-encoding) carrying a name that is not plain ASCII."""

import re
from urllib.parse import quote

UNSAFE_IN_QUOTES = re.compile(r'[^\x20-\x7e]|["\\]')
"""What the quoted ASCII `filename` cannot hold as is: control characters, non-ASCII, a quote, a backslash."""
ATTR_CHARS = "!#$&+-.^_`|~"
"""RFC 8187's attr-char besides letters and digits: kept as they are in `filename*`."""
FALLBACK_NAME = "download"


def content_disposition(filename: str) -> str:
    """`attachment; filename="…"` (unsafe characters as `_`), plus `filename*=UTF-8''…` when that is not the name."""
    fallback = UNSAFE_IN_QUOTES.sub("_", filename).strip() or FALLBACK_NAME
    header = f'attachment; filename="{fallback}"'
    if filename and fallback != filename:
        header += f"; filename*=UTF-8''{quote(filename, safe=ATTR_CHARS)}"
    return header
