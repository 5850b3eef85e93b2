#!/usr/bin/env python3
"""A scripted DHCPv4 server for fault tests (standard library only, independent of azprov).

It answers DISCOVER with OFFER and REQUEST with ACK, optionally after a delay, and can NAK the
first REQUEST. Every message it receives and sends is logged as a JSON line."""
import argparse, json, socket, struct, time

p = argparse.ArgumentParser()
p.add_argument("--iface", required=True)
p.add_argument("--server-ip", required=True)
p.add_argument("--offer-ip", required=True)
p.add_argument("--router", required=True)
p.add_argument("--delay", type=float, default=0.0)
p.add_argument("--nak-first", action="store_true")
p.add_argument("--nak-always", action="store_true")
p.add_argument("--log", required=True)
a = p.parse_args()

def ip(s):
    return socket.inet_aton(s)

def options(data):
    out, i = {}, 240
    while i < len(data):
        c = data[i]
        if c == 255:
            break
        if c == 0:
            i += 1
            continue
        ln = data[i + 1]
        out[c] = data[i + 2:i + 2 + ln]
        i += 2 + ln
    return out

def reply(req, kind):
    hdr = bytearray(240)
    hdr[0], hdr[1], hdr[2] = 2, 1, 6
    hdr[4:8] = req[4:8]
    if kind != 6:
        hdr[16:20] = ip(a.offer_ip)
    hdr[28:44] = req[28:44]
    hdr[236:240] = bytes([99, 130, 83, 99])
    opts = bytes([53, 1, kind, 54, 4]) + ip(a.server_ip)
    if kind != 6:
        opts += bytes([51, 4]) + struct.pack("!I", 3600)
        opts += bytes([1, 4]) + ip("255.255.255.0") + bytes([3, 4]) + ip(a.router)
    return bytes(hdr) + opts + b"\xff"

log = open(a.log, "a", buffering=1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, a.iface.encode())
s.bind(("0.0.0.0", 67))
print("ready", flush=True)
requests = 0
while True:
    data, _ = s.recvfrom(2048)
    o = options(data)
    kind = o.get(53, b"\0")[0]
    sid = o.get(54)
    log.write(json.dumps({"got": kind, "xid": data[4:8].hex(), "server_id": sid and socket.inet_ntoa(sid),
                          "hostname": o.get(12, b"").decode(errors="replace")}) + "\n")
    if kind == 1:
        answer = 2
    elif kind == 3:
        if sid is not None and socket.inet_ntoa(sid) != a.server_ip:
            continue  # a REQUEST for another server's offer
        requests += 1
        answer = 6 if a.nak_always or (a.nak_first and requests == 1) else 5
    else:
        continue
    time.sleep(a.delay)
    s.sendto(reply(data, answer), ("255.255.255.255", 68))
    log.write(json.dumps({"sent": answer}) + "\n")
