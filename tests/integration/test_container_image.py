"""The image `make image` builds, run as deploy/k8s/deployment.yaml runs it: two containers (umad
and uma-gateway, the Pod's commands and environment) sharing the core's socket on a volume,
each as the image's non-root user on a read-only root filesystem with no capability; the real
`openai` SDK gets a completion and /metrics answers through the gateway's port (podman's host
network here). The build is cached (deploy/image/build.sh): a second run only checks."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from openai import OpenAI

from .gateway_helpers import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(3600)]
ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "deploy" / "image" / "containers.conf"
POD = yaml.safe_load((ROOT / "deploy" / "k8s" / "deployment.yaml").read_text())["spec"]["template"]
PODMAN_ENV = {**os.environ, "CONTAINERS_CONF": str(CONF)}


def podman(*args: str, check: bool = True, timeout: float = 120) -> str:
    out = subprocess.run(["podman", *args], env=PODMAN_ENV, capture_output=True, text=True,
                         timeout=timeout)  # fmt: skip
    if check and out.returncode:
        raise AssertionError(f"podman {' '.join(args)}: {out.returncode}\n{out.stderr}")
    return out.stdout.strip()


def logs(name: str) -> str:
    """A container's stdout and stderr (podman logs gives each on its own stream)."""
    out = subprocess.run(["podman", "logs", name], env=PODMAN_ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=60)  # fmt: skip
    return out.stdout


@pytest.fixture(scope="module")
def image() -> str:
    """The Pod's image, built (or found up to date) by `make image`'s script."""
    if shutil.which("podman") is None or shutil.which("mmdebstrap") is None:
        pytest.skip("podman or mmdebstrap is not installed (`make install` installs both)")
    subprocess.run(["nice", "-n", "19", "sh", str(ROOT / "deploy/image/build.sh")], check=True,
                   env=PODMAN_ENV, timeout=3300)  # fmt: skip
    name = POD["spec"]["containers"][0]["image"]
    podman("image", "exists", name)  # what the manifest names is what the script built
    return name


def run_args(container: dict, name: str, socket_dir: Path) -> list[str]:
    """`podman run` of one of the Pod's containers, with its securityContext's constraints."""
    pod, own = POD["spec"]["securityContext"], container["securityContext"]
    assert own["readOnlyRootFilesystem"] and own["capabilities"]["drop"] == ["ALL"]
    env = [f"--env={e['name']}={e['value']}" for e in container["env"]]
    mount = container["volumeMounts"][0]["mountPath"]
    return [
        "run", "--detach", f"--name={name}", "--read-only", "--read-only-tmpfs=false",
        f"--user={pod['runAsUser']}:{pod['runAsGroup']}", "--cap-drop=ALL",
        "--security-opt=no-new-privileges", f"--volume={socket_dir}:{mount}", *env,
    ]  # fmt: skip


@dataclass
class Pod:
    url: str  # the gateway's
    names: dict[str, str]  # the Pod's container name -> its podman container


@pytest.fixture(scope="module")
def pod(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    """umad and uma-gateway as the Pod runs them."""
    socket_dir = tmp_path_factory.mktemp("uma-socket")
    uid, gid = (
        POD["spec"]["securityContext"]["runAsUser"],
        POD["spec"]["securityContext"]["fsGroup"],
    )
    os.chown(socket_dir, uid, gid)  # the emptyDir, writable by the Pod's fsGroup
    containers = {c["name"]: c for c in POD["spec"]["containers"]}
    port, tag = free_port(), uuid.uuid4().hex[:8]
    names = {"umad": f"uma-core-{tag}", "gateway": f"uma-gateway-{tag}"}
    try:
        for role, extra in (("umad", ["--threads=2"]), ("gateway", [f"--port={port}"])):
            c = containers[role]
            podman(*run_args(c, names[role], socket_dir), image, *c["command"], *extra)
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, names)
        yield Pod(url, names)
    finally:
        for name in names.values():
            podman("stop", "--time=40", name, check=False, timeout=60)
            print(f"--- {name}:\n{logs(name)}")
            podman("rm", "--force", name, check=False)


