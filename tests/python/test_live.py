"""tsar.LiveModule: hot swap in Python (a module that follows the archive at a path)."""
import gc
import os
import shutil
import threading
import time

import pytest
import torch

import tsar
from tsar_testutil import wait_for

DIM = 64


def make():
    with torch.device("meta"):
        return torch.nn.Linear(DIM, DIM).eval()


def version_state(k):
    """A version whose every weight is k and bias 0: y = k * sum(x) everywhere."""
    return {"weight": torch.full((DIM, DIM), float(k)), "bias": torch.zeros(DIM)}


def publish(path, k, tmp):
    """tsar.save to a temporary name, then rename over `path` (what tsar.save does)."""
    tsar.save(version_state(k), path)


def which(module, x=torch.ones(1, DIM)):
    """The k of the version `module` holds, from one forward."""
    y = module(x)
    k = y / DIM
    assert torch.all(k == k[0, 0]), "an output mixes versions"
    return int(k[0, 0])


def mapped_inodes():
    out = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 5 and parts[4] != "0":
                out.add(int(parts[4]))
    return out


def test_a_renamed_version_is_served_and_the_old_one_released_when_let_go(tmp_path):
    path = tmp_path / "m.tsar"
    publish(path, 1, tmp_path)
    first_inode = os.stat(path).st_ino
    events = []
    with tsar.LiveModule(path, make, poll_interval=0.05, on_event=events.append) as live:
        assert live.version == 1 and which(live.get()) == 1
        held = live.get()  # a request in flight on version 1
        publish(path, 2, tmp_path)
        assert wait_for(lambda: live.version == 2)
        module, version = live.current()
        assert version == 2 and which(module) == 2
        assert events and events[-1].kind == "swapped" and events[-1].version == 2
        assert events[-1].load_ms > 0 and events[-1].error == ""
        # The request holding version 1 still runs on it, over the replaced file.
        assert which(held) == 1
        assert first_inode in mapped_inodes()
        del held
        gc.collect()
        assert first_inode not in mapped_inodes(), "the old version's mapping is released"
        s = live.stats()
        assert s["swaps"] == 1 and s["refusals"] == 0 and s["version"] == 2 and s["watching"]


def test_a_file_written_then_closed_at_the_path_is_taken(tmp_path):
    path = tmp_path / "m.tsar"
    publish(path, 1, tmp_path)
    tsar.save(version_state(5), tmp_path / "next.tsar")
    with tsar.LiveModule(path, make, poll_interval=0) as live:  # inotify only
        os.unlink(path)
        shutil.copyfile(tmp_path / "next.tsar", path)  # a new file, closed after writing
        assert wait_for(lambda: live.version == 2)
        assert which(live.get()) == 5


