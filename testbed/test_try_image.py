"""scripts/try-image's checks that need no VM: what Azure's upload would refuse.
python3 -m unittest discover -s testbed -t . (from the checkout's top; needs qemu-img; no root)."""
import os
import shutil
import subprocess
import tempfile
import unittest

from testbed import try_image


class Upload(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="azprov-upload-")
        self.addCleanup(shutil.rmtree, self.dir)

    def vhd(self, raw_bytes, name):
        raw = os.path.join(self.dir, name + ".raw")
        with open(raw, "wb") as f:
            f.truncate(raw_bytes)
        out = os.path.join(self.dir, name + ".vhd")
        subprocess.run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "vpc", "-o", "subformat=fixed,force_size=on",
                        raw, out], check=True)
        return out

    def test_a_fixed_vhd_of_whole_mib_is_taken(self):
        good = self.vhd(64 << 20, "good")
        self.assertEqual(try_image.image_format(good), "vpc")
        self.assertEqual(try_image.upload_problems(good, "vpc"), [])

    def test_a_vhd_that_is_not_whole_mib_is_refused_as_azure_refuses_it(self):
        # the size a user's image had: 2,415,960,064 bytes with the footer
        bad = self.vhd(2_415_960_064 - 512, "bad")
        problems = try_image.upload_problems(bad, "vpc")
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("2,415,960,064 bytes", problems[0])
        self.assertIn("not a whole number of MiB", problems[0])
        self.assertIn("resize the raw disk to 2,305 MiB", problems[0])

    def test_a_dynamic_vhd_and_a_raw_disk_are_not_what_azure_takes(self):
        raw = os.path.join(self.dir, "disk.raw")
        with open(raw, "wb") as f:
            f.truncate(64 << 20)
        dynamic = os.path.join(self.dir, "dynamic.vhd")
        subprocess.run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "vpc", raw, dynamic], check=True)
        self.assertTrue(any("not 2 (fixed)" in p for p in try_image.upload_problems(dynamic, "vpc")))
        self.assertIn("not a fixed VHD", try_image.upload_problems(raw, "raw")[0])

    def test_a_damaged_footer_is_said(self):
        good = self.vhd(64 << 20, "damaged")
        with open(good, "r+b") as f:
            f.seek(-512 + 70, os.SEEK_END)
            f.write(b"\xff")
        self.assertIn("the VHD footer's checksum is wrong", try_image.upload_problems(good, "vpc"))


if __name__ == "__main__":
    unittest.main()


class Cause(unittest.TestCase):
    def args(self):
        return type("A", (), {"timeout": 600, "ssh_only": False, "user": "azureuser", "hostname": "vm"})()

    def result(self, **kw):
        r = {"ready": False, "reason": None, "requests": [], "console_log": "c.log", "ssh": False,
             "format": "vpc", "upload": []}
        r.update(kw)
        return r

    def test_a_vm_that_never_asks_the_fabric_ends_with_that_cause(self):
        c = try_image.cause(self.result(silent=75.3), self.args(), None)
        self.assertIn("its sshd answered, but in the 60 s after nothing asked the fabric", c)
        self.assertIn("ended at 75.3 s", c)
        # without the early end it is the timeout's cause
        c = try_image.cause(self.result(), self.args(), None)
        self.assertTrue(c.startswith("no Ready within 600 s: the image never reached the fabric"), c)

    def test_a_vhd_azure_would_refuse_fails_a_run_that_provisioned(self):
        ok = dict(ready=True, ssh=True, hostname="vm", t_ready_s=9.0)
        self.assertIsNone(try_image.cause(self.result(**ok), self.args(), None))
        c = try_image.cause(self.result(upload=["2,415,960,064 bytes: ..."], **ok), self.args(), None)
        self.assertTrue(c.startswith("it provisions here, but Azure would refuse the VHD: 2,415,960,064 bytes"), c)
        # a raw disk is tried as it is: its note fails nothing
        self.assertIsNone(try_image.cause(self.result(format="raw", upload=["a raw image, ..."], **ok),
                                          self.args(), None))


class VmId(unittest.TestCase):
    VM = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"

    def test_gen2_shows_the_vm_id_and_gen1_its_first_three_fields_swapped(self):
        self.assertEqual(try_image.dmi_uuid(self.VM, "2"), self.VM)
        self.assertEqual(try_image.dmi_uuid(self.VM, "1"), "3c2d1e0f-5a4b-7869-8796-a5b4c3d2e1f0")

    def test_what_azprov_recorded_is_read_from_the_login_and_a_wrong_vm_id_fails_the_run(self):
        out = ("HOSTNAME=vm\nAZPROV-STATUS-BEGIN\n"
               '{"vm_id": "3c2d1e0f-5a4b-7869-8796-a5b4c3d2e1f0", "scripts": {"customdata": {"exit": 0}}}\n'
               "AZPROV-STATUS-END\n")
        st = try_image.azprov_status(out)
        self.assertEqual(st["scripts"]["customdata"]["exit"], 0)
        self.assertIsNone(try_image.azprov_status("HOSTNAME=vm\nAZPROV-STATUS-BEGIN\nAZPROV-STATUS-END\n"))
        a = type("A", (), {"timeout": 600, "ssh_only": False, "user": "azureuser", "hostname": "vm"})()
        r = {"ready": True, "reason": None, "requests": [], "console_log": "c.log", "ssh": True, "hostname": "vm",
             "t_ready_s": 9.0, "format": "raw", "upload": [], "vm_id": self.VM, "azprov": st}
        self.assertIn("the DMI UUID was read in the wrong byte order", try_image.cause(r, a, None))
        r["azprov"] = dict(st, vm_id=self.VM)
        self.assertIsNone(try_image.cause(r, a, None))