def wait_ready(url: str, names: dict[str, str], timeout: float = 300) -> None:
    """Until /health says ok (the core loaded its model); a container that exits fails."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name in names.values():
            state = podman("inspect", "--format={{.State.Status}}", name)
            assert state == "running", f"{name} is {state}:\n{logs(name)}"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise AssertionError(f"the Pod was not ready within {timeout} s")


def test_completion_and_metrics_through_the_gateway_port(pod: Pod) -> None:
    sdk = OpenAI(base_url=f"{pod.url}/v1", api_key="none", max_retries=0)
    model = sdk.models.list().data[0].id
    answer = sdk.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8
    )
    assert answer.choices[0].message.content and answer.usage.completion_tokens > 0
    metrics = httpx.get(f"{pod.url}/metrics", timeout=10)
    assert metrics.status_code == 200
    assert "uma_num_requests_waiting" in metrics.text


def test_runs_as_the_non_root_user_on_a_read_only_root(pod: Pod) -> None:
    uid = str(POD["spec"]["securityContext"]["runAsUser"])
    for name in pod.names.values():
        assert podman("exec", name, "id", "-u") == uid
        denied = subprocess.run(["podman", "exec", name, "touch", "/opt/uma/x"], env=PODMAN_ENV,
                                capture_output=True, text=True)  # fmt: skip
        assert denied.returncode != 0 and "Read-only file system" in denied.stderr


def test_the_image_has_no_compiler(image: str) -> None:
    """The build stage's toolchain stays there: the runtime image has no cc, c++ or cmake."""
    found = podman(
        "run",
        "--rm",
        image,
        "sh",
        "-c",
        "for c in cc gcc c++ cmake make; do command -v $c; done; true",
    )
    assert found == ""


def test_default_command_serves_both_read_only(image: str) -> None:
    """The documented one-container run (`podman run IMAGE`: umad and uma-gateway together)
    answers the SDK, also on a read-only root (podman gives /tmp a tmpfs, the socket's home)."""
    port, name = free_port(), f"uma-one-{uuid.uuid4().hex[:8]}"
    try:
        podman("run", "--detach", f"--name={name}", "--read-only", f"--env=UMA_PORT={port}", image)
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, {"one": name})
        sdk = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        answer = sdk.completions.create(
            model=sdk.models.list().data[0].id, prompt="Once upon a time", max_tokens=4
        )
        assert answer.choices[0].text
    finally:
        podman("stop", "--time=40", name, check=False, timeout=60)
        print(f"--- {name}:\n{logs(name)}")
        podman("rm", "--force", name, check=False)


def test_stop_drains_umad(pod: Pod) -> None:
    """SIGTERM (podman stop, as the kubelet's) drains umad, which exits 0 (last: ends the Pod)."""
    core = pod.names["umad"]
    podman("stop", "--time=40", core, timeout=60)
    assert podman("inspect", "--format={{.State.ExitCode}}", core) == "0"
    assert "umad stopped" in logs(core)


def test_llama_cpp_is_the_portable_x86_64_v3_build(image: str) -> None:
    """Compiled for AVX2 (x86-64-v3), not for the build host: a native build on a host with
    AVX-512 or AMX (as this project's machines have) would list those and fail elsewhere."""
    info = podman(
        "run", "--rm", image, "python", "-c",
        "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())",
    )  # fmt: skip
    cpu = info.split("CPU :")[1].split("|")
    isa = {f.split("=")[0].strip() for f in cpu if f.strip().endswith("= 1")}
    isa -= {"LLAMAFILE", "OPENMP", "REPACK"}  # not instruction sets
    assert isa == {"SSE3", "SSSE3", "AVX", "AVX2", "F16C", "FMA", "BMI2"}, info
