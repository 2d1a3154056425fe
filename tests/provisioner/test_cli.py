"""``dockyard-provision``: provision and detach, reap, and a clean error without a cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("kubernetes")

from sandbox_client.provisioner.cli import main

from .conftest import NAMESPACE, Harness


def test_provision_detach_then_reap(harness: Harness, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKYARD_K8S_POLL_INTERVAL", "0.01")
    api = ["--job", "cli-job", "--namespace", NAMESPACE, "--api-host", harness.server.url]
    assert main(["provision", *api, "--count", "2", "--rate", "100", "--detach"]) == 0
    urls = capsys.readouterr().out.split()
    assert len(urls) == 2 and all(u.startswith("http://127.") for u in urls)
    assert len(harness.job_pods("cli-job")) == 2
    assert main(["reap", *api]) == 0
    assert "2 pods deleted, 0 left" in capsys.readouterr().out
    assert harness.job_pods("cli-job") == []


def test_no_cluster_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "DOCKYARD_K8S_HOST"):
        monkeypatch.delenv(name, raising=False)
    assert main(["reap", "--job", "x"]) == 2
    assert "no Kubernetes configuration" in caplog.text
