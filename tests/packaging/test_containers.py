"""The container recipes and the Kubeflow manifests agree, and the manifests are PyTorchJobs.

- samples/k8s/*.yaml validate against samples/k8s/pytorchjob-v1.schema.json (the part of Kubeflow's
  PyTorchJob v1 that they use), and the schema refuses the mistakes kubectl would let through;
- every image a manifest names is a stage of the Dockerfile, which builds the command the manifest
  runs and copies the data directory it points COLTRAIN_DATA_DIR at;
- the Apptainer definition builds the three sample trainers from files that exist.
(No container is built here: there is no Docker, Apptainer or network on the test machine.)

usage: test_containers.py SOURCE_DIR
"""
import copy
import json
import re
import sys
import unittest
from pathlib import Path

try:
    import jsonschema
    import yaml
except ImportError as missing:  # CTest reports exit status 77 as skipped (SKIP_RETURN_CODE)
    print(f"skipped: {missing.name} is not installed (Debian: python3-jsonschema, python3-yaml)")
    sys.exit(77)

SOURCE = Path(sys.argv.pop(1))
SCHEMA = json.loads((SOURCE / "samples/k8s/pytorchjob-v1.schema.json").read_text())
MANIFESTS = sorted((SOURCE / "samples/k8s").glob("*.yaml"))
DOCKERFILE = (SOURCE / "Dockerfile").read_text()
APPTAINER = (SOURCE / "packaging/apptainer/coltrain.def").read_text()


def errors_of(document):
    validator = jsonschema.Draft202012Validator(SCHEMA)
    return [error.message for error in validator.iter_errors(document)]


def containers_of(manifest):
    for replica in manifest["spec"]["pytorchReplicaSpecs"].values():
        yield from replica["template"]["spec"]["containers"]


def dockerfile_stage(name):
    """The lines of the Dockerfile's stage `name`, up to the next FROM."""
    stages = re.split(r"(?m)^FROM ", DOCKERFILE)
    for stage in stages[1:]:
        header = stage.splitlines()[0]
        if re.search(rf"\bAS {re.escape(name)}$", header):
            return stage
    return None


class Manifests(unittest.TestCase):
    def test_there_are_manifests(self):
        self.assertGreaterEqual(len(MANIFESTS), 2)

    def test_each_is_a_pytorchjob(self):
        for path in MANIFESTS:
            with self.subTest(manifest=path.name):
                self.assertEqual(errors_of(yaml.safe_load(path.read_text())), [])

    def test_the_schema_refuses_mistakes(self):
        manifest = yaml.safe_load(MANIFESTS[0].read_text())
        mistakes = {
            "a misspelled key": lambda m: m["spec"].__setitem__(
                "pytorchReplicaSpec", m["spec"].pop("pytorchReplicaSpecs")),
            "replicas as a string": lambda m: m["spec"]["pytorchReplicaSpecs"]["Worker"].__setitem__(
                "replicas", "3"),
            "two masters": lambda m: m["spec"]["pytorchReplicaSpecs"]["Master"].__setitem__(
                "replicas", 2),
            "no container named pytorch": lambda m: [
                c.__setitem__("name", "trainer") for c in containers_of(m)],
            "an unknown restart policy": lambda m: m["spec"]["pytorchReplicaSpecs"][
                "Master"].__setitem__("restartPolicy", "OnError"),
            "an env entry with a typo": lambda m: next(containers_of(m))["env"].append(
                {"name": "RANK", "vlaue": "0"}),
            "another API version": lambda m: m.__setitem__("apiVersion", "kubeflow.org/v2"),
        }
        for what, mutate in mistakes.items():
            with self.subTest(mistake=what):
                broken = copy.deepcopy(manifest)
                mutate(broken)
                self.assertNotEqual(errors_of(broken), [])

    def test_images_are_what_the_dockerfile_builds(self):
        for path in MANIFESTS:
            for container in containers_of(yaml.safe_load(path.read_text())):
                with self.subTest(manifest=path.name, image=container["image"]):
                    target = container["image"].rsplit("/", 1)[-1].split(":")[0]
                    stage = dockerfile_stage(target)
                    self.assertIsNotNone(stage, f"no Dockerfile stage 'AS {target}'")
                    command = container["command"][0]
                    self.assertIn(f" {command}", stage, "the stage does not hold the command")
                    data = {e["name"]: e.get("value") for e in container.get("env", [])}.get(
                        "COLTRAIN_DATA_DIR")
                    if data:
                        self.assertRegex(stage, rf"(?m)^COPY data {re.escape(data)}$")
                    # The build stage it copies from compiles that very file.
                    source = re.search(r"COPY --from=(\S+) (\S+)", stage)
                    self.assertIsNotNone(source)
                    build = dockerfile_stage(source.group(1))
                    self.assertIn(f"-o {source.group(2)}", build)
                    self.assertIn(f"docker build --target {target} ", DOCKERFILE)


class Recipes(unittest.TestCase):
    def test_dockerfile_sources_exist(self):
        for copied in re.findall(r"(?m)^COPY (?!--from)(\S+) ", DOCKERFILE):
            self.assertTrue((SOURCE / copied).exists(), copied)
        for compiled in re.findall(r"(samples/\S+\.cpp)", DOCKERFILE):
            self.assertTrue((SOURCE / compiled).exists(), compiled)
        ignored = (SOURCE / ".dockerignore").read_text()
        for copied in re.findall(r"(?m)^COPY (?!--from)(\S+) ", DOCKERFILE):
            self.assertIn(f"!{copied}", ignored, f"{copied} is left out of the build context")

    def test_apptainer_builds_the_samples(self):
        self.assertRegex(APPTAINER, r"(?m)^Bootstrap: docker$")
        files = re.search(r"(?ms)^%files\n(.*?)^%", APPTAINER).group(1)
        for line in filter(str.strip, files.splitlines()):
            self.assertTrue((SOURCE / line.split()[0]).exists(), line)
        samples = re.search(r"for sample in ([\w ]+); do", APPTAINER).group(1).split()
        self.assertEqual(set(samples), {"mnist_mlp", "mnist_convnet", "cifar_resnet"})
        for sample in samples:
            self.assertTrue((SOURCE / f"samples/{sample}.cpp").exists(), sample)
        self.assertIn("mpicxx", APPTAINER)


if __name__ == "__main__":
    unittest.main(verbosity=2)
