"""Credentials and endpoint from an AWS named profile (``AWS_PROFILE``, ``~/.aws/credentials``, ``~/.aws/config``;
docs/STORAGE.md), which object_store does not read itself; against the real s3s-fs of tests/helpers/s3server.py
(skipped, saying why, without it)."""

from __future__ import annotations

import pytest
import test_object_store
from helpers import s3server
from test_object_store import served_dataset

import eagle_io

s3 = test_object_store.s3  # the running server fixture

pytestmark = pytest.mark.skipif(s3server.available() is not None, reason=str(s3server.available()))


def use_profile(monkeypatch, tmp_path, server, secret: str) -> None:
    """Only AWS_PROFILE, AWS_ALLOW_HTTP and the two file locations in the environment; the rest in the files."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT",
                "AWS_ENDPOINT_URL"):  # fmt: skip
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "credentials").write_text(
        f"[default]\naws_access_key_id = nobody\naws_secret_access_key = wrong\n\n"
        f"[eagle]\naws_access_key_id = {s3server.ACCESS_KEY}\naws_secret_access_key = {secret}\n"
    )
    (tmp_path / "config").write_text(f"[profile eagle]\nregion = us-east-1\nendpoint_url = {server.endpoint}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_PROFILE", "eagle")


def test_named_profile_gives_keys_region_and_endpoint(s3, tmp_path, monkeypatch):
    url, _, samples = served_dataset(s3, n=4)
    use_profile(monkeypatch, tmp_path, s3, s3server.SECRET_KEY)
    ds = eagle_io.Dataset(url)
    assert sorted(ds[p]["sample_id"] for p in range(len(ds))) == sorted(samples)


def test_profile_secret_is_used_and_a_missing_profile_is_named(s3, tmp_path, monkeypatch):
    url, _, _ = served_dataset(s3, n=2)
    use_profile(monkeypatch, tmp_path, s3, "not-the-secret")
    with pytest.raises(eagle_io.ObjectStorageError) as e:
        eagle_io.Dataset(url)
    assert e.value.status == 403, "the profile's (wrong) secret signed the request"
    url2, _, _ = served_dataset(s3, n=2)
    monkeypatch.setenv("AWS_PROFILE", "absent")
    with pytest.raises(eagle_io.ObjectStorageError) as m:
        eagle_io.Dataset(url2)
    assert "AWS_PROFILE=absent" in str(m.value) and str(tmp_path / "credentials") in str(m.value)
