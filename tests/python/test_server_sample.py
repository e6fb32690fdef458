"""samples/python-server: compare.py at a small scale (2 workers, a 16 MiB MLP)."""
import json
import os
import subprocess
import sys

from tsar_testutil import REPO, child_env

SAMPLE = os.path.join(REPO, "samples", "python-server")


def test_compare_tsar_against_torch_load(tmp_path):
    out = tmp_path / "result.json"
    workers = 2
    cmd = [sys.executable, os.path.join(SAMPLE, "compare.py"), "--workers", str(workers),
           "--inputs", "1024", "--hidden", "1024", "--depth", "4", "--outputs", "8",
           "--workdir", str(tmp_path / "work"), "--json", str(out), "--timeout", "120"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=child_env())
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    res = json.loads(out.read_text())
    assert res["answers_equal"] is True and res["left_running"] == []
    tsar_r, torch_r = res["results"]
    assert (tsar_r["label"], torch_r["label"]) == ("tsar", "torch.load")
    assert tsar_r["answer"]["output"] == torch_r["answer"]["output"]
    assert tsar_r["answer"]["mode"] == "tsar" and torch_r["answer"]["mode"] == "torch.load"
    assert len(tsar_r["answer"]["output"][0]) == 8
    weights_kib = res["weight_bytes"] / 1024
    assert weights_kib > 15 * 1024
    # The workers of the tsar server map one shared copy of the archive ...
    assert 0.9 * weights_kib <= tsar_r["archive_pss_kib"] <= 1.1 * weights_kib + 64
    # ... so their summed Pss is one copy of the weights (workers - 1 copies) below torch.load's.
    saved = torch_r["workers_pss_kib"] - tsar_r["workers_pss_kib"]
    assert saved >= 0.7 * (workers - 1) * weights_kib, f"tsar saves only {saved} kB:\n{r.stdout}"
    assert "answers equal: yes" in r.stdout
    for p in [tsar_r["master"], *tsar_r["workers"], torch_r["master"], *torch_r["workers"]]:
        assert not os.path.exists(f"/proc/{p}") or open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] == "Z", \
            f"process {p} is still running"


def test_hot_swap_serves_every_version_without_an_error_and_lets_the_old_ones_go(tmp_path):
    out = tmp_path / "hot.json"
    cmd = [sys.executable, os.path.join(SAMPLE, "hot_swap.py"), "--workers", "2", "--clients", "2",
           "--versions", "3", "--seconds", "0.7", "--inputs", "512", "--hidden", "512", "--depth", "4",
           "--json", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=child_env())
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    res = json.loads(out.read_text())
    assert res["errors"] == 0 and res["wrong"] == 0
    assert sorted(int(v) for v in res["served"]) == [1, 2, 3]
    assert all(n > 0 for n in res["served"].values())
    # Two workers share one copy before, and one copy of the last version after.
    assert 0.9 * res["file_size"] <= res["pss_before"] <= 1.05 * res["file_size"]
    assert 0.9 * res["file_size"] <= res["pss_after"] <= 1.05 * res["file_size"]
    assert "errors: 0   wrong answers: 0" in r.stdout


def test_transformers_server_answers_as_from_pretrained(tmp_path):
    """server.py --transformers: each worker loads model and tokenizer from the
    one archive (tsar.transformers); its greedy continuation is from_pretrained's."""
    import signal
    import time
    import urllib.request

    import pytest
    transformers = pytest.importorskip("transformers")
    import torch

    sys.path.insert(0, SAMPLE)
    try:
        import make_transformers_model
        hf, archive = make_transformers_model.make(str(tmp_path / "m"))
    finally:
        sys.path.remove(SAMPLE)
    ready = tmp_path / "ready.json"
    server = subprocess.Popen(
        [sys.executable, os.path.join(SAMPLE, "server.py"), "--transformers", archive,
         "--workers", "2", "--ready-file", str(ready)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
        start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert server.poll() is None, server.communicate()[1]
            assert time.monotonic() < deadline, "server not ready"
            time.sleep(0.1)
        info = json.loads(ready.read_text())
        url = f"http://127.0.0.1:{info['port']}"
        got = json.loads(urllib.request.urlopen(url + "/", timeout=60).read())
        body = json.dumps({"text": "the lazy fox", "max_new_tokens": 5}).encode()
        posted = json.loads(urllib.request.urlopen(
            urllib.request.Request(url + "/predict", data=body), timeout=60).read())
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=30)
    tok = transformers.AutoTokenizer.from_pretrained(hf)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf).eval()
    for answer, text, steps in ((got, "hello world", 8), (posted, "the lazy fox", 5)):
        ids = tok(text, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**ids, max_new_tokens=steps, do_sample=False,
                                 pad_token_id=tok.eos_token_id)
        assert answer["mode"] == "transformers" and answer["worker"] in info["workers"]
        assert answer["input_ids"] == ids["input_ids"][0].tolist()
        assert answer["output_ids"] == out[0, ids["input_ids"].shape[1]:].tolist()
        assert answer["text"] == tok.decode(answer["output_ids"])
