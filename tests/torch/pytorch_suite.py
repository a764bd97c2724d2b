#!/usr/bin/env python3
"""PyTorch's own distributed test suite (torch.testing._internal.distributed.distributed_test, as
PyTorch's test_distributed_spawn.py runs it) against the coltrain backend. The suite takes
third-party backends as "plugin"; coltrain also declares what it implements (DDP and subgroups)
and what it does not (recv from any source, allgather_coalesced), so those tests skip themselves.

    BACKEND=coltrain WORLD_SIZE=2 python3 tests/torch/pytorch_suite.py [-k pattern] [-v]

BACKEND=gloo runs the same tests against gloo, for comparison. Not in CTest: the suite takes about
8 minutes on 2 cores (docs/torch.md has the counts).
"""
import os
import sys
import tempfile
import types
import unittest

os.environ.setdefault("BACKEND", "coltrain")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="coltrain_pytorch_suite_"))

try:
    import expecttest  # noqa: F401
except ImportError:
    # PyTorch's test utilities import expecttest (not packaged by Debian) for assertExpectedInline,
    # which the distributed suite does not use.
    expecttest = types.ModuleType("expecttest")
    expecttest.TestCase = unittest.TestCase
    expecttest.ACCEPT = False
    sys.modules["expecttest"] = expecttest

import coltrain_torch  # noqa: E402,F401  (registers the backend, in the spawned ranks too)
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

# Before distributed_test is imported: its decorators read these sets.
for feature in ("plugin", "ddp", "subgroup"):
    DistTestCases.backend_feature[feature].add("coltrain")
for collective in ("allgather_coalesced", "sendrecv anysource"):
    DistTestCases.skip_collective[collective].add("coltrain")

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    run_tests()
