#!/usr/bin/env python3
"""scripts/test_report on junit_sample.xml, which CTest 3.25's --output-junit wrote for a toy
project (trimmed): Catch2's real WARN output with a wrapped "skipped part:" line, skips with and
without a GPU reason, a failure, and a test whose executable is missing (CTest: failed, though the
XML files it under <skipped>). Variants drop test cases from it to check the CI rule."""

import os
import pathlib
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ElementTree

HERE = pathlib.Path(__file__).resolve().parent
REPORT = HERE.parent.parent / "scripts" / "test_report"
SAMPLE = HERE / "junit_sample.xml"
# The cases of the sample that fail, or skip for a reason other than a GPU or the kernel.
NOT_GPU_ONLY = ["core_tests.a parser that fails", "samples.missing_binary", "parity_layers_tests",
                "netns.jobs", "core_tests.Python's json module reads what dump writes"]


def report(path, ci):
    env = dict(os.environ)
    env.pop("CI", None)
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, str(REPORT), str(path)], env=env,
                          capture_output=True, text=True)


class TestReport(unittest.TestCase):
    def setUp(self):
        self.folder = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.folder.cleanup()

    def sample_without(self, names):
        tree = ElementTree.parse(SAMPLE)
        suite = tree.getroot()
        for case in list(suite):
            if case.get("name") in names:
                suite.remove(case)
        path = pathlib.Path(self.folder.name) / "junit.xml"
        tree.write(path)
        return path

    def test_counts_failures_and_reasons(self):
        result = report(SAMPLE, ci=False)
        self.assertEqual(result.returncode, 1, result.stdout)
        out = result.stdout
        self.assertIn("passed 3, failed 2, skipped 4; parts skipped inside passing tests: 2", out)
        self.assertRegex(out, r"failed +core_tests\.a parser that fails")
        self.assertRegex(out, r"failed +samples\.missing_binary +not run: Unable to find")
        self.assertRegex(out, r"skipped +gpu +gpu_dtype_tests +no GPU; compiled by nvcc -cuda")
        self.assertRegex(out, r"skipped +setup +parity_layers_tests +PyTorch is not installed")
        self.assertRegex(out, r"skipped +setup +netns\.jobs +creating network namespaces")
        # Catch2 wrapped this message over three lines; the report joins them.
        self.assertIn("part     kernel  comm_tests.single copy: a reference outside the protocol",
                      out)
        self.assertIn("this host refuses process_vm_readv between sibling processes (Yama "
                      "ptrace_scope or seccomp): the single-copy path is not tested here, its "
                      "cases run over the rings\n", out)
        self.assertRegex(out, r"part +setup +\n? *.*/usr/bin/python3 is not installed")
        self.assertIn("Under CI=true this fails the run.", out)

    def test_outside_ci_a_missing_prerequisite_does_not_fail(self):
        result = report(self.sample_without(NOT_GPU_ONLY[:2]), ci=False)
        self.assertEqual(result.returncode, 0, result.stdout)
        self.assertIn("PyTorch is not installed", result.stdout)

    def test_ci_fails_on_a_skip_that_is_not_for_a_gpu(self):
        result = report(self.sample_without(NOT_GPU_ONLY[:2]), ci=True)
        self.assertEqual(result.returncode, 2, result.stdout)
        self.assertIn("CI=true and a prerequisite is missing", result.stdout)
        self.assertIn("scripts/setup installs these", result.stdout)

    def test_ci_fails_on_a_part_skipped_for_a_missing_prerequisite(self):
        result = report(self.sample_without(NOT_GPU_ONLY[:4]), ci=True)
        self.assertEqual(result.returncode, 2, result.stdout)
        self.assertIn("/usr/bin/python3 is not installed", result.stdout)

    def test_ci_passes_when_only_gpu_and_kernel_skips_remain(self):
        result = report(self.sample_without(NOT_GPU_ONLY), ci=True)
        self.assertEqual(result.returncode, 0, result.stdout)
        self.assertIn("passed 2, failed 0, skipped 2; parts skipped inside passing tests: 1",
                      result.stdout)
        self.assertNotIn("setup", result.stdout.replace("setup ones fail it", ""))

    def test_ci_reports_a_failure_as_such(self):
        result = report(SAMPLE, ci=True)
        self.assertEqual(result.returncode, 1, result.stdout)

    def test_no_results_is_an_error(self):
        result = report(pathlib.Path(self.folder.name) / "absent.xml", ci=False)
        self.assertEqual(result.returncode, 1)
        self.assertIn("no test results in", result.stdout)


if __name__ == "__main__":
    unittest.main()
