"""Signed commands to the parameter servers: a per-job secret and an HMAC checked before
anything is unpickled.

MXNet's server loop unpickles every command body a peer sends to a server's port, so anyone
who can reach that port runs code there. kvhybrid's servers (``ps.node``) run a controller of
their own that accepts a body only in the envelope ``sign`` makes:

    kvh1 <unix time> <nonce> <hmac-sha256 hex> <base64 of the pickle>

The tag covers everything before it and the payload; a server refuses a body without a
valid tag, one older than ``MAX_AGE`` seconds, and a nonce it has seen (a replayed
command), logging one line, and goes on serving. The secret comes from ``KVHYBRID_SECRET``
(or the file ``KVHYBRID_SECRET_FILE`` names); ``kvhybrid-launch`` makes one per job.
Pure Python, no MXNet: the launcher and the server entry point import it before MXNet.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
import pickle
import secrets
import time
from typing import Dict, Optional

SECRET_VAR = "KVHYBRID_SECRET"
SECRET_FILE_VAR = "KVHYBRID_SECRET_FILE"
PREFIX = "kvh1"
#: MXNet's server command ids (kvstore.py, _get_kvstore_server_command_type): a Python
#: controller call (the body is a pickle: the one kind signed), and multi-precision
CONTROLLER, SET_MULTI_PRECISION = 0, 1
#: seconds a signed command stays acceptable (clocks of a cluster agree far better)
MAX_AGE = 600.0


class AuthError(RuntimeError):
    """A secret that is missing or unusable, or a command that is not signed with it."""


def new_secret() -> str:
    """A fresh per-job secret (64 hex digits)."""
    return secrets.token_hex(32)


def job_secret(env: Optional[Dict[str, str]] = None) -> bytes:
    """This process's job secret: ``KVHYBRID_SECRET``, else the first line of the file
    ``KVHYBRID_SECRET_FILE`` names."""
    env = os.environ if env is None else env
    value = env.get(SECRET_VAR)
    if not value and env.get(SECRET_FILE_VAR):
        path = env[SECRET_FILE_VAR]
        try:
            with open(path) as f:
                value = f.readline().strip()
        except OSError as exc:
            raise AuthError(f"{SECRET_FILE_VAR}={path}: cannot read it ({exc.strerror}): "
                            "write the job's secret there, readable by this user") from None
    if not value:
        raise AuthError(f"{SECRET_VAR} is not set: every process of a job with parameter "
                        "servers needs the same secret (kvhybrid-launch makes one; by hand: "
                        f"export {SECRET_VAR}=$(python3 -c 'import secrets; "
                        "print(secrets.token_hex(32))') before starting every process)")
    if len(value) < 16:
        raise AuthError(f"{SECRET_VAR} is {len(value)} characters long: use at least 16 "
                        "(e.g. secrets.token_hex(32))")
    return value.encode()


def _tag(secret: bytes, head: str, payload: str) -> str:
    return hmac.new(secret, f"{head} {payload}".encode(), hashlib.sha256).hexdigest()


def sign(obj, secret: bytes) -> str:
    """The command body a kvhybrid server accepts for ``obj`` (ASCII: ps-lite hands a server
    the body as a C string)."""
    return sign_pickle(pickle.dumps(obj, protocol=4), secret)


def is_signed(body: str) -> bool:
    return body.startswith(PREFIX + " ")


def sign_pickle(data: bytes, secret: bytes) -> str:
    """``sign`` for an object already pickled (MXNet's own ``set_optimizer`` pickles)."""
    payload = base64.b64encode(data).decode("ascii")
    head = f"{PREFIX} {time.time():.3f} {secrets.token_hex(8)}"
    return f"{head} {_tag(secret, head, payload)} {payload}"


class Verifier:
    """A server's check of incoming command bodies: ``load`` returns the unpickled object
    of a valid body and raises ``AuthError`` (saying why) for any other, unpickling nothing."""

    def __init__(self, secret: bytes, max_age: float = MAX_AGE):
        self.secret = secret
        self.max_age = max_age
        self._seen: Dict[str, float] = {}   # nonce -> its time, for max_age

    def check(self, body: bytes) -> str:
        """The payload of a valid body."""
        text = body.decode("ascii", errors="replace")
        parts = text.split(" ", 4)
        if len(parts) != 5 or parts[0] != PREFIX:
            raise AuthError(f"an unsigned command ({len(body)} bytes, starting "
                            f"{text[:12]!r}): not from a kvhybrid worker of this job")
        _, stamp, nonce, tag, payload = parts
        head = " ".join(parts[:3])
        if not hmac.compare_digest(tag, _tag(self.secret, head, payload)):
            raise AuthError("a command signed with another secret: its sender's "
                            f"{SECRET_VAR} differs from this server's")
        try:
            age = time.time() - float(stamp)
        except ValueError:
            raise AuthError(f"a command with a malformed time {stamp!r}") from None
        if abs(age) > self.max_age:
            raise AuthError(f"a command signed {age:.0f} s ago (more than {self.max_age:.0f} s "
                            "apart: a replay, or clocks that disagree)")
        if nonce in self._seen:
            raise AuthError(f"a command seen before (nonce {nonce}): a replay")
        now = time.time()
        self._seen = {n: t for n, t in self._seen.items() if now - t <= self.max_age}
        self._seen[nonce] = now
        return payload

    def load(self, body: bytes):
        return pickle.loads(base64.b64decode(self.check(body)))
