#!/usr/bin/env python3
"""A simulated Azure fabric: the WireServer and IMDS, for trying azprov without Azure and for
its tests. Python standard library only, written independently of azprov's own XML and JSON
code.

  fabric.py --wireserver 168.63.129.16:80 --imds 169.254.169.254:80 --log fabric.jsonl \
            [--imds-doc doc.json] [--playbook faults.json] [--bump-after-goalstate N]

Behaves like Azure where azprov, cloud-init and waagent depend on it:
  * IMDS answers 400 without `Metadata: true` or with `X-Forwarded-For`, 400 without an
    api-version or with one Azure does not know (with the newest versions, as Azure lists
    them), and serves the instance document (all values strings) for /metadata/instance and
    any path below it (`format=text` for a leaf), without the fields the asked api-version
    does not have yet (osProfile before 2020-07-15, userData before 2021-01-01, ...);
    /metadata/versions; /metadata/reprovisiondata (404 unless the VM is pre-provisioned).
  * The WireServer serves /?comp=versions and the goal state (x-ms-version required) with its
    <Configuration> URLs (HostingEnvironmentConfig, SharedConfig, ExtensionsConfig,
    FullConfig), each of which answers; azure-init's JSON /provisioning/health and waagent's
    /HealthService observations are taken; the HostGAPlugin (port 32526) answers /versions and
    /health, takes status PUTs and has no FastTrack (/vmSettings 404); a health POST whose GoalStateIncarnation is not the
    current one gets 410 Gone. The incarnation moves on after the Nth goal state served
    (--bump-after-goalstate), as when boot diagnostics are toggled. Telemetry POSTs get 200.
  * A playbook of faults per request: a JSON list of
      {"endpoint": "imds|goalstate|health|versions", "requests": [1, 2] or "*",
       "status": 503, "delay": 1.5, "body": "...", "truncate": 20, "drop": true}
    where requests counts that endpoint's requests from 1.
  * The Metadata Security Protocol as the Guest Proxy Agent meets it (--msp): GET
    /secure-channel/status (Metadata: True) says WireserverAndImds, POST /secure-channel/key
    latches the VM's key (--msp-refuse-key: 403 instead); without --msp the state is Disabled
    and no key is handed out. Every logged request says whether the key was latched when it
    came (`msp_key`), so a test can tell what was asked before the agent held it.
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
        <State>Started</State>{configuration}
      </RoleInstance>
    </RoleInstanceList>
  </Container>
</GoalState>
"""

# The IMDS api-versions Azure answers (instance-metadata-service.md, "Supported API versions");
# any other gets 400 and this list's newest.
IMDS_VERSIONS = [
    "2017-03-01", "2017-04-02", "2017-08-01", "2017-10-01", "2017-12-01", "2018-02-01", "2018-04-02",
    "2018-10-01", "2019-02-01", "2019-03-11", "2019-04-30", "2019-06-01", "2019-06-04", "2019-08-01",
    "2019-08-15", "2019-11-01", "2020-06-01", "2020-07-15", "2020-09-01", "2020-10-01", "2020-12-01",
    "2021-01-01", "2021-02-01", "2021-03-01", "2021-05-01", "2021-08-01", "2021-10-01", "2021-11-01",
    "2021-11-15", "2021-12-13", "2022-02-01", "2022-03-01", "2022-07-01", "2022-08-01", "2022-11-15",
    "2023-07-01", "2023-11-15", "2024-03-15", "2024-07-17", "2025-04-07",
]
# compute fields and the api-version that introduced them: an older version's document lacks them
IMDS_FIELD_SINCE = {"publicKeys": "2018-04-02", "osProfile": "2020-07-15", "userData": "2021-01-01"}
IMDS_OSPROFILE_SINCE = {"disablePasswordAuthentication": "2020-10-01"}

# The goal state's <Configuration>: one URL per document, all on the WireServer itself.
CONFIGURATION = """
        <Configuration>
          <HostingEnvironmentConfig>{base}?comp=config&amp;type=hostingEnvironmentConfig&amp;incarnation={inc}</HostingEnvironmentConfig>
          <SharedConfig>{base}?comp=config&amp;type=sharedConfig&amp;incarnation={inc}</SharedConfig>
          <ExtensionsConfig>{base}?comp=config&amp;type=extensionsConfig&amp;incarnation={inc}</ExtensionsConfig>
          <FullConfig>{base}?comp=config&amp;type=fullConfig&amp;incarnation={inc}</FullConfig>
          <ConfigName>{instance}.{inc}.xml</ConfigName>
        </Configuration>"""

