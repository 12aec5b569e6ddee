"""The kubelet's pod list (GET /pods on its authenticated port with the service account's token, or on the old
read-only port), reduced to what identities need: container id -> pod and container name, pod uid -> pod.

Called only from the identity resolver's background thread. Short timeouts and a size cap: a kubelet that is slow,
down, refuses the token or answers nonsense gives a KubeletError with a short reason, never a hang.
"""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass, field

import httpx
import orjson

# containerStatuses[].containerID scheme -> runtime, as cgroup_identity names them
RUNTIMES = {"containerd": "containerd", "cri-o": "cri-o", "docker": "docker"}
STATUS_LISTS = ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses")
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_TOKEN_FILE = f"{SERVICE_ACCOUNT}/token"
DEFAULT_CA_FILE = f"{SERVICE_ACCOUNT}/ca.crt"


class KubeletError(Exception):
    """A refresh that failed; `reason` is one of REASONS."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


REASONS = ("unreachable", "timeout", "tls", "unauthorized", "forbidden", "http_error", "too_large", "malformed",
           "token_unreadable")


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    uid: str
    labels: tuple[tuple[str, str], ...]  # the allowed ones, sorted, values cut
    containers: tuple[tuple[str, str, str], ...] = ()  # (container name, runtime, container id)


@dataclass(frozen=True)
class PodContainer:
    pod: Pod
    name: str
    runtime: str


@dataclass
class PodSnapshot:
    """One answer of the kubelet, indexed."""

    by_container: dict[str, PodContainer] = field(default_factory=dict)
    by_uid: dict[str, Pod] = field(default_factory=dict)
    by_name: dict[tuple[str, str], Pod] = field(default_factory=dict)  # (namespace, name)
    labels_cut: int = 0  # label values cut to the length limit in this answer

    def __len__(self) -> int:
        return len(self.by_uid)


def _str(obj: dict, key: str) -> str:
    value = obj.get(key)
    return value if isinstance(value, str) else ""


def parse_pod_list(data: bytes, allowed_labels: tuple[str, ...], max_value_len: int) -> PodSnapshot:
    """Index a PodList (core/v1 JSON). Raises KubeletError('malformed') when it is not one; items that are not
    pods are skipped."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise KubeletError("malformed", f"{len(data)} bytes that are not JSON") from None
    items = doc.get("items") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise KubeletError("malformed", "no PodList items")
    allowed = set(allowed_labels)
    snap = PodSnapshot()
    for item in items:
        meta = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(meta, dict) or not _str(meta, "uid"):
            continue
        labels = []
        raw_labels = meta.get("labels")
        for key, value in (raw_labels.items() if isinstance(raw_labels, dict) else ()):
            if key in allowed and isinstance(value, str):
                if len(value) > max_value_len:
                    value = value[:max_value_len]
                    snap.labels_cut += 1
                labels.append((key, value))
        status = item.get("status")
        containers = []
        for list_name in STATUS_LISTS:
            statuses = status.get(list_name) if isinstance(status, dict) else None
            for cs in statuses if isinstance(statuses, list) else ():
                if not isinstance(cs, dict):
                    continue
                scheme, sep, cid = _str(cs, "containerID").partition("://")
                if sep and cid:
                    containers.append((_str(cs, "name"), RUNTIMES.get(scheme, scheme), cid))
        pod = Pod(_str(meta, "name"), _str(meta, "namespace"), _str(meta, "uid"), tuple(sorted(labels)),
                  tuple(containers))
        snap.by_uid[pod.uid] = pod
        snap.by_name[(pod.namespace, pod.name)] = pod
        for name, runtime, cid in containers:
            snap.by_container[cid] = PodContainer(pod, name, runtime)
    return snap


class KubeletClient:
    """GET {url}/pods. TLS is verified against `ca_file` (else the system's CAs) unless `insecure`; the bearer
    token is read from `token_file` at every fetch (service-account tokens rotate) and never logged."""

    def __init__(self, url: str, token_file: str | None = None, ca_file: str | None = None, insecure: bool = False,
                 timeout_s: float = 5.0, max_bytes: int = 256 << 20) -> None:
        self.url = url.rstrip("/")
        self.token_file = token_file
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        verify: ssl.SSLContext | bool = True
        if url.startswith("https:"):
            if insecure:
                verify = False
            else:
                verify = ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()
        self._client = httpx.Client(verify=verify, timeout=httpx.Timeout(timeout_s), follow_redirects=False,
                                    trust_env=False)

    def fetch_raw(self) -> bytes:
        """The body of a 200 answer, else KubeletError; the whole exchange within timeout_s."""
        headers = {"Accept": "application/json"}
        if self.token_file:
            try:
                with open(self.token_file) as f:
                    headers["Authorization"] = "Bearer " + f.read().strip()
            except OSError as exc:
                raise KubeletError("token_unreadable", f"{self.token_file}: {exc.strerror or exc}") from None
        deadline = time.monotonic() + self.timeout_s
        try:
            with self._client.stream("GET", self.url + "/pods", headers=headers) as resp:
                if resp.status_code != 200:
                    reason = {401: "unauthorized", 403: "forbidden"}.get(resp.status_code, "http_error")
                    raise KubeletError(reason, f"HTTP {resp.status_code}")
                chunks, size = [], 0
                for chunk in resp.iter_bytes():
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise KubeletError("too_large", f"answer over {self.max_bytes} bytes")
                    if time.monotonic() > deadline:  # a kubelet dripping bytes: each read is in time, the whole not
                        raise KubeletError("timeout", f"answer not complete within {self.timeout_s:g} s")
                    chunks.append(chunk)
                return b"".join(chunks)
        except httpx.TimeoutException:
            raise KubeletError("timeout", f"no answer within {self.timeout_s:g} s") from None
        except httpx.ConnectError as exc:
            if _is_tls(exc):
                raise KubeletError("tls", str(exc)) from None
            raise KubeletError("unreachable", str(exc) or type(exc).__name__) from None
        except httpx.HTTPError as exc:
            raise KubeletError("unreachable", str(exc) or type(exc).__name__) from None

    def fetch(self, allowed_labels: tuple[str, ...], max_value_len: int) -> PodSnapshot:
        return parse_pod_list(self.fetch_raw(), allowed_labels, max_value_len)

    def close(self) -> None:
        self._client.close()


def _is_tls(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError) or "CERTIFICATE" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
