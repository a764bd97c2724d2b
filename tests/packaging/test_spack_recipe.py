"""The Spack recipe (packaging/spack/packages/coltrain/package.py) against a stand-in for Spack's
package API: it declares the variants and dependencies the issue names, its cmake_args map each
spec to the CMake options the project really has, and nothing else. (Spack itself is not installed
here; its API is the few calls the recipe makes.)

usage: test_spack_recipe.py SOURCE_DIR
"""
import re
import sys
import types
import unittest
from pathlib import Path

SOURCE = Path(sys.argv.pop(1))
declared = []  # (directive, args, kwargs) in the order the class body makes them


def directive(name):
    return lambda *args, **kwargs: declared.append((name, args, kwargs))


class CMakePackage:
    def __init__(self, spec):
        self.spec = spec

    @staticmethod
    def define(name, value):
        if isinstance(value, bool):
            return f"-D{name}:BOOL={'ON' if value else 'OFF'}"
        return f"-D{name}:STRING={value}"

    def define_from_variant(self, name, variant):
        return self.define(name, self.spec.satisfies("+" + variant))


class Spec:
    def __init__(self, *enabled, cuda_arch=("90",)):
        self.enabled = set(enabled)
        self.variants = {"cuda_arch": types.SimpleNamespace(value=cuda_arch)}

    def satisfies(self, text):
        return text.startswith("+") and text[1:] in self.enabled

    def __getitem__(self, name):
        return types.SimpleNamespace(mpicxx=f"/spack/{name}/bin/mpicxx", prefix=f"/spack/{name}")


stub = types.ModuleType("spack.package")
stub.CMakePackage = CMakePackage
stub.CudaPackage = type("CudaPackage", (), {})
for name in ("version", "variant", "depends_on", "conflicts", "maintainers", "license"):
    setattr(stub, name, directive(name))
sys.modules["spack"] = types.ModuleType("spack")
sys.modules["spack.package"] = stub
recipe = {}
exec(compile((SOURCE / "packaging/spack/packages/coltrain/package.py").read_text(), "package.py",
             "exec"), recipe)
Coltrain = recipe["Coltrain"]


def cmake_options():
    """The options the top-level CMakeLists.txt declares."""
    text = (SOURCE / "CMakeLists.txt").read_text()
    return set(re.findall(r"(?:coltrain_tristate_option|option)\((COLTRAIN_\w+)", text))


def args_of(spec):
    return dict(arg[2:].split("=", 1) for arg in Coltrain(spec).cmake_args())


class SpackRecipe(unittest.TestCase):
    def test_variants_and_dependencies(self):
        variants = {args[0]: kwargs for name, args, kwargs in declared if name == "variant"}
        self.assertEqual(set(variants), {"mpi", "nccl", "cudnn", "openssl"})
        self.assertEqual(variants["nccl"].get("when"), "+cuda")
        self.assertEqual(variants["cudnn"].get("when"), "+cuda")
        depends = {(args[0], kwargs.get("when")) for name, args, kwargs in declared
                   if name == "depends_on"}
        for dependency in [("mpi", "+mpi"), ("nccl", "+nccl"), ("cudnn@9:", "+cudnn"),
                           ("eigen@3.3:", None), ("cmake@3.25:", None)]:
            self.assertIn(dependency, depends)

    def test_every_option_it_sets_exists(self):
        known = cmake_options()
        for spec in (Spec(), Spec("mpi"), Spec("mpi", "cuda", "nccl", "cudnn")):
            for key in args_of(spec):
                name = key.split(":")[0]
                if name.startswith("COLTRAIN_"):
                    self.assertIn(name, known)

    def test_host_only(self):
        args = args_of(Spec())
        for backend in ("MPI", "CUDA", "NCCL", "CUDNN"):
            self.assertEqual(args[f"COLTRAIN_WITH_{backend}:BOOL"], "OFF")
        self.assertEqual(args["COLTRAIN_BUILD_TESTS:BOOL"], "OFF")
        self.assertNotIn("MPI_CXX_COMPILER:STRING", args)

    def test_mpi_and_gpus(self):
        args = args_of(Spec("mpi", "cuda", "nccl", "cudnn", cuda_arch=("80", "90")))
        for backend in ("MPI", "CUDA", "NCCL", "CUDNN"):
            self.assertEqual(args[f"COLTRAIN_WITH_{backend}:BOOL"], "ON")
        self.assertEqual(args["MPI_CXX_COMPILER:STRING"], "/spack/mpi/bin/mpicxx")
        self.assertEqual(args["NCCL_ROOT:STRING"], "/spack/nccl")
        self.assertEqual(args["CUDNN_ROOT:STRING"], "/spack/cudnn")
        self.assertIn("80", args["CMAKE_CUDA_ARCHITECTURES:STRING"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
