"""A run's checkpoint key: what makes a manifest one that a writer of the bucket cannot forge.

A checkpoint's manifest lists the SHA-256 of every file, and a resume loads only bytes that match
it, pickled ones included (optimizer and RNG state, sharded metadata). Without a key that only
proves the bytes match whatever manifest the bucket holds: anyone who can write the bucket (another
tenant given the same credentials) can write both, and run code in the run's workers when they
unpickle. With a key, every manifest (and every node's part record of a checkpoint several nodes
save) carries an HMAC-SHA256 over its content, and a reader holding the same key skips one whose
HMAC is missing or wrong, as it skips a corrupt one.

The key reaches processes as the environment variable ``SPOTRAY_CHECKPOINT_KEY``: on Kubernetes
from a Secret the controller makes for each run (controller/checkpoint_key_secret.py) and deletes with it;
elsewhere from whoever starts the job. Every process that has it signs what it writes and checks
what it reads; ``spotray pull`` checks when it is set in the shell and says so when it is not.

The HMAC covers the canonical JSON of every other field (keys sorted, no spaces), under a purpose
string, so a manifest's HMAC is never valid as a part record's and the reverse.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spotray.contract.errors import SpotrayError

CHECKPOINT_KEY_ENV = "SPOTRAY_CHECKPOINT_KEY"
# The field of a signed object that holds its HMAC (hex); absent from an unsigned one.
SIGNATURE_FIELD = "hmac_sha256"
# 32 bytes as hex: what the controller makes. Shorter keys are refused, not padded.
MIN_KEY_CHARS = 32


@dataclass(frozen=True)
class CheckpointKey:
    """The secret shared by every process of one run; never in a repr, a log line or an object."""

    secret: bytes = field(repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> CheckpointKey | None:
        """The key in ``SPOTRAY_CHECKPOINT_KEY``, or None when it is unset or empty (nothing signed or checked)."""
        value = environ.get(CHECKPOINT_KEY_ENV, "").strip()
        if not value:
            return None
        if len(value) < MIN_KEY_CHARS:
            raise SpotrayError(
                f"{CHECKPOINT_KEY_ENV} holds {len(value)} characters, "
                f"fewer than the {MIN_KEY_CHARS} a checkpoint key needs",
                f"set it to a random value of at least {MIN_KEY_CHARS} characters (`openssl rand -hex 32`), "
                "or unset it to neither sign nor check checkpoints",
            )
        return cls(value.encode())

    def sign(self, purpose: str, fields: Mapping[str, Any]) -> dict[str, Any]:
        """``fields`` with their HMAC added (any HMAC they held is replaced)."""
        content = {k: v for k, v in fields.items() if k != SIGNATURE_FIELD}
        return {**content, SIGNATURE_FIELD: self._mac(purpose, content)}

    def problem(self, purpose: str, signed: Mapping[str, Any]) -> str | None:
        """Why ``signed`` (as parsed from the store) was not written with this key, or None when it was."""
        claimed = signed.get(SIGNATURE_FIELD)
        if claimed is None:
            return "is not signed, and this run signs every checkpoint (a writer without the run's key wrote it)"
        content = {k: v for k, v in signed.items() if k != SIGNATURE_FIELD}
        if not isinstance(claimed, str) or not hmac.compare_digest(claimed, self._mac(purpose, content)):
            return "has a signature that does not match the run's key (a writer without the key wrote or changed it)"
        return None

    def _mac(self, purpose: str, content: Mapping[str, Any]) -> str:
        canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hmac.new(self.secret, f"spotray {purpose}\n{canonical}".encode(), hashlib.sha256).hexdigest()
