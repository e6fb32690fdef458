#!/usr/bin/python3
"""Checks samples/container/ without a container engine.

    /usr/bin/python3 tests/samples/container_test.py [-v]
    TSAR_CLI=build/cli/tsar /usr/bin/python3 tests/samples/container_test.py

- Dockerfile: every COPY source from the build context exists in the
  repository or is an output that build.sh documents and makes; none is
  excluded by Dockerfile.dockerignore; the build stage copies every directory
  the top-level CMakeLists.txt adds; the weights are COPYed as a layer of their
  own (--link, --chmod=0444), before the worker in the `server` target, and
  alone in the `weights` target.
- k8s/*.yaml: every document parses; the kinds are the expected ones; every
  worker mounts the weights read-only from an image volume or a hostPath, and
  its --archive lies inside that mount; the replicas are kept on one node.
- With TSAR_CLI set: build.sh runs twice into two directories, makes every
  file the Dockerfile copies, and both archives are byte-identical (the
  premise of a byte-identical layer), mode 0444, mtime SOURCE_DATE_EPOCH.
"""
import fnmatch
import json
import os
import shlex
import subprocess
import sys
import tempfile
import unittest

import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SAMPLE = os.path.join(REPO, "samples", "container")
BUILD_OUT = "samples/container/build/"  # where build.sh writes by default, relative to the context


def read(path):
    with open(path) as f:
        return f.read()


def dockerfile_instructions(text):
    """(stage, instruction, [args]) for every instruction, stage being the
    current FROM's `AS` name. Continuation lines are joined, comments dropped."""
    out, stage, pending = [], None, ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        word = word.upper()
        rest = rest.strip()
        if rest.startswith("["):
            args = json.loads(rest)
        else:
            args = shlex.split(rest)
        if word == "FROM":
            lower = [a.lower() for a in args]
            stage = args[lower.index("as") + 1] if "as" in lower else None
        out.append((stage, word, args))
    return out


def copy_parts(args):
    """(flags dict, sources, destination) of a COPY's arguments."""
    flags = {}
    rest = []
    for a in args:
        if a.startswith("--") and not rest:
            k, _, v = a[2:].partition("=")
            flags[k] = v
        else:
            rest.append(a)
    return flags, rest[:-1], rest[-1]


def dockerignore_patterns():
    patterns = []
    for line in read(os.path.join(SAMPLE, "Dockerfile.dockerignore")).splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            patterns.append(line)
    return patterns


def ignored(path, patterns):
    """Docker's rule, simplified: patterns are relative to the context root,
    match a path or any of its parents; the last matching pattern wins."""
    result = False
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for p in patterns:
        neg = p.startswith("!")
        pat = p[1:] if neg else p
        pat = pat.lstrip("/")
        hit = any(fnmatch.fnmatchcase(x, pat) for x in prefixes)
        if pat.startswith("**/"):
            hit = hit or any(fnmatch.fnmatchcase(x.split("/")[-1], pat[3:]) for x in prefixes)
        if hit:
            result = not neg
    return result


def documented_outputs():
    """Paths (relative to the context) that build.sh's header says it makes."""
    outs = []
    for line in read(os.path.join(SAMPLE, "build.sh")).splitlines():
        line = line.strip()
        if line.startswith("#   OUTDIR/"):
            outs.append(BUILD_OUT + line[len("#   OUTDIR/"):].split()[0])
    return outs


