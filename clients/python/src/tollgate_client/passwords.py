"""`password_digest` and `password_tag` (PROTOCOL.md, "The password tag"):
keyed BLAKE2b-128, which hashlib provides with key and personalization."""

import hashlib

PASSWORD_KEY_BYTES = 32
# hashlib pads the personalization with zero bytes to 16, as the spec says.
PASSWORD_TAG_PERSONAL = b"tollgate-pw-tag"


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _checked_key(key: bytes) -> bytes:
    if len(key) != PASSWORD_KEY_BYTES:
        raise ValueError("the password key must be {} bytes, not {}".format(PASSWORD_KEY_BYTES, len(key)))
    return bytes(key)


def password_digest(key: bytes, account: str, password: str) -> bytes:
    """The Report's `password_digest`: the account and the password tried,
    so that a failure repeating a recent wrong password is not counted again."""
    account_bytes = _utf8(account)
    data = len(account_bytes).to_bytes(8, "little") + account_bytes + _utf8(password)
    return hashlib.blake2b(data, key=_checked_key(key), digest_size=16).digest()


def password_tag(key: bytes, password: str) -> bytes:
    """The password alone, personalized so it never matches a digest: one
    password tried against many accounts gives one tag (spray detection)."""
    return hashlib.blake2b(
        _utf8(password), key=_checked_key(key), digest_size=16, person=PASSWORD_TAG_PERSONAL
    ).digest()
