"""A stand-in node process for backend tests: listens on HOST:PORT... and accepts (then closes) connections.

`python -m clusters.deploy.placeholder 10.213.0.21:3181`; exits on SIGTERM.
"""
from __future__ import annotations

import selectors
import signal
import socket
import sys


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sel = selectors.DefaultSelector()
    for addr in argv:
        host, _, port = addr.rpartition(":")
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, int(port)))
        s.listen(64)
        sel.register(s, selectors.EVENT_READ)
        print(f"placeholder listening on {addr}", flush=True)
    while True:
        for key, _ in sel.select():
            conn, _ = key.fileobj.accept()
            conn.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
