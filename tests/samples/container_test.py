#!/usr/bin/python3
"""Checks samples/container/ without a container engine (samples/container/run.sh,
ctest samples.container_run, runs it for real where podman can).

    .venv/bin/python tests/samples/container_test.py [-v]
    TSAR_CLI=build/cli/tsar TSAR_WORKER=build/samples/cpp-server/tsar_worker_cpu .venv/bin/python tests/samples/container_test.py

- Containerfile.*: every COPY source is something build.sh's header says it
  makes; the model's archive is COPYed by an instruction of its own (a layer
  of its own with buildah --layers), after the architecture; the variant adds
  exactly one layer, holding only its tsar layer; each image starts FROM the
  one run.sh builds before it.
- k8s/image-volume.yaml: the documents parse; the workers run the runtime
  image, mount the model and variant images read-only as image volumes, their
  --archive and --model lie inside those mounts, and all land on one node.
- With TSAR_CLI and TSAR_WORKER set: build.sh runs twice into two folders and
  makes byte-identical archives, architectures and runtime files, with the
  modes and mtimes that make a layer reproducible.
"""
import hashlib
import os
import shlex
import subprocess
import tempfile
import unittest

import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SAMPLE = os.path.join(REPO, "samples", "container")


def read(path):
    with open(path) as f:
        return f.read()


def instructions(name):
    """[(INSTRUCTION, [args])] of a Containerfile, comments dropped, continuations joined."""
    out, pending = [], ""
    for raw in read(os.path.join(SAMPLE, name)).splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), shlex.split(rest) if not rest.startswith("[") else [rest]))
    return out


def copies(name):
    return [args for word, args in instructions(name) if word == "COPY"]


def documented_outputs():
    """What build.sh's header says it makes, relative to OUTDIR."""
    outs = []
    for line in read(os.path.join(SAMPLE, "build.sh")).splitlines():
        if line.startswith("#   OUTDIR/"):
            outs.append(line[len("#   OUTDIR/"):].split()[0].rstrip(","))
    return outs


class ContainerfileTest(unittest.TestCase):
    def test_copy_sources_are_what_build_sh_makes(self):
        outs = documented_outputs()
        self.assertIn("rootfs/", outs)
        for name in ("Containerfile.runtime", "Containerfile.model", "Containerfile.variant"):
            for args in copies(name):
                src = args[0]
                with self.subTest(file=name, src=src):
                    self.assertTrue(any(src == o or src.startswith(o) and o.endswith("/") for o in outs),
                                    f"{src} is not among build.sh's outputs {outs}")

    def test_the_runtime_is_from_scratch_with_the_worker(self):
        ins = instructions("Containerfile.runtime")
        self.assertEqual(ins[0], ("FROM", ["scratch"]))
        self.assertEqual(copies("Containerfile.runtime"), [["rootfs/", "/"]])
        entry = [a for w, a in ins if w == "ENTRYPOINT"]
        self.assertEqual(entry, [['["/opt/tsar/bin/tsar_worker"]']])

    def test_the_archive_is_a_layer_of_its_own_after_the_architecture(self):
        cps = copies("Containerfile.model")
        self.assertEqual([c[0] for c in cps], ["models/resnet18_arch_ts.pt", "models/resnet18.tsar"])
        self.assertTrue(all(len(c) == 2 for c in cps), "one source per COPY: one file per layer")
        self.assertIn(("FROM", ["${RUNTIME}"]), instructions("Containerfile.model"))

    def test_the_variant_adds_only_its_tsar_layer(self):
        self.assertEqual(copies("Containerfile.variant"), [["models/resnet18-ft.tsar", "/models/resnet18-ft.tsar"]])
        self.assertIn(("FROM", ["${MODEL}"]), instructions("Containerfile.variant"))
        layering = [w for w, _ in instructions("Containerfile.variant") if w in ("RUN", "COPY", "ADD")]
        self.assertEqual(layering, ["COPY"])

    def test_run_sh_builds_with_pinned_timestamps_and_a_layer_per_instruction(self):
        script = read(os.path.join(SAMPLE, "run.sh"))
        self.assertIn("bud -q --layers --timestamp 0", script)
        for name in ("Containerfile.runtime", "Containerfile.model", "Containerfile.variant"):
            self.assertIn(name, script)


