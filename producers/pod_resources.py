"""Which pod holds which GPU: the kubelet's pod-resources gRPC API v1 `List` over its unix socket.

device_ids of `nvidia.com/gpu` are GPU UUIDs (GPU-...), those of `nvidia.com/mig-<profile>` MIG UUIDs (MIG-...);
NVML reports the same strings, so a GPU reading finds its pod by UUID. Called only from the identity resolver's
background thread, with a short deadline.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from producers.kubelet_podresources_v1 import api_pb2, api_pb2_grpc

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
MAX_MESSAGE = 64 << 20  # a List of a full node's pods stays far below


@dataclass(frozen=True)
class GpuHolder:
    namespace: str
    pod: str
    container: str


def is_gpu_resource(name: str) -> bool:
    return name == "nvidia.com/gpu" or name.startswith("nvidia.com/mig-")


def gpu_holders(response: api_pb2.ListPodResourcesResponse) -> dict[str, GpuHolder]:
    """GPU or MIG UUID -> the container it is assigned to."""
    out: dict[str, GpuHolder] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if is_gpu_resource(devices.resource_name):
                    for device_id in devices.device_ids:
                        out[device_id] = GpuHolder(pod.namespace, pod.name, container.name)
    return out


class PodResourcesError(Exception):
    """A List that failed; `reason` is the gRPC status code's name in lower case (unavailable, deadline_exceeded,
    ...)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class PodResourcesClient:
    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout_s: float = 5.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(f"unix://{socket_path}",
                                              options=[("grpc.max_receive_message_length", MAX_MESSAGE)])
        self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)

    def list(self) -> dict[str, GpuHolder]:
        try:
            response = self._stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            reason = code.name.lower() if code is not None else "unknown"
            raise PodResourcesError(reason, exc.details() if hasattr(exc, "details") else str(exc)) from None
        return gpu_holders(response)

    def close(self) -> None:
        self._channel.close()
