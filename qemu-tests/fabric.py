#!/usr/bin/env python3
"""A simulated Azure fabric: the WireServer and IMDS, for trying azprov without Azure and for
its tests. Python standard library only, written independently of azprov's own XML and JSON
code.

  fabric.py --wireserver 168.63.129.16:80 --imds 169.254.169.254:80 --log fabric.jsonl \
            [--imds-doc doc.json] [--playbook faults.json] [--bump-after-goalstate N]

Behaves like Azure where azprov depends on it:
  * IMDS answers 400 without `Metadata: true` or with `X-Forwarded-For`, 400 without an
    api-version, and serves the instance document (all values strings) for /metadata/instance.
  * The WireServer serves /?comp=versions and the goal state (x-ms-version required); a health
    POST whose GoalStateIncarnation is not the current one gets 410 Gone. The incarnation moves
    on after the Nth goal state served (--bump-after-goalstate), as when boot diagnostics are
    toggled.
  * A playbook of faults per request: a JSON list of
      {"endpoint": "imds|goalstate|health|versions", "requests": [1, 2] or "*",
       "status": 503, "delay": 1.5, "body": "...", "truncate": 20, "drop": true}
    where requests counts that endpoint's requests from 1.
  * Every request is logged as one JSON line: time, server, method, path, headers, body,
    status, fault, and for health POSTs the parsed state, incarnation and description.
"""
import argparse
import json
import socket
import sys
import threading
import time
import xml.etree.ElementTree as ET
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

DEFAULT_DOC = {
    "compute": {
        "azEnvironment": "AzurePublicCloud",
        "customData": "",
        "location": "westeurope",
        "name": "azprov-demo",
        "osProfile": {"adminUsername": "azureuser", "computerName": "azprov-demo",
                      "disablePasswordAuthentication": "true"},
        "osType": "Linux",
        "publicKeys": [],
        "userData": "",
        "vmId": "5c2f4bd9-58a1-4a1e-9c3e-6f2d1e0b7a11",
        "vmSize": "Standard_B1s",
        "zone": "",
    },
    "network": {"interface": []},
    "extended": {"compute": {"hasCustomData": False, "ppsType": "None"}},
}

GOAL_STATE = """<?xml version="1.0" encoding="utf-8"?>
<GoalState xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xsi:noNamespaceSchemaLocation="goalstate10.xsd">
  <Version>2012-11-30</Version>
  <Incarnation>{inc}</Incarnation>
  <Machine>
    <ExpectedState>Started</ExpectedState>
    <StopRolesDeadlineHint>300000</StopRolesDeadlineHint>
    <LBProbePorts><Port>16001</Port></LBProbePorts>
    <ExpectHealthReport>FALSE</ExpectHealthReport>
  </Machine>
  <Container>
    <ContainerId>{container}</ContainerId>
    <RoleInstanceList>
      <RoleInstance>
        <InstanceId>{instance}</InstanceId>
        <State>Started</State>
      </RoleInstance>
    </RoleInstanceList>
  </Container>
</GoalState>
"""

VERSIONS = """<?xml version="1.0" encoding="utf-8"?>
<Versions><Preferred><Version>2015-04-05</Version></Preferred>
<Supported><Version>2015-04-05</Version><Version>2012-11-30</Version></Supported></Versions>
"""


class Fabric:
    def __init__(self, args):
        self.lock = threading.Lock()
        self.log = open(args.log, "a", buffering=1)
        self.doc = DEFAULT_DOC
        if args.imds_doc:
            with open(args.imds_doc) as f:
                self.doc = json.load(f)
        self.playbook = []
        if args.playbook:
            with open(args.playbook) as f:
                self.playbook = json.load(f)
        self.counts = {}
        self.incarnation = args.incarnation
        self.bump_after = args.bump_after_goalstate
        self.bump_always = args.bump_always
        self.container = args.container_id
        self.instance = args.instance_id

    def count(self, endpoint):
        with self.lock:
            self.counts[endpoint] = self.counts.get(endpoint, 0) + 1
            return self.counts[endpoint]

    def fault(self, endpoint, n):
        for rule in self.playbook:
            if rule.get("endpoint") != endpoint:
                continue
            req = rule.get("requests", "*")
            if req == "*" or n in req:
                return rule
        return None

    def record(self, entry):
        entry["t"] = round(time.time(), 3)
        with self.lock:
            self.log.write(json.dumps(entry, sort_keys=True) + "\n")


