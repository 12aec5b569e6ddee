"""producers/kubelet_pods against a real HTTP(S) server answering like a kubelet: TLS checked against a CA made here,
the bearer token read from its file at each fetch, and every way a kubelet fails."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from producers.kubelet_pods import KubeletClient, KubeletError, PodContainer, parse_pod_list
from tests.kubelet_double import KubeletDouble, container_id, make_tls, pod, pod_list, pod_uid

LABELS = ("app.kubernetes.io/name", "team")
C1, C2, C3, C4 = (container_id(s) for s in ("c1", "c2", "c3", "c4"))
PODS = [
    pod("trainer-0", "ml", pod_uid(1), {"app.kubernetes.io/name": "trainer", "team": "vision", "pod-template-hash":
                                        "5d8f"}, [("main", f"containerd://{C1}"), ("sidecar", f"containerd://{C2}")],
        init=[("fetch", f"containerd://{C3}")]),
    pod("web", "default", pod_uid(2), {"team": "x" * 80}, [("nginx", f"cri-o://{C4}")],
        ephemeral=[("debugger", "docker://" + container_id("c5"))]),
    pod("pending", "default", pod_uid(3), {}, [("app", "")]),  # not started: no containerID yet
]


@pytest.fixture
def kubelet():
    doubles = []

    def start(**kwargs) -> KubeletDouble:
        doubles.append(KubeletDouble(**kwargs).start())
        return doubles[-1]

    yield start
    for d in doubles:
        d.stop()


def test_parse_pod_list_indexes_every_container_kind_and_cuts_labels() -> None:
    snap = parse_pod_list(pod_list(PODS), LABELS, max_value_len=16)
    trainer, web = snap.by_uid[pod_uid(1)], snap.by_uid[pod_uid(2)]
    assert trainer.labels == (("app.kubernetes.io/name", "trainer"), ("team", "vision"))  # pod-template-hash dropped
    assert web.labels == (("team", "x" * 16),)
    assert snap.labels_cut == 1
    assert snap.by_container == {C1: PodContainer(trainer, "main", "containerd"),
                                 C2: PodContainer(trainer, "sidecar", "containerd"),
                                 C3: PodContainer(trainer, "fetch", "containerd"),
                                 C4: PodContainer(web, "nginx", "cri-o"),
                                 container_id("c5"): PodContainer(web, "debugger", "docker")}
    assert set(snap.by_name) == {("ml", "trainer-0"), ("default", "web"), ("default", "pending")}
    assert len(snap) == 3


@pytest.mark.parametrize("body", [b"", b"{", b"[]", b'{"kind":"PodList"}', b'{"items":{}}', b"null"])
def test_not_a_pod_list_is_malformed(body: bytes) -> None:
    with pytest.raises(KubeletError) as err:
        parse_pod_list(body, LABELS, 64)
    assert err.value.reason == "malformed"


def test_items_that_are_not_pods_are_skipped() -> None:
    body = b'{"items":[1,"x",{"metadata":{}},{"metadata":{"uid":"u","name":"p","namespace":"n","labels":[]},' \
           b'"status":{"containerStatuses":[{"name":"c","containerID":7},"junk"]}}]}'
    snap = parse_pod_list(body, LABELS, 64)
    assert list(snap.by_uid) == ["u"] and snap.by_container == {}


def test_https_with_ca_and_token_reread_at_each_fetch(kubelet, tmp_path: Path) -> None:
    tls = make_tls(tmp_path)
    token = tmp_path / "token"
    token.write_text("first-token\n")
    double = kubelet(body=pod_list(PODS), token="first-token", tls=tls)
    client = KubeletClient(double.url, token_file=str(token), ca_file=str(tls.ca_file), timeout_s=5)
    assert set(client.fetch(LABELS, 64).by_container) == {C1, C2, C3, C4, container_id("c5")}
    double.token = "rotated-token"
    with pytest.raises(KubeletError) as err:
        client.fetch(LABELS, 64)
    assert err.value.reason == "unauthorized"
    token.write_text("rotated-token")
    assert len(client.fetch(LABELS, 64)) == 3
    assert double.requests == ["Bearer first-token", "Bearer first-token", "Bearer rotated-token"]
    client.close()


def test_tls_is_verified_by_default(kubelet, tmp_path: Path) -> None:
    double = kubelet(body=pod_list(PODS), tls=make_tls(tmp_path))
    client = KubeletClient(double.url, timeout_s=5)  # the system's CAs do not know this kubelet
    with pytest.raises(KubeletError) as err:
        client.fetch(LABELS, 64)
    assert err.value.reason == "tls"
    assert double.requests == []
    insecure = KubeletClient(double.url, insecure=True, timeout_s=5)
    assert len(insecure.fetch(LABELS, 64)) == 3


def test_read_only_port_sends_no_token(kubelet) -> None:
    double = kubelet(body=pod_list(PODS))
    assert len(KubeletClient(double.url, timeout_s=5).fetch(LABELS, 64)) == 3
    assert double.requests == [""]


def test_token_file_missing(kubelet, tmp_path: Path) -> None:
    double = kubelet(body=pod_list(PODS))
    with pytest.raises(KubeletError) as err:
        KubeletClient(double.url, token_file=str(tmp_path / "none"), timeout_s=5).fetch(LABELS, 64)
    assert err.value.reason == "token_unreadable"
    assert "none" in err.value.detail


@pytest.mark.parametrize(("mode", "reason"), [("unauthorized", "unauthorized"), ("malformed", "malformed")])
def test_failures_have_a_reason(kubelet, mode: str, reason: str) -> None:
    double = kubelet(body=pod_list(PODS), mode=mode)
    with pytest.raises(KubeletError) as err:
        KubeletClient(double.url, timeout_s=5).fetch(LABELS, 64)
    assert err.value.reason == reason


def test_slow_kubelet_times_out(kubelet) -> None:
    double = kubelet(body=pod_list(PODS), mode="slow")
    started = time.monotonic()
    with pytest.raises(KubeletError) as err:
        KubeletClient(double.url, timeout_s=0.3).fetch(LABELS, 64)
    assert err.value.reason == "timeout"
    assert time.monotonic() - started < 3


def test_connection_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(KubeletError) as err:
        KubeletClient(f"http://127.0.0.1:{port}", timeout_s=2).fetch(LABELS, 64)
    assert err.value.reason == "unreachable"


def test_answer_over_the_size_cap(kubelet) -> None:
    double = kubelet(body=pod_list(PODS))
    with pytest.raises(KubeletError) as err:
        KubeletClient(double.url, timeout_s=5, max_bytes=1000).fetch(LABELS, 64)
    assert err.value.reason == "too_large"


def test_five_thousand_pods(kubelet) -> None:
    pods = [pod(f"job-{i}", f"ns-{i % 50}", pod_uid(i), {"job-name": f"job-{i}", "team": f"t{i % 7}"},
                [("main", f"containerd://{container_id(f'm{i}')}"), ("log", f"containerd://{container_id(f'l{i}')}")])
            for i in range(5000)]
    double = kubelet(body=pod_list(pods))
    snap = KubeletClient(double.url, timeout_s=10).fetch(("job-name",), 64)
    assert len(snap) == 5000 and len(snap.by_container) == 10000
    hit = snap.by_container[container_id("m4321")]
    assert (hit.pod.name, hit.pod.namespace, hit.pod.labels, hit.name) == (
        "job-4321", "ns-21", (("job-name", "job-4321"),), "main")