class ManifestTest(unittest.TestCase):
    def test_workers_mount_the_images_read_only(self):
        docs = list(yaml.safe_load_all(read(os.path.join(SAMPLE, "k8s", "image-volume.yaml"))))
        self.assertEqual([d["kind"] for d in docs], ["Deployment", "Deployment"])
        refs = set()
        for d in docs:
            with self.subTest(name=d["metadata"]["name"]):
                self.assertEqual(d["apiVersion"], "apps/v1")
                spec = d["spec"]
                self.assertGreaterEqual(spec["replicas"], 2)
                pod = spec["template"]["spec"]
                labels = spec["template"]["metadata"]["labels"]
                for k, v in spec["selector"]["matchLabels"].items():
                    self.assertEqual(labels.get(k), v, "selector must match the pod template")
                terms = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                self.assertTrue(any(t["topologyKey"] == "kubernetes.io/hostname" and
                                    all(labels.get(k) == v for k, v in t["labelSelector"]["matchLabels"].items())
                                    for t in terms), "base and variant workers must land on one node")
                volumes = {v["name"]: v for v in pod["volumes"]}
                (c,) = pod["containers"]
                self.assertTrue(c["image"].endswith("/tsar/runtime:1"))
                self.assertIs(c["securityContext"]["readOnlyRootFilesystem"], True)
                self.assertIs(c.get("stdin"), True, "the sample worker exits at EOF on stdin")
                mounts = c["volumeMounts"]
                for m in mounts:
                    self.assertIs(m.get("readOnly"), True)
                    self.assertIn("image", volumes[m["name"]])
                    refs.add(volumes[m["name"]]["image"]["reference"].rsplit("/", 2)[-2:][-1])
                args = c["args"]
                for flag in ("--archive", "--model"):
                    path = args[args.index(flag) + 1]
                    self.assertTrue(any(path.startswith(m["mountPath"].rstrip("/") + "/") for m in mounts),
                                    f"{flag} {path} is not inside a read-only mount")
        self.assertEqual(refs, {"resnet18:1", "resnet18-ft:1"})


@unittest.skipUnless(os.environ.get("TSAR_CLI") and os.environ.get("TSAR_WORKER"),
                     "set TSAR_CLI and TSAR_WORKER (tsar_worker_cpu) to run build.sh")
class BuildTest(unittest.TestCase):
    def test_build_twice_same_bytes_modes_and_mtimes(self):
        env = dict(os.environ, SOURCE_DATE_EPOCH="1000")
        with tempfile.TemporaryDirectory() as tmp:
            trees = []
            for run in ["a", "b"]:
                out = os.path.join(tmp, run)
                subprocess.run([os.path.join(SAMPLE, "build.sh"), os.environ["TSAR_CLI"], os.environ["TSAR_WORKER"],
                                out], check=True, env=env, stdout=subprocess.DEVNULL)
                for o in documented_outputs():
                    self.assertTrue(os.path.exists(os.path.join(out, o)), f"build.sh did not make {o}")
                tree = {}
                for root, _, files in os.walk(out):
                    for f in files:
                        path = os.path.join(root, f)
                        st = os.lstat(path)
                        self.assertEqual(int(st.st_mtime), 1000, path)
                        self.assertIn(st.st_mode & 0o777, (0o444, 0o555), path)
                        with open(path, "rb") as fh:
                            tree[os.path.relpath(path, out)] = hashlib.file_digest(fh, "sha256").hexdigest()
                trees.append(tree)
            self.assertEqual(sorted(trees[0]), sorted(trees[1]))
            for name in trees[0]:
                self.assertTrue(trees[0][name] == trees[1][name], f"two builds gave different {name}")
            self.assertIn("rootfs/opt/tsar/lib/libtorch_cpu.so", trees[0])
            self.assertNotIn("rootfs/opt/tsar/lib/libtorch_cuda.so", trees[0])


if __name__ == "__main__":
    unittest.main()