HOSTING_ENVIRONMENT = """<?xml version="1.0" encoding="utf-8"?>
<HostingEnvironmentConfig version="1.0.0.0" goalStateIncarnation="{inc}">
  <StoredCertificates />
  <Deployment name="{container}" guid="{{{container}}}" incarnation="{inc}" isNonCancellableTopologyChangeEnabled="false">
    <Service name="{role}" guid="{{00000000-0000-0000-0000-000000000000}}" />
    <ServiceInstance name="{container}.0" guid="{{{container}}}" />
  </Deployment>
  <Incarnation number="{inc}" instance="{instance}" guid="{{{container}}}" />
  <Role guid="{{{container}}}" name="{role}" hostingEnvironmentVersion="1" software="" softwareType="ApplicationPackage" entryPoint="" parameters="" settleTimeSeconds="10" />
  <HostingEnvironmentSettings name="full" Runtime="rd_fabric_stable.110217-1402.RuntimePackage_1.0.0.8.zip">
    <CAS mode="full" />
    <PrivilegeLevel mode="max" />
    <AdditionalProperties><CgiHandlers></CgiHandlers></AdditionalProperties>
  </HostingEnvironmentSettings>
  <ApplicationSettings>
    <Setting name="__ModelData" value="" />
  </ApplicationSettings>
  <ResourceReferences>
    <Resource name="DiagnosticStore" type="directory" request="Microsoft.Cis.Fabric.Controller.Descriptions.ServiceDescription.Data.Policy" sticky="true" size="1" path="{instance}.DiagnosticStore" disableQuota="false" />
  </ResourceReferences>
</HostingEnvironmentConfig>
"""

SHARED_CONFIG = """<?xml version="1.0" encoding="utf-8"?>
<SharedConfig version="1.0.0.0" goalStateIncarnation="{inc}">
  <Deployment name="{container}" guid="{{{container}}}" incarnation="{inc}" isNonCancellableTopologyChangeEnabled="false">
    <Service name="{role}" guid="{{00000000-0000-0000-0000-000000000000}}" />
    <ServiceInstance name="{container}.0" guid="{{{container}}}" />
  </Deployment>
  <Incarnation number="{inc}" instance="{instance}" guid="{{{container}}}" />
  <Role guid="{{{container}}}" name="{role}" settleTimeSeconds="10" />
  <LoadBalancerSettings timeoutSeconds="0" waitLoadBalancerProbeCount="8">
    <Probes>
      <Probe name="D41D8CD98F00B204E9800998ECF8427E" />
      <Probe name="C9DEC1518E1158748FA4B6081A8266DD" />
    </Probes>
  </LoadBalancerSettings>
  <OutputEndpoints>
    <Endpoint name="{role}:openInternalEndpoint" type="SFS">
      <Target instance="{role}" endpoint="openInternalEndpoint" />
    </Endpoint>
  </OutputEndpoints>
  <Instances>
    <Instance id="{role}" address="{address}">
      <FaultDomains randomId="0" updateId="0" updateCount="0" />
      <InputEndpoints>
        <Endpoint name="openInternalEndpoint" address="{address}" protocol="any" isPublic="false" enableDirectServerReturn="false" isDirectAddress="false" disableStealthMode="false">
          <LocalPorts><LocalPortSelfManaged /></LocalPorts>
        </Endpoint>
      </InputEndpoints>
    </Instance>
  </Instances>
</SharedConfig>
"""

# No extensions and no status blob: what a VM created without extensions is given.
EXTENSIONS_CONFIG = """<?xml version="1.0" encoding="utf-8"?>
<Extensions version="1.0.0.0" goalStateIncarnation="{inc}"><GuestAgentExtension xmlns:i="http://www.w3.org/2001/XMLSchema-instance">
  <GAFamilies>
    <GAFamily>
      <Name>Prod</Name>
      <Uris />
    </GAFamily>
  </GAFamilies>
</GuestAgentExtension>
<StatusUploadBlob statusBlobType="BlockBlob"></StatusUploadBlob>
<InVMGoalStateMetaData inSvdSeqNo="0" createdOnTicks="0" activityId="{container}" correlationId="{container}" />
</Extensions>
"""

