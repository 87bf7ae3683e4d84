"""A lane's credentials at rest: passwords the lab must show again are kept encrypted, passwords it
must only check are kept as a salted hash. Pure: the key comes from the caller (SECRET_KEY).

- :func:`encrypt` / :func:`decrypt`: Fernet (AES-128-CBC with HMAC-SHA256, from ``cryptography``)
  under a key derived from the lab's SECRET_KEY; a database dump holds no usable password.
- :func:`hash_password` / :func:`verify_password`: PBKDF2-HMAC-SHA256, what the Kafka gateway
  checks a learner's SASL/PLAIN password against without being able to show it.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from cryptography.fernet import Fernet, InvalidToken

PASSWORD_BYTES = 16  # 32 hex characters
PBKDF2_ITERATIONS = 200_000
HASH_SCHEME = "pbkdf2-sha256"


class UnreadableSecret(Exception):
    """A stored secret this key cannot decrypt: it was written under another SECRET_KEY."""


def new_password() -> str:
    return secrets.token_hex(PASSWORD_BYTES)


def _fernet(secret_key: str) -> Fernet:
    # A key of its own for this use, derived from SECRET_KEY: never the session-signing key itself.
    digest = hashlib.sha256(b"idempotency-lab lane credentials\0" + secret_key.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def encrypt(secret_key: str, value: str) -> str:
    return _fernet(secret_key).encrypt(value.encode()).decode("ascii")


def decrypt(secret_key: str, token: str) -> str:
    try:
        return _fernet(secret_key).decrypt(token.encode("ascii")).decode()
    except (InvalidToken, ValueError):
        raise UnreadableSecret("this password was stored under another SECRET_KEY") from None


def hash_password(password: str, iterations: int = PBKDF2_ITERATIONS) -> str:
    """``pbkdf2-sha256$<iterations>$<salt hex>$<hash hex>``."""
    salt = secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    return f"{HASH_SCHEME}${iterations}${salt.hex()}${digest.hex()}"


def verify_password(password_hash: str, password: str) -> bool:
    """Whether ``password`` is the one ``password_hash`` was made from (compared in constant time)."""
    try:
        scheme, iterations, salt, expected = password_hash.split("$")
        if scheme != HASH_SCHEME:
            return False
        digest = hashlib.pbkdf2_hmac("sha256", password.encode(), bytes.fromhex(salt), int(iterations))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(digest.hex(), expected)
