"""The simulated fabric's endpoints against recorded samples (tests/fixtures) and Azure's
documented behaviour: python3 -m unittest discover -s testbed -t . (from the checkout's top)

The fabric listens on loopback ports of its own here; no namespace, no root.
"""
import json
import os
import tempfile
import unittest
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET

from testbed import fabric, images
from testbed.host import FIXTURES

WS_NS = "{http://schemas.microsoft.com/windowsazure}"


def paths(elem, prefix=""):
    """Every element's path below `elem`, namespaces dropped."""
    out = set()
    for child in elem:
        name = prefix + "/" + child.tag.split("}")[-1]
        out.add(name)
        out |= paths(child, name)
    return out


class FabricTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        with open(os.path.join(FIXTURES, "imds", "full.json")) as f:
            cls.doc = json.load(f)
        doc_path = os.path.join(cls.tmp.name, "imds.json")
        with open(doc_path, "w") as f:
            json.dump(cls.doc, f)
        cls.log = os.path.join(cls.tmp.name, "fabric.jsonl")
        args = fabric.parser().parse_args(["--wireserver", "127.0.0.1:0", "--imds", "127.0.0.1:0", "--hostgaplugin", "127.0.0.1:0",
                                           "--log", cls.log,
                                           "--imds-doc", doc_path])
        cls.servers = fabric.serve(args)
        cls.ws = "http://127.0.0.1:%d" % cls.servers[0].server_address[1]
        cls.imds = "http://127.0.0.1:%d" % cls.servers[1].server_address[1]

    @classmethod
    def tearDownClass(cls):
        for s in cls.servers:
            s.shutdown()
            s.server_close()
        cls.servers[0].fabric.log.close()
        cls.tmp.cleanup()

    def get(self, url, headers=None, data=None):
        req = urllib.request.Request(url, headers=headers or {}, data=data)
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def imds_get(self, path, **headers):
        return self.get(self.imds + path, {"Metadata": "true", **headers})

    def goal_state(self):
        status, body = self.get(self.ws + "/machine/?comp=goalstate", {"x-ms-version": "2012-11-30"})
        self.assertEqual(status, 200)
        return ET.fromstring(body)

    # ------------------------------------------------------------ WireServer
    def test_goal_state_has_the_recorded_samples_shape_with_its_configuration(self):
        sample = ET.parse(os.path.join(FIXTURES, "goalstate", "sample.xml")).getroot()
        gs = self.goal_state()
        # a VM created without certificates is given no Certificates URL
        want = {p for p in paths(sample) if not p.endswith("/Certificates")}
        want |= {"/Container/RoleInstanceList/RoleInstance/Configuration/" + k for k in ("ExtensionsConfig", "FullConfig")}
        self.assertEqual(paths(gs), want)
        self.assertTrue(gs.findtext("Container/ContainerId"))
        self.assertTrue(gs.findtext("Container/RoleInstanceList/RoleInstance/InstanceId"))

    def test_every_configuration_url_answers_with_its_document(self):
        conf = self.goal_state().find("Container/RoleInstanceList/RoleInstance/Configuration")
        roots = {"HostingEnvironmentConfig": "HostingEnvironmentConfig", "SharedConfig": "SharedConfig",
                 "ExtensionsConfig": "Extensions", "FullConfig": "RoleInstance"}
        for name, root in roots.items():
            url = conf.findtext(name)
            self.assertTrue(url.startswith("http://127.0.0.1:"), url)
            status, body = self.get(url.replace("http://127.0.0.1:%s" % url.split(":")[2].split("/")[0], self.ws),
                                    {"x-ms-version": "2012-11-30"})
            self.assertEqual(status, 200, name)
            doc = ET.fromstring(body)
            self.assertEqual(doc.tag, root)
        # what waagent reads of SharedConfig: the deployment, the role and the instance's address
        status, body = self.get(self.ws + "/machine/x/y?comp=config&type=sharedConfig&incarnation=1",
                                {"x-ms-version": "2012-11-30"})
        shared = ET.fromstring(body)
        self.assertTrue(shared.find("Deployment").get("name"))
        self.assertTrue(shared.find("Role").get("name"))
        self.assertEqual(shared.find("Instances/Instance").get("address"), "10.44.0.4")

    def test_health_needs_the_current_incarnation(self):
        gs = self.goal_state()

        def post(inc):
            body = harness_health(gs, inc)
            return self.get(self.ws + "/machine?comp=health", {"x-ms-version": "2012-11-30",
                                                               "Content-Type": "text/xml"}, body)[0]
        self.assertEqual(post(gs.findtext("Incarnation")), 200)
        self.assertEqual(post("999"), 410)

    def test_goal_state_needs_x_ms_version_and_telemetry_is_accepted(self):
        self.assertEqual(self.get(self.ws + "/machine/?comp=goalstate")[0], 400)
        self.assertEqual(self.get(self.ws + "/?comp=versions")[0], 200)
        self.assertEqual(self.get(self.ws + "/machine?comp=telemetrydata", {"x-ms-version": "2012-11-30"},
                                  b"<TelemetryData/>")[0], 200)

    def test_the_json_health_endpoints(self):
        status, _ = self.get(self.ws + "/provisioning/health", {"Content-Type": "application/json"},
                             b'{"state":"NotReady","details":{"subStatus":"ProvisioningFailed","description":"x"}}')
        self.assertEqual(status, 200)
        with open(self.log) as f:
            entry = [json.loads(l) for l in f][-1]
        self.assertEqual((entry["state"], entry["substatus"]), ("NotReady", "ProvisioningFailed"))
        self.assertEqual(self.get(self.ws + "/provisioning/health", {}, b'{"state":"Fine"}')[0], 400)
        self.assertEqual(self.get(self.ws + "/HealthService", {"Content-Type": "application/json"},
                                  b'{"Api": "reporttargethealth", "Observations": []}')[0], 200)

    def test_the_hostgaplugin_answers_as_one_without_fasttrack(self):
        hgap = "http://127.0.0.1:%d" % self.servers[2].server_address[1]
        status, body = self.get(hgap + "/versions")
        self.assertEqual(status, 200)
        self.assertIn("2015-09-01", json.loads(body))
        self.assertEqual(self.get(hgap + "/vmSettings")[0], 404)
        req = urllib.request.Request(hgap + "/status", data=b"{}", method="PUT")
        with urllib.request.urlopen(req, timeout=5) as r:
            self.assertEqual(r.status, 200)

    # ------------------------------------------------------------ IMDS
    def test_imds_serves_the_recorded_document_for_the_newest_versions(self):
        status, body = self.imds_get("/metadata/instance?api-version=2023-11-15&extended=true")
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(body), self.doc)
        status, body = self.imds_get("/metadata/instance?api-version=2023-11-15")
        self.assertNotIn("extended", json.loads(body))

    def test_imds_refuses_what_azure_refuses(self):
        self.assertEqual(self.get(self.imds + "/metadata/instance?api-version=2021-08-01")[0], 400)
        self.assertEqual(self.imds_get("/metadata/instance?api-version=2021-08-01", **{"X-Forwarded-For": "1.2.3.4"})[0],
                         400)
        status, body = self.imds_get("/metadata/instance")
        self.assertEqual(status, 400)
        self.assertEqual(json.loads(body)["newest-versions"][0], fabric.IMDS_VERSIONS[-1])
        # a version Azure does not know yet: 400, as cloud-init's fallback to 2019-06-01 expects
        self.assertEqual(self.imds_get("/metadata/instance?api-version=2099-01-01")[0], 400)
        self.assertEqual(self.imds_get("/metadata/nothing?api-version=2021-08-01")[0], 404)

    def test_imds_older_versions_lack_the_newer_fields(self):
        doc = json.loads(self.imds_get("/metadata/instance?api-version=2019-06-01")[1])
        self.assertNotIn("osProfile", doc["compute"])
        self.assertNotIn("userData", doc["compute"])
        self.assertIn("publicKeys", doc["compute"])
        doc = json.loads(self.imds_get("/metadata/instance?api-version=2020-07-15")[1])
        self.assertEqual(set(doc["compute"]["osProfile"]), {"adminUsername", "computerName"})

    def test_imds_paths_below_the_instance_and_text_leaves(self):
        status, body = self.imds_get("/metadata/instance/compute/osProfile/adminUsername?api-version=2021-02-01&format=text")
        self.assertEqual((status, body), (200, b"azureuser"))
        keys = json.loads(self.imds_get("/metadata/instance/compute/publicKeys?api-version=2021-02-01")[1])
        self.assertEqual(keys, self.doc["compute"]["publicKeys"])
        mac = self.imds_get("/metadata/instance/network/interface/0/macAddress?api-version=2021-02-01&format=text")[1]
        self.assertEqual(mac.decode(), self.doc["network"]["interface"][0]["macAddress"])
        self.assertEqual(self.imds_get("/metadata/instance/compute/nope?api-version=2021-02-01")[0], 404)
        versions = json.loads(self.imds_get("/metadata/versions")[1])["apiVersions"]
        self.assertIn("2021-08-01", versions)
        self.assertEqual(self.imds_get("/metadata/reprovisiondata?api-version=2019-06-01")[0], 404)