FULL_CONFIG = """<?xml version="1.0" encoding="utf-8"?>
<RoleInstance xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xsi:noNamespaceSchemaLocation="RoleInstance.xsd">
  <Incarnation>{inc}</Incarnation>
  <Role name="{role}" />
  <InstanceId>{instance}</InstanceId>
  <ContainerId>{container}</ContainerId>
</RoleInstance>
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
        self.vm_address = args.vm_address
        self.msp = args.msp
        self.msp_refuse_key = args.msp_refuse_key
        # when the Guest Proxy Agent latched the key (None: not yet)
        self.key_latched_at = None
        self.reprovision_ovf = None
        if args.reprovision_ovf:
            with open(args.reprovision_ovf, "rb") as f:
                self.reprovision_ovf = f.read()

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


def imds_document(doc, version, extended):
    """The instance document as IMDS serves it for `version`: without the fields that version
    does not have yet, and `extended` only when asked for."""
    doc = json.loads(json.dumps(doc))
    if not extended:
        doc.pop("extended", None)
    compute = doc.get("compute", {})
    for field, since in IMDS_FIELD_SINCE.items():
        if version < since:
            compute.pop(field, None)
    for field, since in IMDS_OSPROFILE_SINCE.items():
        if version < since and isinstance(compute.get("osProfile"), dict):
            compute["osProfile"].pop(field, None)
    return doc


class Handler(BaseHTTPRequestHandler):
    """One request to the WireServer, IMDS or the HostGAPlugin (`self.server.name`), answered
    from the shared Fabric (`self.server.fabric`) and logged."""
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
        entry = {"server": self.server.name, "method": self.command, "path": self.path,
                 "headers": {k.lower(): v for k, v in self.headers.items()},
                 "body": body.decode("utf-8", "replace"), "msp_key": self.fabric.key_latched_at is not None}
        endpoint, status, payload, ctype = self.route(url, query, body, entry)
        n = self.fabric.count(endpoint)
        entry["endpoint"], entry["n"] = endpoint, n
        rule = self.fabric.fault(endpoint, n)
        if rule:
            entry["fault"] = rule
            if rule.get("delay"):
                time.sleep(rule["delay"])
            if rule.get("drop"):
                entry["status"] = None
                self.fabric.record(entry)
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
        self.fabric.record(entry)
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
        if self.server.name == "imds":
            return self.imds(url, query)
        if self.server.name == "hostgaplugin":
            return self.hostgaplugin(url)
        return self.wireserver(url, query, body, entry)

    def imds(self, url, query):
        h = self.headers
        bad = lambda msg, **more: ("imds", 400, json.dumps({"error": msg, **more}).encode(), "application/json")
        if h.get("Metadata", "").lower() != "true" or "X-Forwarded-For" in h:
            return bad("Bad request. Required metadata header not specified")
        path = url.path.rstrip("/")
        if path == "/metadata/versions":
            return ("imds", 200, json.dumps({"apiVersions": IMDS_VERSIONS}).encode(), "application/json")
        version = query.get("api-version", [""])[0]
        if version not in IMDS_VERSIONS:
            what = "was not specified" if not version else "is invalid"
            return bad(f"Bad request. api-version {what} in the request. For more information refer to "
                       "aka.ms/azureimds", **{"newest-versions": IMDS_VERSIONS[:-4:-1]})
        if path == "/metadata/reprovisiondata":
            return self.reprovisiondata()
        if path != "/metadata/instance" and not path.startswith("/metadata/instance/"):
            return ("imds", 404, b'{"error": "Not found"}', "application/json")
        doc = imds_document(self.fabric.doc, version, query.get("extended") == ["true"])
        node = doc
        for part in [p for p in path[len("/metadata/instance"):].split("/") if p]:
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return ("imds", 404, b'{"error": "Not found"}', "application/json")
        if query.get("format") == ["text"]:
            if isinstance(node, (dict, list)):
                # a node's text is its children's names, one per line, as Azure lists them
                names = [f"{k}/" if isinstance(v, (dict, list)) else k for k, v in node.items()] \
                    if isinstance(node, dict) else [f"{i}/" for i in range(len(node))]
                return ("imds", 200, "\n".join(names).encode(), "text/plain; charset=utf-8")
            text = node if isinstance(node, str) else json.dumps(node)
            return ("imds", 200, text.encode(), "text/plain; charset=utf-8")
        return ("imds", 200, json.dumps(node).encode(), "application/json; charset=utf-8")

    def hostgaplugin(self, url):
        # a HostGAPlugin without FastTrack: /vmSettings is 404, which waagent takes as "use
        # the WireServer's ExtensionsConfig" (a refused connection makes waagent 2.7.3 on
        # Python 3.11 fail the whole goal state)
        path = url.path.rstrip("/")
        if path == "/versions" and self.command == "GET":
            return ("hgap", 200, json.dumps(["2015-09-01", "2012-11-30"]).encode(), "application/json")
        if path == "/health" and self.command == "GET":
            return ("hgap", 200, b"", "text/plain")
        if path in ("/status", "/vmAgentLog") and self.command == "PUT":
            return ("hgap", 200, b"", "text/plain")
        return ("hgap", 404, b"", "text/plain")

    def do_PUT(self):
        self.do_POST()

    def reprovisiondata(self):
        # only a pre-provisioned VM (ppsType other than None) is handed its real OVF here
        pps = self.fabric.doc.get("extended", {}).get("compute", {}).get("ppsType", "None")
        if pps == "None" or not self.fabric.reprovision_ovf:
            return ("reprovisiondata", 404, b'{"error": "Not found"}', "application/json")
        return ("reprovisiondata", 200, self.fabric.reprovision_ovf, "text/xml; charset=utf-8")

    def secure_channel(self, url, body):
        # what the Guest Proxy Agent asks, unsigned, with Metadata: True
        if self.headers.get("Metadata", "").lower() != "true":
            return ("secure-channel", 400, b'{"error": "Metadata header required"}', "application/json")
        path = url.path.rstrip("/")
        if path == "/secure-channel/status" and self.command == "GET":
            state = "WireserverAndImds" if self.fabric.msp else "Disabled"
            mode = "enforce" if self.fabric.msp else "disabled"
            doc = {"secureChannelState": state, "keyDeliveryMethod": "http", "version": "2.0",
                   "authorizationRules": {k: {"mode": mode} for k in ("imds", "wireserver", "hostga")}}
            return ("secure-channel", 200, json.dumps(doc).encode(), "application/json")
        if path == "/secure-channel/key" and self.command == "POST":
            if not self.fabric.msp:
                return ("secure-channel", 404, b'{"error": "secure channel disabled"}', "application/json")
            if self.fabric.msp_refuse_key:
                return ("secure-channel", 403, b'{"error": "key latch refused"}', "application/json")
            try:
                scheme = json.loads(body or b"{}").get("authorizationScheme")
            except ValueError:
                scheme = None
            if scheme != "Azure-HMAC-SHA256":
                return ("secure-channel", 400, b'{"error": "authorizationScheme"}', "application/json")
            with self.fabric.lock:
                if self.fabric.key_latched_at is None:
                    self.fabric.key_latched_at = time.time()
            key = {"guid": self.fabric.container, "incarnationId": 1, "authorizationScheme": scheme,
                   "key": "c2ltdWxhdGVkLWtleS1ub3QtYS1zZWNyZXQ="}
            return ("secure-channel", 200, json.dumps(key).encode(), "application/json")
        return ("secure-channel", 404, b"", "application/json")

    def wireserver(self, url, query, body, entry):
        comp = query.get("comp", [""])[0]
        if url.path.startswith("/secure-channel/"):
            return self.secure_channel(url, body)
        if comp == "versions":
            return ("versions", 200, VERSIONS.encode(), "text/xml; charset=utf-8")
        if url.path.rstrip("/") == "/provisioning/health" and self.command == "POST":
            # azure-init's JSON report (no goal state, no incarnation, no x-ms-version)
            try:
                doc = json.loads(body)
            except ValueError:
                return ("health", 400, b"", "text/plain")
            details = doc.get("details") or {}
            entry["state"], entry["substatus"] = doc.get("state"), details.get("subStatus")
            entry["description"] = details.get("description")
            if entry["state"] not in ("Ready", "NotReady"):
                return ("health", 400, b"", "text/plain")
            return ("health", 200, b"", "text/plain")
        if url.path.rstrip("/") == "/HealthService" and self.command == "POST":
            # waagent's JSON observations of its plugin's and IMDS's health: no x-ms-version
            try:
                json.loads(body or b"null")
            except ValueError:
                return ("healthservice", 400, b"", "text/plain")
            return ("healthservice", 200, b"", "text/plain")
        if self.headers.get("x-ms-version") is None:
            return ("unknown", 400, b"<Error><Code>MissingHeader</Code></Error>", "text/xml")
        if comp == "goalstate" and self.command == "GET":
            with self.fabric.lock:
                served = self.fabric.counts.get("goalstate", 0) + 1
                inc = self.fabric.incarnation
                if self.fabric.bump_after and (served == self.fabric.bump_after or self.fabric.bump_always):
                    self.fabric.incarnation += 1
            entry["incarnation"] = inc
            host, port = self.server.server_address[:2]
            base = f"http://{host}:{port}/machine/{self.fabric.container}/{self.fabric.instance}"
            conf = CONFIGURATION.format(base=base, inc=inc, instance=self.fabric.instance)
            xml = GOAL_STATE.format(inc=inc, container=self.fabric.container, instance=self.fabric.instance,
                                    configuration=conf)
            return ("goalstate", 200, xml.encode(), "text/xml; charset=utf-8")
        if comp == "config" and self.command == "GET":
            kind = query.get("type", [""])[0]
            template = {"hostingEnvironmentConfig": HOSTING_ENVIRONMENT, "sharedConfig": SHARED_CONFIG,
                        "extensionsConfig": EXTENSIONS_CONFIG, "fullConfig": FULL_CONFIG}.get(kind)
            if template is None:
                return ("config", 404, b"", "text/plain")
            with self.fabric.lock:
                inc = self.fabric.incarnation
            xml = template.format(inc=inc, container=self.fabric.container, instance=self.fabric.instance,
                                  role=self.fabric.instance.rsplit(".", 1)[-1], address=self.fabric.vm_address)
            return ("config", 200, xml.encode(), "text/xml; charset=utf-8")
        if comp in ("telemetrydata", "roleProperties") and self.command == "POST":
            return (comp, 200, b"", "text/xml")
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
            with self.fabric.lock:
                current = str(self.fabric.incarnation)
            if inc != current:
                return ("health", 410, b"", "text/xml")
            if entry["container_id"] != self.fabric.container or entry["instance_id"] != self.fabric.instance:
                return ("health", 400, b"<Error><Code>InvalidContainerConfiguration</Code></Error>", "text/xml")
            return ("health", 200, b"", "text/xml")
        return ("unknown", 404, b"", "text/plain")

    @property
    def fabric(self):
        return self.server.fabric


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


def parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wireserver", default="168.63.129.16:80")
    p.add_argument("--imds", default="169.254.169.254:80")
    p.add_argument("--hostgaplugin", default="168.63.129.16:32526")
    p.add_argument("--log", required=True)
    p.add_argument("--imds-doc")
    p.add_argument("--playbook")
    p.add_argument("--incarnation", type=int, default=1)
    p.add_argument("--bump-after-goalstate", type=int, default=0)
    p.add_argument("--bump-always", action="store_true", help="with --bump-after-goalstate 1: a new incarnation after every goal state")
    p.add_argument("--container-id", default="a511aa6d-29e7-4f53-8788-55655dfe848f")
    p.add_argument("--instance-id", default="f6cd1d7ef1644557b9059345e5ba890c.azprov-test")
    p.add_argument("--vm-address", default="10.44.0.4", help="the VM's address, for SharedConfig")
    p.add_argument("--msp", action="store_true", help="the VM was created with the Metadata Security Protocol")
    p.add_argument("--msp-refuse-key", action="store_true", help="with --msp: refuse the Guest Proxy Agent its key")
    p.add_argument("--reprovision-ovf", help="the OVF /metadata/reprovisiondata serves when ppsType is not None")
    return p


def serve(args):
    """Starts the WireServer and IMDS in threads; the two servers (shutdown() stops them)."""
    fabric = Fabric(args)
    servers = []
    for name, addr in (("wireserver", args.wireserver), ("imds", args.imds), ("hostgaplugin", args.hostgaplugin)):
        srv = Server(parse_addr(addr), Handler)
        srv.fabric = fabric  # its log is closed by whoever stops the servers in-process
        srv.name = name
        servers.append(srv)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    return servers


def main():
    serve(parser().parse_args())
    print("fabric ready", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
