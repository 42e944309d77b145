"""The part of an X-Forwarded-For header the client sends."""

FORWARDED_FOR_BYTES_MAX = 4096


def forwarded_tail(header: str) -> str:
    """All of the header, or for a longer one the whole entries within its
    last FORWARDED_FOR_BYTES_MAX bytes (what the daemon reads). Clients add
    entries on the left and proxies on the right, so padding pushes no
    proxy-added hop out of view; sent whole, a huge header would overflow
    the frame and get the attempt refused as malformed."""
    raw = header.encode("utf-8", "surrogatepass")
    start = len(raw) - FORWARDED_FOR_BYTES_MAX
    if start <= 0:
        return header
    # From the byte before the window: a comma there means the window starts
    # with a whole entry. An ASCII comma is always a character boundary.
    comma = raw.find(b",", start - 1)
    if comma < 0:
        return ""  # one entry longer than the window: malformed, peer is used
    return raw[comma + 1 :].decode("utf-8", "surrogatepass")
