"""Doubles of the kubelet for the identity tests: a real HTTP(S) server answering GET /pods with a core/v1 PodList
(built field by field from the published types), and a real gRPC server implementing the pod-resources API v1
`List` on a unix socket. Both are told how to misbehave: 401, slow (held on an Event), malformed, down.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import json
import ssl
import threading
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from producers.kubelet_podresources_v1 import api_pb2, api_pb2_grpc


def container_id(seed: str) -> str:
    """A 64-hex container id, stable per seed."""
    return hashlib.sha256(seed.encode()).hexdigest()


def pod_uid(n: int) -> str:
    return f"{n:08x}-1b2c-4d3e-8f4a-{n:012x}"


def pod(name: str, namespace: str, uid: str, labels: dict[str, str], containers: list[tuple[str, str]],
        init: list[tuple[str, str]] = (), ephemeral: list[tuple[str, str]] = ()) -> dict:
    """A v1.Pod as the kubelet's /pods writes it; containers are (name, containerID with its runtime scheme)."""
    def statuses(items: list[tuple[str, str]]) -> list[dict]:
        return [{"name": n, "state": {"running": {"startedAt": "2025-01-01T00:00:00Z"}}, "lastState": {},
                 "ready": True, "restartCount": 0, "image": "registry.example/app:1", "imageID":
                 "registry.example/app@sha256:" + "0" * 64, "containerID": cid, "started": True} for n, cid in items]
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "1",
                     "creationTimestamp": "2025-01-01T00:00:00Z", "labels": labels,
                     "annotations": {"kubernetes.io/config.seen": "2025-01-01T00:00:00Z"},
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid,
                                          "controller": True}]},
        "spec": {"nodeName": "node-1", "restartPolicy": "Never", "serviceAccountName": "default",
                 "containers": [{"name": n, "image": "registry.example/app:1", "resources": {}}
                                for n, _ in containers]},
        "status": {"phase": "Running", "hostIP": "10.0.0.1", "podIP": "10.1.0.5", "qosClass": "Burstable",
                   "startTime": "2025-01-01T00:00:00Z",
                   "conditions": [{"type": "Ready", "status": "True"}],
                   "initContainerStatuses": statuses(list(init)), "containerStatuses": statuses(containers),
                   **({"ephemeralContainerStatuses": statuses(list(ephemeral))} if ephemeral else {})},
    }


def pod_list(pods: list[dict]) -> bytes:
    return json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": pods}).encode()


@dataclass
class Tls:
    ca_file: Path
    cert_file: Path
    key_file: Path


def make_tls(directory: Path) -> Tls:
    """A CA and a server certificate it signed, for 127.0.0.1 and localhost."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test kubelet CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "node-1")])).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    tls = Tls(directory / "ca.crt", directory / "kubelet.crt", directory / "kubelet.key")
    tls.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    tls.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    tls.key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    return tls


@dataclass
class KubeletDouble:
    """GET /pods. `mode`: ok, unauthorized (401 whatever the token), malformed, slow (waits for `release`);
    with `token` set, a request without `Authorization: Bearer <token>` gets 401."""

    body: bytes = b""
    token: str | None = None
    mode: str = "ok"
    release: threading.Event = field(default_factory=threading.Event)
    requests: list[str] = field(default_factory=list)  # the Authorization header of each request
    tls: Tls | None = None
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> KubeletDouble:
        double = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                double.requests.append(self.headers.get("Authorization", ""))
                if self.path != "/pods":
                    return self._answer(404, b"404 page not found")
                if double.mode == "slow":
                    double.release.wait(30)
                if double.mode == "unauthorized" or (
                        double.token is not None and self.headers.get("Authorization") != f"Bearer {double.token}"):
                    return self._answer(401, b"Unauthorized")
                self._answer(200, b'{"kind":"PodList","items":[{"metadata":' if double.mode == "malformed"
                             else double.body)

            def _answer(self, status: int, body: bytes) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the client gave up (its timeout)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if self.tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(self.tls.cert_file, self.tls.key_file)
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.release.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


class PodResourcesDouble(api_pb2_grpc.PodResourcesListerServicer):
    """PodResourcesLister.List on a unix socket: `pods` is [(namespace, pod, [(container, [(resource, [ids])])])]."""

    def __init__(self, socket_path: Path, pods: list) -> None:
        self.pods = pods
        self.calls = 0
        self.socket_path = socket_path
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{socket_path}")

    def List(self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext  # noqa: N802
             ) -> api_pb2.ListPodResourcesResponse:
        self.calls += 1
        return api_pb2.ListPodResourcesResponse(pod_resources=[
            api_pb2.PodResources(name=name, namespace=ns, containers=[
                api_pb2.ContainerResources(name=cname, devices=[
                    api_pb2.ContainerDevices(resource_name=res, device_ids=ids) for res, ids in devices])
                for cname, devices in containers])
            for ns, name, containers in self.pods])

    def start(self) -> PodResourcesDouble:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop(grace=None)
