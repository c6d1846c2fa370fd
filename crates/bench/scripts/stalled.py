#!/usr/bin/env python3
# Slow-loris probe (issue 12): 1,100 TCP connections that send half a WebSocket upgrade and
# then nothing, from ADDRESSES loopback source addresses (default 1: 127.0.0.7; more: 127.0.X.Y),
# then a new client from 127.0.0.8 (time to handshake + REQ -> EOSE), /healthz from 127.0.0.9,
# and how long until the relay has closed every stalled socket.
#   python3 crates/bench/scripts/stalled.py HOST PORT [ADDRESSES]
# Run the relay under `prlimit --nofile=1024` to reproduce docs/operating.md "Socket limits".
import socket, time, sys, base64, os, json
host, port = sys.argv[1], int(sys.argv[2])
addresses = int(sys.argv[3]) if len(sys.argv) > 3 else 1
def source(i):
    if addresses <= 1:
        return "127.0.0.7"
    n = i % addresses
    return f"127.0.{1 + n // 250}.{1 + n % 250}"
stalled = []
t0 = time.time()
for i in range(1100):
    s = socket.socket(); s.bind((source(i), 0))
    try:
        s.connect((host, port)); s.send(b"GET / HTTP/1.1\r\nHost: relay\r\nUpgrade: websocket\r\n")
    except OSError as e:
        print("stalled connect", i, "failed:", e); break
    stalled.append(s)
print(f"opened {len(stalled)} stalled sockets in {time.time()-t0:.2f}s")
def fresh_client():
    t = time.time()
    s = socket.socket(); s.bind(("127.0.0.8", 0)); s.settimeout(10)
    s.connect((host, port))
    key = base64.b64encode(os.urandom(16)).decode()
    s.send(f"GET / HTTP/1.1\r\nHost: relay\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head: head += s.recv(4096)
    assert b" 101 " in head.split(b"\r\n")[0], head
    payload = json.dumps(["REQ", "x", {"limit": 1}]).encode()
    mask = os.urandom(4)
    frame = bytes([0x81, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    s.send(frame)
    buf = b""
    while b"EOSE" not in buf: buf += s.recv(65536)
    s.close()
    return time.time() - t
print(f"new client from another address: handshake + REQ -> EOSE in {fresh_client()*1000:.1f} ms")
def healthz():
    t = time.time()
    s = socket.socket(); s.bind(("127.0.0.9", 0)); s.settimeout(10)
    s.connect((host, port)); s.send(b"GET /healthz HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n")
    buf = b""
    while True:
        d = s.recv(4096)
        if not d: break
        buf += d
    assert b" 200 " in buf.split(b"\r\n")[0], buf
    return time.time() - t
print(f"/healthz from a third address: 200 in {healthz()*1000:.1f} ms")
# how long until the relay has closed every stalled socket
t1 = time.time()
open_ = list(stalled)
while open_ and time.time() - t1 < 30:
    still = []
    for s in open_:
        s.setblocking(False)
        try:
            d = s.recv(1)
            if d == b"": s.close(); continue
            still.append(s)
        except BlockingIOError: still.append(s)
        except OSError: s.close()
    open_ = still
    time.sleep(0.1)
print(f"stalled sockets still open after {time.time()-t1:.1f}s: {len(open_)}")
