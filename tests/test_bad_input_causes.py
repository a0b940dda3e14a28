"""Errors name the real cause (issue 34, kind 4): an fc width checked against another target's hidden size names the
target the draft was trained for (not a wrong layer count), and an object-storage read without credentials says no
credentials were found (not the cloud instance-metadata endpoint's answer alone). The damaged draft and the
nothing-written-before-the-options cases are in test_eval_draft.py and test_bad_input_bounds.py."""

from __future__ import annotations

import os
import subprocess
import sys

from test_serving_preflight import eagle3_draft, llama_target

from eagle_io.serving import check_serving


def test_fc_width_against_another_targets_width_names_the_target_it_was_trained_for(tmp_path):
    # draft: 3 aux layers x target_hidden_size 64 = fc input 192; served on a target of hidden 32 (192 = 6 x 32) and
    # of hidden 96 (192 = 2 x 96): the fix said "trained on 6 (2) aux layers"
    for hidden in (32, 96):
        root = tmp_path / str(hidden)
        t, d = llama_target(root, hidden=hidden), eagle3_draft(root, eagle_ids=[1, 3, 4])
        fs = [f for f in check_serving(t, d, algorithm="EAGLE3") if f.code == "fc-width"]
        assert fs, check_serving(t, d, algorithm="EAGLE3")
        for f in fs:
            assert "trained for a target of hidden size 64" in f.fix and f"not this target's {hidden}" in f.fix
            assert "aux layers: set eagle_config" not in f.fix


def test_object_storage_without_credentials_says_so(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    # a metadata endpoint that refuses at once (CI machines have none; a cloud VM's would answer 403)
    env |= {"HOME": str(tmp_path), "AWS_METADATA_ENDPOINT": "http://127.0.0.1:9", "AWS_REGION": "us-east-1"}
    cmd = [sys.executable, "-m", "eagle_io.cli", "inspect", "s3://eagle-io-no-credentials/run"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "no object-storage credentials found" in done.stderr and "AWS_ACCESS_KEY_ID" in done.stderr
