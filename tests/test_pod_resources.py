"""producers/pod_resources against a real gRPC server implementing the kubelet's PodResourcesLister.List on a unix
socket: GPU and MIG UUIDs to the container that holds them."""

from __future__ import annotations

from pathlib import Path

import pytest

from producers.pod_resources import GpuHolder, PodResourcesClient, PodResourcesError
from tests.kubelet_double import PodResourcesDouble

GPU0, GPU1 = "GPU-6f2d1c0e-8a4b-4c7e-9f1a-2b3c4d5e6f70", "GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
MIG = "MIG-9b8a7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"


def test_list_maps_gpu_and_mig_uuids(tmp_path: Path) -> None:
    sock = tmp_path / "kubelet.sock"
    double = PodResourcesDouble(sock, [
        ("ml", "trainer-0", [("main", [("nvidia.com/gpu", [GPU0, GPU1]), ("example.com/nic", ["nic-3"])]),
                             ("sidecar", [])]),
        ("dev", "notebook", [("lab", [("nvidia.com/mig-1g.10gb", [MIG])])]),
        ("default", "web", [("nginx", [])]),
    ]).start()
    try:
        client = PodResourcesClient(str(sock), timeout_s=5)
        assert client.list() == {GPU0: GpuHolder("ml", "trainer-0", "main"), GPU1: GpuHolder("ml", "trainer-0", "main"),
                                 MIG: GpuHolder("dev", "notebook", "lab")}
        client.close()
    finally:
        double.stop()
    assert double.calls == 1


def test_no_server_is_unavailable(tmp_path: Path) -> None:
    client = PodResourcesClient(str(tmp_path / "absent.sock"), timeout_s=1)
    with pytest.raises(PodResourcesError) as err:
        client.list()
    assert err.value.reason == "unavailable"
    client.close()