def harness_health(gs, inc):
    """A Ready report for goal state `gs` with incarnation `inc`, as the agents write it."""
    return f"""<?xml version="1.0" encoding="utf-8"?>
<Health xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xmlns:xsd="http://www.w3.org/2001/XMLSchema">
  <GoalStateIncarnation>{inc}</GoalStateIncarnation>
  <Container>
    <ContainerId>{gs.findtext("Container/ContainerId")}</ContainerId>
    <RoleInstanceList><Role>
      <InstanceId>{gs.findtext("Container/RoleInstanceList/RoleInstance/InstanceId")}</InstanceId>
      <Health><State>Ready</State></Health>
    </Role></RoleInstanceList>
  </Container>
</Health>""".encode()


class OvfTest(unittest.TestCase):
    def test_the_ovf_has_what_walas_sample_has_and_cloud_init_requires(self):
        wala = ET.parse(os.path.join(FIXTURES, "ovf", "wala.xml")).getroot()
        ours = ET.fromstring(images.ovf_env("vm1", "azureuser", keys=["ssh-ed25519 AAAA k@h"], password="pw",
                                             custom_data=b"#!/bin/sh\n"))
        # what azure-init's samples add to WALA's (PreprovisionedVMType is what cloud-init reads);
        # WALA's sample carries a KeyPairs entry (a certificate-delivered private key) we never send
        added = {"/PlatformSettingsSection/PlatformSettings/" + k
                 for k in ("PreprovisionedVMType", "EnableTrustedImageIdentifier")}
        self.assertEqual(paths(ours) - paths(wala), added)
        missing = {p for p in paths(wala) - paths(ours) if "/KeyPairs" not in p}
        self.assertEqual(missing, set())
        settings = ours.find(f"{WS_NS}PlatformSettingsSection/{WS_NS}PlatformSettings")
        self.assertIsNotNone(settings, "cloud-init rejects an OVF without PlatformSettingsSection/PlatformSettings")
        self.assertEqual(settings.findtext(f"{WS_NS}PreprovisionedVMType"), "None")
        lpcs = ours.find(f"{WS_NS}ProvisioningSection/{WS_NS}LinuxProvisioningConfigurationSet")
        self.assertEqual(lpcs.findtext(f"{WS_NS}HostName"), "vm1")
        self.assertEqual(lpcs.findtext(f"{WS_NS}SSH/{WS_NS}PublicKeys/{WS_NS}PublicKey/{WS_NS}Value"),
                         "ssh-ed25519 AAAA k@h")

    def test_the_imds_interface_is_as_azure_lists_it(self):
        (nic,) = images.imds_interface("00:0d:3a:ab:cd:ef", "10.44.0.4")
        self.assertEqual(nic["macAddress"], "000D3AABCDEF")
        self.assertEqual(nic["ipv4"]["ipAddress"][0]["privateIpAddress"], "10.44.0.4")