class DockerfileTest(unittest.TestCase):
    def setUp(self):
        self.ins = dockerfile_instructions(read(os.path.join(SAMPLE, "Dockerfile")))
        self.copies = [(stage, *copy_parts(args)) for stage, word, args in self.ins if word == "COPY"]

    def test_stages(self):
        stages = [s for s, w, _ in self.ins if w == "FROM"]
        for want in ["build", "runtime", "server", "server-without-weights", "weights"]:
            self.assertIn(want, stages)
        froms = {s: a[0] for s, w, a in self.ins if w == "FROM"}
        self.assertEqual(froms["weights"], "scratch")

    def test_copy_sources_exist_or_are_made_by_build_sh(self):
        outputs = documented_outputs()
        self.assertTrue(outputs, "build.sh documents no outputs")
        for stage, flags, sources, _ in self.copies:
            if "from" in flags:
                continue
            for src in sources:
                with self.subTest(stage=stage, src=src):
                    if os.path.exists(os.path.join(REPO, src)):
                        continue
                    self.assertTrue(src.startswith(BUILD_OUT), f"{src} is neither in the repository nor a build.sh output")
                    self.assertIn(src, outputs, f"{src} is not among build.sh's documented outputs {outputs}")

    def test_copy_sources_not_ignored(self):
        patterns = dockerignore_patterns()
        for stage, flags, sources, _ in self.copies:
            for src in sources if "from" not in flags else []:
                with self.subTest(src=src):
                    self.assertFalse(ignored(src.rstrip("/"), patterns), f"{src} is excluded by Dockerfile.dockerignore")

    def test_build_stage_copies_what_cmake_adds(self):
        copied = {src.rstrip("/") for stage, flags, sources, _ in self.copies if stage == "build" for src in sources}
        self.assertIn("CMakeLists.txt", copied)
        text = read(os.path.join(REPO, "CMakeLists.txt"))
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("add_subdirectory("):
                d = line[len("add_subdirectory("):].split(")")[0].split()[0]
                if d in ("tests", "bench"):  # off in the image: TSAR_BUILD_TESTS=OFF, TSAR_BUILD_BENCH off
                    continue
                with self.subTest(subdirectory=d):
                    self.assertTrue(any(d == c or d.startswith(c + "/") for c in copied),
                                    f"CMakeLists.txt adds {d}, which the build stage does not COPY")
        for c in copied:
            self.assertTrue(os.path.exists(os.path.join(REPO, c)), c)

    def weight_copies(self, stage):
        return [(f, s, d) for st, f, s, d in self.copies if st == stage and any(x.endswith(".tsar") for x in s)]

    def test_weights_are_a_layer_of_their_own(self):
        for stage in ["server", "weights"]:
            w = self.weight_copies(stage)
            self.assertEqual(len(w), 1, f"{stage}: expected one COPY of the archive")
            flags, sources, dest = w[0]
            self.assertEqual(len(sources), 1, f"{stage}: the archive's COPY must copy nothing else")
            self.assertIn("link", flags, f"{stage}: COPY --link keeps the layer independent of the base")
            self.assertEqual(flags.get("chmod"), "0444", f"{stage}: --chmod=0444 fixes the mode in the layer")
        # server: weights before the worker, so the weights' layer chain does not change with it.
        order = [(any(x.endswith(".tsar") for x in s), "from" in f) for st, f, s, d in self.copies if st == "server"]
        first_weights = next(i for i, (w, _) in enumerate(order) if w)
        first_worker = next(i for i, (_, fr) in enumerate(order) if fr)
        self.assertLess(first_weights, first_worker)
        # weights: nothing but the archive.
        self.assertEqual(len([c for c in self.copies if c[0] == "weights"]), 1)
        self.assertEqual([w for s, w, _ in self.ins if s == "weights"], ["FROM", "COPY"])
        # the worker images expect the archive where the manifests mount it.
        for stage in ["server", "server-without-weights"]:
            cmd = [a for s, w, a in self.ins if s == stage and w == "CMD"][0]
            self.assertEqual(cmd[cmd.index("--archive") + 1], "/models/resnet18.tsar")
        self.assertEqual(self.weight_copies("server")[0][2], "/models/resnet18.tsar")


def manifests():
    out = []
    for name in sorted(os.listdir(os.path.join(SAMPLE, "k8s"))):
        if name.endswith((".yaml", ".yml")):
            with open(os.path.join(SAMPLE, "k8s", name)) as f:
                out.append((name, [d for d in yaml.safe_load_all(f) if d is not None]))
    return out


