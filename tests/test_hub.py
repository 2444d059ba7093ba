"""--push_to_hub: what the Hub would receive. No Hub is reachable here, so the run goes through a wrapper that stands
in for huggingface_hub's create_repo and upload_folder and records the folder's contents at the moment of the
upload (after the Trainer's ignore patterns) - the files the Hub's model page and training-metrics tab would see."""

import fnmatch
import json
import os
import sys
import textwrap

from conftest import TINY, run

WRAPPER = textwrap.dedent('''
    import json, os, sys
    from pathlib import Path
    import huggingface_hub

    class Repo:
        repo_id = "me/tiny-run"

    def create_repo(self, repo_id, **kwargs):
        return Repo()

    def upload_folder(self, *, folder_path, ignore_patterns=(), **kwargs):
        import fnmatch
        files = sorted(str(p.relative_to(folder_path)) for p in Path(folder_path).rglob("*") if p.is_file())
        kept = [f for f in files if not any(fnmatch.fnmatch(f, pat) or fnmatch.fnmatch(f.split("/")[0], pat)
                                            for pat in ignore_patterns)]
        record = {"files": kept, "results": json.loads((Path(folder_path) / "results.json").read_text())}
        Path(os.environ["UPLOAD_RECORD"]).write_text(json.dumps(record))

    huggingface_hub.HfApi.create_repo = create_repo
    huggingface_hub.HfApi.upload_folder = upload_folder
    import transformers.utils.hub as hub
    hub.hf_api = lambda: huggingface_hub.HfApi()
    import transformers.trainer as trainer_module
    trainer_module.hf_api = hub.hf_api
    sys.argv = ["train.py", *sys.argv[1:]]
    from hfscale.train import main
    main()
''')


def test_push_to_hub_uploads_results_and_tensorboard_events(tmp_path):
    wrapper = tmp_path / "push_wrapper.py"
    wrapper.write_text(WRAPPER)
    record_file = tmp_path / "upload.json"
    out = tmp_path / "run"
    env = {**os.environ, "UPLOAD_RECORD": str(record_file), "HF_HUB_OFFLINE": "0", "OMP_NUM_THREADS": "1"}
    proc = run([sys.executable, str(wrapper), *TINY, "--max_steps", "3", "--push_to_hub", "--output_dir", str(out)],
               timeout=300, environ=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    uploaded = json.loads(record_file.read_text())
    files = uploaded["files"]
    assert "results.json" in files and uploaded["results"]["status"] == "ok"  # the final results, not "running"
    assert any(fnmatch.fnmatch(f, "*tfevents*") for f in files)  # the Hub's training-metrics tab reads these
    assert "model.safetensors" in files and "config.json" in files
    assert not any(f.startswith("checkpoint-") for f in files)