def test_bad_files_are_refused_once_each_and_a_good_one_then_taken(tmp_path):
    path = tmp_path / "m.tsar"
    publish(path, 1, tmp_path)
    good = (tmp_path / "m.tsar").read_bytes()
    tsar.save({"other": torch.zeros(3)}, tmp_path / "other.tsar")
    state = {"make_fails": False, "warm_fails": False}

    def maker():
        if state["make_fails"]:
            raise RuntimeError("make failed on purpose")
        return make()

    def warm_up(m):
        if state["warm_fails"]:
            raise RuntimeError("warm-up failed on purpose")
        m(torch.ones(1, DIM))

    events = []
    live = tsar.LiveModule(path, maker, warm_up=warm_up, poll_interval=0, inotify=False,
                           on_event=events.append)
    try:
        def put(data):
            tmp = tmp_path / "incoming"
            tmp.write_bytes(data)
            os.replace(tmp, path)

        cases = [
            (lambda: put(good[: len(good) // 2]), "file_size: expected a file of"),
            (lambda: put(b"not an archive at all" * 10), "magic"),
            (lambda: put((tmp_path / "other.tsar").read_bytes()), "do not match"),
            (lambda: (state.update(make_fails=True), publish(path, 3, tmp_path)), "make failed"),
            (lambda: (state.update(make_fails=False, warm_fails=True), publish(path, 4, tmp_path)),
             "warm-up failed"),
        ]
        # A file with one flipped byte in a storage: refused by the full verify.
        damaged = bytearray(good)
        damaged[-5] ^= 0xFF
        cases.insert(2, (lambda: put(bytes(damaged)), "(tensors \"model/bias\"): xxh3: expected"))
        for n, (do, words) in enumerate(cases, start=1):
            do()
            assert live.check() is False
            assert live.version == 1 and which(live.get()) == 1
            assert words in live.last_error, (words, live.last_error)
            # A refused file never got a version: None, not the one still serving.
            assert events[-1].kind == "refused" and events[-1].version is None
            assert live.stats()["refusals"] == n
            assert live.check() is False and live.stats()["refusals"] == n, "not retried unchanged"
        state["warm_fails"] = False
        publish(path, 7, tmp_path)
        assert live.check() is True
        assert live.version == 2 and which(live.get()) == 7 and events[-1].kind == "swapped"
        assert live.stats()["warm_up_ms"] > 0
    finally:
        live.close()


def test_four_threads_serve_while_twenty_versions_and_bad_files_are_published(tmp_path):
    path = tmp_path / "m.tsar"
    publish(path, 1, tmp_path)
    live = tsar.LiveModule(path, make, poll_interval=0.02)
    errors, seen, stop = [], set(), threading.Event()

    def serve():
        try:
            while not stop.is_set():
                module, version = live.current()
                k = which(module)  # asserts one version's weights, never a mix
                seen.add((version, k))
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=serve) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for k in range(2, 22):
            publish(path, k, tmp_path)
            assert wait_for(lambda: which(live.get()) == k), k
            if k % 5 == 0:
                (tmp_path / "bad").write_bytes(b"\x89TSAR\r\n\x1a" + b"\0" * 100)
                os.replace(tmp_path / "bad", path)
                assert wait_for(lambda: live.stats()["refusals"] == k // 5)
                publish(path, k, tmp_path)  # the same weights again: a new version
                assert wait_for(lambda: live.stats()["refusals"] == k // 5 and live.version > 0)
    finally:
        stop.set()
        for t in threads:
            t.join()
        live.close()
    assert errors == []
    # Each version number always came with the same weights.
    by_version = {}
    for version, k in seen:
        assert by_version.setdefault(version, k) == k
    assert len(by_version) >= 10


def test_close_with_requests_in_flight(tmp_path):
    path = tmp_path / "m.tsar"
    publish(path, 1, tmp_path)
    live = tsar.LiveModule(path, make, poll_interval=0.02)
    started, release, result = threading.Event(), threading.Event(), []

    def request():
        module = live.get()
        started.set()
        release.wait()
        result.append(which(module))

    t = threading.Thread(target=request)
    t.start()
    started.wait()
    thread = live._thread
    live.close()
    assert not thread.is_alive() and live.stats()["watching"] is False
    publish(path, 2, tmp_path)
    time.sleep(0.1)
    assert live.version == 1, "a closed LiveModule does not follow the path"
    release.set()
    t.join()
    assert result == [1] and which(live.get()) == 1
    with pytest.raises(ValueError, match="closed"):
        live.check()


def test_a_first_file_that_cannot_serve_raises(tmp_path):
    with pytest.raises(tsar.Error):
        tsar.LiveModule(tmp_path / "missing.tsar", make)
    with pytest.raises(ValueError, match="verify: expected one of full, index"):
        tsar.LiveModule(tmp_path / "m.tsar", make, verify="some")


def test_a_live_module_made_before_a_fork_follows_in_the_child(tmp_path):
    path = tmp_path / "m.tsar"
    publish(path, 1, tmp_path)
    live = tsar.LiveModule(path, make, poll_interval=0.02)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own watcher, the parent's version to start with
        ok = False
        try:
            ok = live.stats()["watching"] and live._thread.is_alive() and which(live.get()) == 1
            publish(path, 9, tmp_path)
            ok = ok and wait_for(lambda: live.version == 2) and which(live.get()) == 9
        finally:
            os.write(w, b"1" if ok else b"0")
            os._exit(0)
    os.close(w)
    try:
        assert os.read(r, 1) == b"1", "the child did not follow the path"
        os.waitpid(pid, 0)
        assert wait_for(lambda: live.version == 2) and which(live.get()) == 9  # and the parent too
    finally:
        os.close(r)
        live.close()
