"""Passwords kept as PBKDF2-SHA256 hashes: ``pbkdf2_sha256$<iterations>$<salt hex>$<hash hex>``."""
from __future__ import annotations

import hashlib
import hmac
import secrets

ALGORITHM = "pbkdf2_sha256"
ITERATIONS = 200_000
SALT_BYTES = 16


def hash_password(password: str) -> str:
    """A new salted hash of ``password``."""
    salt = secrets.token_bytes(SALT_BYTES)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, ITERATIONS)
    return f"{ALGORITHM}${ITERATIONS}${salt.hex()}${digest.hex()}"


def verify_password(password_hash: str, password: str) -> bool:
    """Whether ``password`` is the one ``password_hash`` was made from (constant-time compare);
    False for a hash this module did not make."""
    try:
        algorithm, iterations, salt, digest = password_hash.split("$")
        if algorithm != ALGORITHM:
            return False
        expected = bytes.fromhex(digest)
        actual = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), bytes.fromhex(salt), int(iterations))
    except ValueError:
        return False
    return hmac.compare_digest(actual, expected)
