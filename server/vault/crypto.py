"""Envelope encryption for the vault (the `cryptography` package):

- each vault (a workspace's, or one intern's) has its own random 256-bit data key, stored
  wrapped with the operator's master key (AES key wrap, RFC 3394);
- a secret value is sealed with AES-256-GCM under its vault's data key, with the workspace,
  scope and name as associated data, so a ciphertext moved to another row does not open;
- `fingerprint` is HMAC-SHA256 of the value under a key derived (HKDF) from the vault's
  data key: equal values match within a vault and never across vaults;
- `MasterKey.check_value` is HMAC-SHA256 of a constant under a key derived (HKDF, its own
  label) from the master key: what the database keeps so that every process on it can tell
  whether it holds the same master key (server/vault/keycheck.py). It reveals nothing of the
  key; testing a guess against it costs what testing it against a wrapped data key costs,
  and the key is 32 random bytes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.keywrap import InvalidUnwrap, aes_key_unwrap, aes_key_wrap

from server.db.datadir import FILE_MODE, private_dir, private_file

KEY_BYTES = 32
NONCE_BYTES = 12
MASTER_KEY_ENV = "GATEWAY_VAULT_MASTER_KEY"
KEY_FILE = "vault-master.key"
_CHECK_LABEL = b"vault-master-key-check"
_CHECK_CONSTANT = b"gateway vault master key check, version 1"
CHECK_PREFIX = "v1:"  # a later derivation gets another prefix


class MasterKey:
    def __init__(self, key: bytes, path: Path | None = None) -> None:
        """`path`: the key file it was read from (None: GATEWAY_VAULT_MASTER_KEY)."""
        if len(key) != KEY_BYTES:
            raise ValueError("the vault master key must be 32 bytes (base64-encoded)")
        self._key = key
        self.path = path
        self.key_id = hashlib.sha256(b"vault-master-key-id" + key).hexdigest()[:16]

    @classmethod
    def from_base64(cls, text: str, path: Path | None = None) -> MasterKey:
        try:
            return cls(base64.b64decode(text.strip(), validate=True), path)
        except (ValueError, TypeError) as exc:
            raise ValueError("the vault master key must be 32 bytes, base64-encoded") from exc

    @property
    def source(self) -> str:
        """Where the key came from, for messages (never the key)."""
        if self.path is None:
            return f"from {MASTER_KEY_ENV}"
        return f"in the key file {self.path} ({MASTER_KEY_ENV} not set)"

    def check_value(self) -> str:
        """What the database keeps to tell this key from another (see the module docstring)."""
        mac_key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_CHECK_LABEL).derive(
            self._key
        )
        return CHECK_PREFIX + hmac.new(mac_key, _CHECK_CONSTANT, hashlib.sha256).hexdigest()

    def opens(self, wrapped: bytes) -> bool:
        """Whether `wrapped` (a data key) was wrapped by this key (RFC 3394's integrity check)."""
        try:
            aes_key_unwrap(self._key, wrapped)
        except InvalidUnwrap:
            return False
        return True

    @staticmethod
    def generate_base64() -> str:
        return base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()

    def wrap(self, data_key: bytes) -> bytes:
        return aes_key_wrap(self._key, data_key)

    def unwrap(self, wrapped: bytes) -> bytes:
        return aes_key_unwrap(self._key, wrapped)


def load_master_key(data_dir: Path) -> MasterKey:
    """GATEWAY_VAULT_MASTER_KEY, else the key file of the embedded default (created once,
    readable by its owner only)."""
    configured = os.environ.get(MASTER_KEY_ENV)
    if configured:
        return MasterKey.from_base64(configured)
    path = data_dir / KEY_FILE
    if not path.exists():
        private_dir(path.parent)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        os.fchmod(fd, FILE_MODE)  # os.open's mode is masked by the umask
        with os.fdopen(fd, "w") as handle:
            handle.write(MasterKey.generate_base64() + "\n")
    return MasterKey.from_base64(private_file(path).read_text(), path.absolute())


def replace_key_file(data_dir: Path, key_base64: str) -> None:
    """Swap the embedded default's key file atomically (after a rotation)."""
    path = data_dir / KEY_FILE
    scratch = path.with_suffix(".new")
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    with os.fdopen(fd, "w") as handle:
        handle.write(key_base64 + "\n")
    os.replace(scratch, path)


def new_data_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def _associated(workspace_id: str, scope: str, name: str) -> bytes:
    return f"vault-secret|{workspace_id}|{scope}|{name}".encode()


def seal(
    data_key: bytes, workspace_id: str, scope: str, name: str, value: str
) -> tuple[bytes, bytes]:
    nonce = secrets.token_bytes(NONCE_BYTES)
    sealed = AESGCM(data_key).encrypt(nonce, value.encode(), _associated(workspace_id, scope, name))
    return sealed, nonce


def open_sealed(
    data_key: bytes, workspace_id: str, scope: str, name: str, ciphertext: bytes, nonce: bytes
) -> str:
    """Raises cryptography's InvalidTag when the ciphertext does not belong to this row."""
    plain = AESGCM(data_key).decrypt(nonce, ciphertext, _associated(workspace_id, scope, name))
    return plain.decode()


def fingerprint(data_key: bytes, value: str) -> str:
    mac_key = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=None, info=b"vault-fingerprint"
    ).derive(data_key)
    return hmac.new(mac_key, value.encode(), hashlib.sha256).hexdigest()