if __name__ == "__main__":
    unittest.main()


class SecureChannelTest(unittest.TestCase):
    """The Metadata Security Protocol as the Guest Proxy Agent meets it: the key latched once,
    its moment recorded in every later request's log line; refused on demand; Disabled without
    --msp."""

    def serve(self, *flags):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        log = os.path.join(tmp.name, "fabric.jsonl")
        args = fabric.parser().parse_args(["--wireserver", "127.0.0.1:0", "--imds", "127.0.0.1:0",
                                           "--hostgaplugin", "127.0.0.1:0", "--log", log, *flags])
        servers = fabric.serve(args)

        def stop():
            for s in servers:
                s.shutdown()
                s.server_close()
            servers[0].fabric.log.close()
        self.addCleanup(stop)
        return "http://127.0.0.1:%d" % servers[0].server_address[1], log

    def call(self, url, data=None, metadata=True):
        req = urllib.request.Request(url, data=data, headers={"Metadata": "True"} if metadata else {})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                body = r.read()
                return r.status, json.loads(body) if body.startswith(b"{") else body
        except urllib.error.HTTPError as e:
            return e.code, None

    def entries(self, log):
        with open(log) as f:
            return [json.loads(l) for l in f]

    def test_the_key_is_latched_once_and_later_requests_say_so(self):
        ws, log = self.serve("--msp")
        self.assertEqual(self.call(ws + "/secure-channel/status", metadata=False)[0], 400)
        status, doc = self.call(ws + "/secure-channel/status")
        self.assertEqual((status, doc["secureChannelState"]), (200, "WireserverAndImds"))
        self.assertEqual(self.call(ws + "/secure-channel/key", b'{"authorizationScheme": "nope"}')[0], 400)
        status, key = self.call(ws + "/secure-channel/key", b'{"authorizationScheme": "Azure-HMAC-SHA256"}')
        self.assertEqual((status, key["authorizationScheme"]), (200, "Azure-HMAC-SHA256"))
        self.call(ws + "/?comp=versions")
        seen = [(e["path"], e["msp_key"]) for e in self.entries(log)]
        self.assertEqual(seen[-2:], [("/secure-channel/key", False), ("/?comp=versions", True)])
        self.assertFalse(any(k for _, k in seen[:-1]))

    def test_a_refused_key_and_a_vm_without_msp(self):
        ws, log = self.serve("--msp", "--msp-refuse-key")
        self.assertEqual(self.call(ws + "/secure-channel/key", b'{"authorizationScheme": "Azure-HMAC-SHA256"}')[0], 403)
        self.call(ws + "/?comp=versions")
        self.assertFalse(self.entries(log)[-1]["msp_key"])
        ws, _ = self.serve()
        self.assertEqual(self.call(ws + "/secure-channel/status")[1]["secureChannelState"], "Disabled")
        self.assertEqual(self.call(ws + "/secure-channel/key", b'{"authorizationScheme": "Azure-HMAC-SHA256"}')[0], 404)
