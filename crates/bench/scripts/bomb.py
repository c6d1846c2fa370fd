#!/usr/bin/env python3
# A deflate bomb against a relay (docs/benchmarks.md#bytes-on-the-wire): one permessage-deflate
# frame of about 100 KB inflating to 100 MB of zeros. Prints the 101 answer and what the relay
# sent back (a NOTICE and close 1009 expected). Read the relay's VmHWM around it.
#   crates/bench/scripts/bomb.py PORT
import socket, os, base64, struct, zlib, sys
port=int(sys.argv[1])
s=socket.create_connection(("127.0.0.1",port))
key=base64.b64encode(os.urandom(16)).decode()
s.sendall(f"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Extensions: permessage-deflate\r\n\r\n".encode())
head=b""
while b"\r\n\r\n" not in head: head+=s.recv(4096)
print(head.split(b"\r\n")[0].decode(), [l for l in head.decode().split("\r\n") if "extensions" in l.lower()])
c=zlib.compressobj(9, zlib.DEFLATED, -15)
z=c.compress(b"\0"*(100<<20))+c.flush(zlib.Z_SYNC_FLUSH)
z=z[:-4]
m=os.urandom(4); n=len(z)
hdr=bytes([0xC1]) + (bytes([0x80|n]) if n<126 else bytes([0xfe])+struct.pack(">H",n) if n<65536 else bytes([0xff])+struct.pack(">Q",n))
s.sendall(hdr+m+bytes(x^m[i%4] for i,x in enumerate(z)))
print("sent frame of", n, "bytes inflating to", 100<<20)
data=b""
s.settimeout(10)
try:
    while True:
        d=s.recv(65536)
        if not d: break
        data+=d
except Exception as e: print("recv:", e)
# find close frame
i=0; got=[]
while i+2<=len(data):
    b0,b1=data[i],data[i+1]; ln=b1&0x7f; h=2
    if ln==126: ln=struct.unpack(">H",data[i+2:i+4])[0]; h=4
    payload=data[i+h:i+h+ln]; i+=h+ln
    got.append((b0&0x0f, payload[:2] if b0&0x0f==8 else payload[:60]))
print([(op, struct.unpack(">H",p)[0] if op==8 else p) for op,p in got])
