"""A login endpoint guarded by tollgate, with only the standard library:
check before the (slow) password verify, report after, through the guard;
401 for a wrong password, 429 with Retry-After for every refusal.

    python3 example/login_server.py --socket /run/tollgate/tollgate.sock --port 8080
    curl -d 'account=alice&password=wonderland' http://127.0.0.1:8080/login
"""

import argparse
import hashlib
import hmac
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional
from urllib.parse import parse_qs

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from tollgate_client import Client, ClientConfig, Subject  # noqa: E402

REFUSED_BODY = b'{"error":"too many attempts, try again later"}'
FAILED_BODY = b'{"error":"invalid account or password"}'
BAD_REQUEST_BODY = b'{"error":"bad request"}'
PBKDF2_ROUNDS = 200_000


def hash_password(password: str, salt: bytes) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", password.encode(), salt, PBKDF2_ROUNDS)


class LoginHandler(BaseHTTPRequestHandler):
    limiter: Client
    users: dict  # account -> (salt, hash)
    dummy: tuple  # an unknown account costs the same verify as a known one

    def do_POST(self) -> None:
        if self.path != "/login":
            return self.reply(404, b'{"error":"not found"}')
        length = int(self.headers.get("Content-Length") or 0)
        fields = parse_qs(self.rfile.read(length).decode("utf-8", "replace"))
        account, password = fields.get("account", [None])[0], fields.get("password", [None])[0]
        if account is None or password is None:
            return self.reply(400, BAD_REQUEST_BODY)
        forwarded = self.headers.get_all("X-Forwarded-For")
        subject = Subject(
            peer=self.client_address[0],
            forwarded_for=", ".join(forwarded) if forwarded else None,
            account=account,
        )
        # Leaving the block without a report (an exception, a dropped
        # connection) gives the attempt's place back.
        with self.limiter.attempt("login", subject, password=password) as attempt:
            if not attempt.proceeds:
                # One answer for every refusal; the reason is for the logs only.
                self.log_message("login refused: %r", attempt.answer)
                return self.reply(429, REFUSED_BODY, {"Retry-After": str(attempt.retry_after_secs)})
            if attempt.delay:
                time.sleep(attempt.delay)
            salt, stored = self.users.get(account, self.dummy)
            ok = hmac.compare_digest(hash_password(password, salt), stored) and account in self.users
            attempt.report(ok)
        if not ok:
            return self.reply(401, FAILED_BODY)
        return self.reply(200, b'{"status":"ok"}')

    def reply(self, status: int, body: bytes, headers: Optional[dict] = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", default="/run/tollgate/tollgate.sock")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--user", action="append", default=["alice:wonderland"], help="account:password")
    args = parser.parse_args()
    users = {}
    for entry in args.user:
        account, _, password = entry.partition(":")
        salt = os.urandom(16)
        users[account] = (salt, hash_password(password, salt))
    salt = os.urandom(16)
    LoginHandler.dummy = (salt, hash_password(os.urandom(16).hex(), salt))
    LoginHandler.users = users
    # The key only this server holds: the daemon sees digests, never passwords.
    # Keep it stable (restarts, every process sharing the daemon): load it.
    key_hex = os.environ.get("TOLLGATE_PASSWORD_KEY")  # 64 hex digits
    if key_hex is None:
        print("TOLLGATE_PASSWORD_KEY unset: a throwaway key, for this demo only", file=sys.stderr)
    key = bytes.fromhex(key_hex) if key_hex is not None else os.urandom(32)
    LoginHandler.limiter = Client(ClientConfig(args.socket, password_key=key))
    server = ThreadingHTTPServer(("127.0.0.1", args.port), LoginHandler)
    print("listening on http://127.0.0.1:{}/login".format(args.port), file=sys.stderr)
    server.serve_forever()


if __name__ == "__main__":
    main()