def make_handler(fabric, server_name):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # headers and body go out as separate writes: without TCP_NODELAY, Nagle and the
        # client's delayed ACK add 40 ms to every answer
        disable_nagle_algorithm = True

        def log_message(self, *a):
            pass

        def do_GET(self):
            self.handle_request(b"")

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            self.handle_request(self.rfile.read(length))

        def handle_request(self, body):
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            entry = {"server": server_name, "method": self.command, "path": self.path,
                     "headers": {k.lower(): v for k, v in self.headers.items()},
                     "body": body.decode("utf-8", "replace")}
            endpoint, status, payload, ctype = self.route(url, query, body, entry)
            n = fabric.count(endpoint)
            entry["endpoint"], entry["n"] = endpoint, n
            rule = fabric.fault(endpoint, n)
            if rule:
                entry["fault"] = rule
                if rule.get("delay"):
                    time.sleep(rule["delay"])
                if rule.get("drop"):
                    entry["status"] = None
                    fabric.record(entry)
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                if "status" in rule:
                    status = rule["status"]
                    payload = rule.get("body", "").encode()
                elif "body" in rule:
                    payload = rule["body"].encode()
            entry["status"] = status
            fabric.record(entry)
            full = len(payload)
            if rule and rule.get("truncate") is not None:
                payload = payload[: rule["truncate"]]
                self.close_connection = True
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(full))
            self.end_headers()
            self.wfile.write(payload)
            self.wfile.flush()

        def route(self, url, query, body, entry):
            if server_name == "imds":
                return self.imds(url, query)
            return self.wireserver(url, query, body, entry)

        def imds(self, url, query):
            h = self.headers
            if h.get("Metadata", "").lower() != "true" or "X-Forwarded-For" in h:
                return ("imds", 400, json.dumps({"error": "Bad request. Required metadata header not specified"}).encode(), "application/json")
            if "api-version" not in query:
                return ("imds", 400, json.dumps({"error": "Bad request. api-version was not specified in the request",
                                                 "newest-versions": ["2023-11-15"]}).encode(), "application/json")
            if url.path.rstrip("/") != "/metadata/instance":
                return ("imds", 404, b'{"error": "Not found"}', "application/json")
            doc = json.loads(json.dumps(fabric.doc))
            if query.get("extended") != ["true"]:
                doc.pop("extended", None)
            return ("imds", 200, json.dumps(doc).encode(), "application/json; charset=utf-8")

        def wireserver(self, url, query, body, entry):
            comp = query.get("comp", [""])[0]
            if comp == "versions":
                return ("versions", 200, VERSIONS.encode(), "text/xml; charset=utf-8")
            if self.headers.get("x-ms-version") is None:
                return ("unknown", 400, b"<Error><Code>MissingHeader</Code></Error>", "text/xml")
            if comp == "goalstate" and self.command == "GET":
                with fabric.lock:
                    served = fabric.counts.get("goalstate", 0) + 1
                    inc = fabric.incarnation
                    if fabric.bump_after and (served == fabric.bump_after or fabric.bump_always):
                        fabric.incarnation += 1
                entry["incarnation"] = inc
                xml = GOAL_STATE.format(inc=inc, container=fabric.container, instance=fabric.instance)
                return ("goalstate", 200, xml.encode(), "text/xml; charset=utf-8")
            if comp == "health" and self.command == "POST":
                try:
                    root = ET.fromstring(body)
                except ET.ParseError as e:
                    entry["error"] = str(e)
                    return ("health", 400, b"<Error><Code>InvalidXml</Code></Error>", "text/xml")
                inc = root.findtext("GoalStateIncarnation")
                entry["incarnation"] = inc
                entry["container_id"] = root.findtext("Container/ContainerId")
                entry["instance_id"] = root.findtext("Container/RoleInstanceList/Role/InstanceId")
                entry["state"] = root.findtext("Container/RoleInstanceList/Role/Health/State")
                entry["substatus"] = root.findtext("Container/RoleInstanceList/Role/Health/Details/SubStatus")
                entry["description"] = root.findtext("Container/RoleInstanceList/Role/Health/Details/Description")
                with fabric.lock:
                    current = str(fabric.incarnation)
                if inc != current:
                    return ("health", 410, b"", "text/xml")
                if entry["container_id"] != fabric.container or entry["instance_id"] != fabric.instance:
                    return ("health", 400, b"<Error><Code>InvalidContainerConfiguration</Code></Error>", "text/xml")
                return ("health", 200, b"", "text/xml")
            return ("unknown", 404, b"", "text/plain")

    return Handler


def parse_addr(s):
    host, _, port = s.rpartition(":")
    return host, int(port)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # a client that gives up on a stalled or dropped exchange resets the connection: that is
        # the scenario, not an error of the fabric's
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wireserver", default="168.63.129.16:80")
    p.add_argument("--imds", default="169.254.169.254:80")
    p.add_argument("--log", required=True)
    p.add_argument("--imds-doc")
    p.add_argument("--playbook")
    p.add_argument("--incarnation", type=int, default=1)
    p.add_argument("--bump-after-goalstate", type=int, default=0)
    p.add_argument("--bump-always", action="store_true", help="with --bump-after-goalstate 1: a new incarnation after every goal state")
    p.add_argument("--container-id", default="a511aa6d-29e7-4f53-8788-55655dfe848f")
    p.add_argument("--instance-id", default="f6cd1d7ef1644557b9059345e5ba890c.azprov-test")
    args = p.parse_args()
    fabric = Fabric(args)
    servers = []
    for name, addr in (("wireserver", args.wireserver), ("imds", args.imds)):
        srv = Server(parse_addr(addr), make_handler(fabric, name))
        servers.append(srv)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    print("fabric ready", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
