"""deploy/k8s validated offline: each manifest against the Kubernetes schemas that
kubernetes-validate ships (strict: unknown fields are errors), then what the schemas cannot
see: the two containers share the socket, probes and scrape annotations point at the
gateway, the Service, Ingress and HPA name what exists."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from uma_serve.gateway.prom import GAUGES

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
MANIFESTS = sorted(K8S.glob("*.yaml"))


def load(name: str) -> dict:
    return yaml.safe_load((K8S / name).read_text())


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_valid_offline(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_a_broken_manifest_is_caught() -> None:
    doc = load("deployment.yaml")
    doc["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_pod_wiring() -> None:
    deploy = load("deployment.yaml")
    pod = deploy["spec"]["template"]
    spec = pod["spec"]
    containers = {c["name"]: c for c in spec["containers"]}
    assert set(containers) == {"umad", "gateway"}
    socket_volume = next(v for v in spec["volumes"] if "emptyDir" in v)["name"]
    sockets = set()
    for c in containers.values():
        env = {e["name"]: e.get("value") for e in c["env"]}
        mount = next(m for m in c["volumeMounts"] if m["name"] == socket_volume)["mountPath"]
        assert env["UMA_SOCKET"].startswith(mount + "/")
        sockets.add(env["UMA_SOCKET"])
    assert len(sockets) == 1  # the gateway talks to its own core
    gw = containers["gateway"]
    port = next(p for p in gw["ports"] if p["name"] == "http")["containerPort"]
    assert gw["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    notes = pod["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true" and notes["prometheus.io/port"] == str(port)
    assert notes["prometheus.io/path"] == "/metrics"
    labels = pod["metadata"]["labels"]
    assert deploy["spec"]["selector"]["matchLabels"].items() <= labels.items()

    service = load("service.yaml")
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    backend = load("ingress.yaml")["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": service["metadata"]["name"], "port": {"name": "http"}}

    hpa = load("hpa.yaml")["spec"]
    assert hpa["scaleTargetRef"]["name"] == deploy["metadata"]["name"]
    metric = hpa["metrics"][0]["pods"]["metric"]["name"]
    assert metric == "uma_num_requests_waiting" and metric in {g.name for g in GAUGES}
    adapter = yaml.safe_load((K8S / "adapter" / "values.yaml").read_text())
    assert adapter["rules"]["custom"][0]["name"]["as"] == metric


def test_pod_runs_the_image_make_image_builds_as_its_user() -> None:
    """The containers name localhost/uma-serve:<version> (deploy/image/build.sh's tag) and run
    as the image's user on a read-only root filesystem, as tests/integration/
    test_container_image.py runs that image."""
    root = K8S.parents[1]
    build = (root / "deploy" / "image" / "build.sh").read_text()
    version = re.search(r'^version = "(.+)"', (root / "pyproject.toml").read_text(), re.M)[1]
    name = re.search(r"UMA_IMAGE_NAME:-([^}]+)}", build)[1]
    uid, gid = re.search(r"^UID_GID=(\d+):(\d+)$", build, re.M).groups()
    spec = load("deployment.yaml")["spec"]["template"]["spec"]
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] and (pod["runAsUser"], pod["runAsGroup"]) == (int(uid), int(gid))
    for c in spec["containers"]:
        assert c["image"] == f"{name}:{version}"
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