class ManifestTest(unittest.TestCase):
    def test_parse_and_kinds(self):
        files = manifests()
        self.assertEqual([n for n, _ in files], ["hostpath.yaml", "image-volume.yaml"])
        kinds = {n: [d["kind"] for d in docs] for n, docs in files}
        self.assertEqual(kinds["image-volume.yaml"], ["Deployment"])
        self.assertEqual(kinds["hostpath.yaml"], ["DaemonSet", "Deployment"])
        for n, docs in files:
            for d in docs:
                with self.subTest(file=n, kind=d.get("kind")):
                    self.assertEqual(d["apiVersion"], "apps/v1")
                    self.assertTrue(d["metadata"]["name"])
                    labels = d["spec"]["template"]["metadata"]["labels"]
                    for k, v in d["spec"]["selector"]["matchLabels"].items():
                        self.assertEqual(labels.get(k), v, "selector must match the pod template")

    def check_worker(self, doc, source):
        spec = doc["spec"]
        self.assertGreaterEqual(spec["replicas"], 2)
        pod = spec["template"]["spec"]
        terms = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        self.assertTrue(any(t["topologyKey"] == "kubernetes.io/hostname" and
                            t["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"] for t in terms),
                        "replicas must land on one node to share its page cache")
        volumes = {v["name"]: v for v in pod["volumes"]}
        for c in pod["containers"]:
            mounts = c["volumeMounts"]
            self.assertTrue(mounts)
            for m in mounts:
                self.assertIs(m.get("readOnly"), True, f"{c['name']}: {m['name']} must be mounted readOnly")
                v = volumes[m["name"]]
                self.assertIn(source, v, f"volume {m['name']}: expected a {source} volume source")
            args = c["args"]
            archive = args[args.index("--archive") + 1]
            self.assertTrue(any(archive.startswith(m["mountPath"].rstrip("/") + "/") for m in mounts),
                            f"--archive {archive} is not inside a read-only mount")
            self.assertIs(c.get("stdin"), True, "the sample worker exits at EOF on stdin")
        return volumes

    def test_image_volume(self):
        (doc,) = dict(manifests())["image-volume.yaml"]
        volumes = self.check_worker(doc, "image")
        for v in volumes.values():
            self.assertTrue(v["image"]["reference"])
            self.assertIn(v["image"]["pullPolicy"], ["Always", "IfNotPresent", "Never"])

    def test_host_path(self):
        installer, worker = dict(manifests())["hostpath.yaml"]
        volumes = self.check_worker(worker, "hostPath")
        for v in volumes.values():
            self.assertTrue(v["hostPath"]["path"].startswith("/"))
            self.assertEqual(v["hostPath"]["type"], "Directory")
        # The installer writes where the workers read.
        paths = {v["hostPath"]["path"] for v in installer["spec"]["template"]["spec"]["volumes"]}
        self.assertEqual(paths, {v["hostPath"]["path"] for v in volumes.values()})
        script = installer["spec"]["template"]["spec"]["containers"][0]["command"][-1]
        self.assertIn("mv -f", script, "the installer must rename into place, never rewrite")


@unittest.skipUnless(os.environ.get("TSAR_CLI"), "set TSAR_CLI to the tsar executable to run build.sh")
class BuildTest(unittest.TestCase):
    def test_build_twice_same_bytes(self):
        env = dict(os.environ, SOURCE_DATE_EPOCH="1000")
        sources = [src for _, word, args in dockerfile_instructions(read(os.path.join(SAMPLE, "Dockerfile")))
                   if word == "COPY" for src in copy_parts(args)[1] if src.startswith(BUILD_OUT)
                   if "from" not in copy_parts(args)[0]]
        self.assertTrue(sources)
        with tempfile.TemporaryDirectory() as tmp:
            digests = []
            for run in ["a", "b"]:
                out = os.path.join(tmp, run)
                subprocess.run([os.path.join(SAMPLE, "build.sh"), os.environ["TSAR_CLI"], out], check=True,
                               env=env, stdout=subprocess.DEVNULL)
                for src in sources:
                    path = os.path.join(out, src[len(BUILD_OUT):])
                    with self.subTest(run=run, src=src):
                        self.assertTrue(os.path.isfile(path), f"build.sh did not make {src}")
                        st = os.stat(path)
                        self.assertEqual(st.st_mode & 0o777, 0o444)
                        self.assertEqual(int(st.st_mtime), 1000)
                with open(os.path.join(out, "models", "resnet18.tsar"), "rb") as f:
                    digests.append(f.read())
            self.assertTrue(digests[0] == digests[1], "two builds gave different archives")


if __name__ == "__main__":
    unittest.main()
