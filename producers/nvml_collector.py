"""The agent's NVML collector: one GpuMetrics record (schemas/gpu_metrics.v2.avsc) per poll, through nvidia-ml-py.

Per device (GPUs and MIG devices, which carry their GPU's index and uuid as parent_uuid): utilization, memory,
clocks, power and its enforced limit, temperature, PCIe throughput, clock-event (throttle) reasons, and the XID
errors raised since the last poll (an NVML event set, drained without waiting). Per process: SM and memory
utilization from the samples NVML took since the last one this collector saw (so none is sent twice), the used GPU
memory of running compute processes, and the process's comm and container id from /proc.

A field NVML cannot give (not supported on this device, GPU lost, any error) is None; nothing here raises out of
`poll`. Without a driver or a GPU, `open` returns False, logs the reason once, and the collector stays off.
NVML calls can hang (a GPU falling off the bus): each poll runs in a worker thread and `poll` gives up after
`deadline_s`, counting the overrun; while that worker is still stuck, later polls are skipped and counted, so there
is never more than one stuck thread. Utilization is an average over a window of up to a second in the driver, so
the collector polls no faster than once a second.

    python -m producers.nvml_collector --once --format json       # what the agent would send, as JSON
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml

from producers.agent import Records, Window
from producers.identity_refs import Identities, gpu_identity, process_identity
from producers.process_info import read_process_info

log = logging.getLogger("fleetprof.nvml")

UTIL_WINDOW_S = 1.0  # the driver averages utilization over 1/6 s to 1 s depending on the GPU: never poll faster
OPEN_DEADLINE_S = 30.0  # nvmlInit alone can take seconds per GPU when persistence mode is off
MAX_EVENTS_PER_POLL = 1000
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

# Return codes that say "this device cannot tell", which are normal and not worth a log line
_QUIET = {pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_NO_DATA}
# Return codes after which a newer entry point should be replaced by its older form on this driver
_OLD_API = {pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH}


class _GpuLost(Exception):
    """NVML said GPU_IS_LOST: the rest of this device's poll is skipped."""


@dataclass
class _Device:
    handle: Any
    address: int  # the handle's pointer value: how event data names the device
    index: int  # a MIG device carries its GPU's index
    uuid: str
    name: str
    parent_uuid: str = ""
    gpu_instance_id: int | None = None
    mig_enabled: bool = False  # a GPU in MIG mode: its processes are read through its MIG devices


def _address(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _int(value: Any, limit: int = INT32_MAX) -> int | None:
    # NVML marks "not available" with all-ones values; the schema's int/long would not hold them anyway
    if value is None:
        return None
    value = int(value)
    return value if 0 <= value <= limit else None


def _unavailable_reason(exc: pynvml.NVMLError) -> str:
    code = exc.value
    if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return "no NVML library (libnvidia-ml.so.1 not found): no NVIDIA driver on this node"
    if code == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
        return "the NVIDIA driver is not loaded"
    if code == pynvml.NVML_ERROR_NO_PERMISSION:
        return "no permission to use NVML"
    return f"NVML initialization failed: {exc}"


def read_process(pid: int, proc_root: str = "/proc") -> tuple[str, str]:
    """(comm, container id) of a host pid; ("", "") when it is gone or unreadable."""
    info = read_process_info(pid, proc_root)
    return ("", "") if info is None else (info.comm, info.container_id)


class NvmlCollector:
    """GPU metrics of this node from NVML: `open()`, then `poll(now_ns)` about every `period_s`, then `close()`.

    Counters for the agent's metrics: `polls`, `overruns` (a poll that missed its deadline), `skipped` (a poll not
    started because an overrun one is still stuck), `errors` (NVML calls that failed other than "not supported").
    """

    def __init__(self, node: str, period_s: float = 1.0, deadline_s: float | None = None,
                 proc_root: str = "/proc", identities: Identities | None = None) -> None:
        if period_s < UTIL_WINDOW_S:
            raise ValueError(f"the NVML poll period must be at least {UTIL_WINDOW_S:g} s (the driver's "
                             f"utilization window), got {period_s:g} s")
        self.node = node
        self.period_ns = int(period_s * 1e9)
        self.deadline_s = 0.8 * period_s if deadline_s is None else deadline_s
        self.proc_root = proc_root
        # a device row's identity is the pod holding the GPU, a process row's the process's (None: every id 0)
        self.identities = identities
        self.reason = ""
        self.simulated = False
        self.driver = ""
        self.devices: list[_Device] = []
        self.polls = self.overruns = self.skipped = self.errors = 0
        self._on = False
        self._next_ns: int | None = None
        self._worker: threading.Thread | None = None  # the one poll thread that may still be running
        self._event_set: Any = None
        self._last_seen: dict[str, int] = {}  # per device uuid: newest process utilization sample used
        self._xids: dict[str, list[int]] = {}  # drained but not yet reported, per device uuid
        self._xid_lock = threading.Lock()
        self._lost: set[str] = set()
        self._old_api: set[str] = set()
        self._stalled = False

    # --- bounded calls ----------------------------------------------------------------------------------------

    def _bounded(self, work: Callable[[], Any], deadline_s: float) -> tuple[bool, Any]:
        """(True, result) of `work` run in a worker thread, or (False, None) when it overran or one is still stuck.
        Exceptions of `work` are raised here."""
        if self._worker is not None:
            if self._worker.is_alive():
                self.skipped += 1
                return False, None
            self._worker = None
            if self._stalled:
                self._stalled = False
                log.warning("NVML answers again")
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["result"] = work()
            except BaseException as exc:  # handed to the caller's thread
                box["error"] = exc

        thread = threading.Thread(target=run, name="fleetprof-nvml", daemon=True)
        thread.start()
        thread.join(deadline_s)
        if thread.is_alive():
            self._worker = thread
            self.overruns += 1
            if not self._stalled:
                self._stalled = True
                log.warning("an NVML call did not return within %.1f s; skipping polls until it does", deadline_s)
            return False, None
        if "error" in box:
            raise box["error"]
        return True, box.get("result")

    # --- open / close -----------------------------------------------------------------------------------------

    def _off(self, reason: str) -> bool:
        self.reason = reason
        self._on = False
        log.warning("NVML collector off: %s", reason)
        return False

    def open(self) -> bool:
        """Start NVML and find the devices; False (with `reason`, logged once) when there is nothing to collect."""
        try:
            done, _ = self._bounded(self._open_work, OPEN_DEADLINE_S)
        except pynvml.NVMLError as exc:
            self.devices = []
            return self._off(_unavailable_reason(exc))
        except Exception as exc:  # a binding that cannot load at all must not stop the agent
            self.devices = []
            return self._off(f"NVML unusable: {exc}")
        if not done:
            return self._off(f"NVML did not initialize within {OPEN_DEADLINE_S:.0f} s")
        if not self.devices:
            self._shutdown()
            return self._off("no NVIDIA GPU on this node")
        self._on = True
        gpus = sum(1 for d in self.devices if not d.parent_uuid)
        log.info("NVML collector on: %d GPU(s), %d MIG device(s), driver %s", gpus, len(self.devices) - gpus,
                 self.driver)
        return True

    def _open_work(self) -> None:
        pynvml.nvmlInit()
        self.driver = _text(self._call(None, pynvml.nvmlSystemGetDriverVersion) or "")
        self.simulated = "simulated" in self.driver
        for index in range(pynvml.nvmlDeviceGetCount()):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                gpu = _Device(handle, _address(handle), index, _text(pynvml.nvmlDeviceGetUUID(handle)),
                              _text(pynvml.nvmlDeviceGetName(handle)))
            except pynvml.NVMLError as exc:
                # e.g. lost at start-up: without its uuid, its readings could not be told apart later
                log.warning("GPU %d left out: NVML cannot identify it: %s", index, exc)
                continue
            self.devices.append(gpu)
            try:
                self.devices += self._mig_devices(gpu)
            except _GpuLost:
                pass
        self._register_xids()

    def _mig_devices(self, gpu: _Device) -> list[_Device]:
        mode = self._call(gpu, pynvml.nvmlDeviceGetMigMode)
        gpu.mig_enabled = bool(mode) and mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE
        if not gpu.mig_enabled:
            return []
        found = []
        for slot in range(self._call(gpu, pynvml.nvmlDeviceGetMaxMigDeviceCount) or 0):
            handle = self._call(gpu, pynvml.nvmlDeviceGetMigDeviceHandleByIndex, slot)
            if handle is None:
                continue  # an empty slot
            mig = _Device(handle, _address(handle), gpu.index, "", "", parent_uuid=gpu.uuid)
            mig.uuid = _text(self._call(mig, pynvml.nvmlDeviceGetUUID) or "")
            mig.name = _text(self._call(mig, pynvml.nvmlDeviceGetName) or "")
            mig.gpu_instance_id = self._call(mig, pynvml.nvmlDeviceGetGpuInstanceId)
            found.append(mig)
        return found

    def _register_xids(self) -> None:
        try:
            self._event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.info("no XID events from NVML: %s", exc)
            return
        for dev in self.devices:
            if dev.parent_uuid:
                continue  # the driver reports a MIG device's XIDs on its GPU, with the GPU instance id
            try:
                supported = self._call(dev, pynvml.nvmlDeviceGetSupportedEventTypes) or 0
                if supported & pynvml.nvmlEventTypeXidCriticalError:
                    self._call(dev, pynvml.nvmlDeviceRegisterEvents, pynvml.nvmlEventTypeXidCriticalError,
                               self._event_set)
            except _GpuLost:
                continue

    def _shutdown(self) -> None:
        try:
            if self._event_set is not None:
                pynvml.nvmlEventSetFree(self._event_set)
                self._event_set = None
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            log.debug("NVML shutdown: %s", exc)

    def close(self) -> None:
        """Stop NVML; with a call still stuck, leave it (its thread dies with the process)."""
        if not self._on:
            return
        self._on = False
        try:
            self._bounded(self._shutdown, self.deadline_s)
        except Exception as exc:  # closing must not fail the agent's shutdown
            log.debug("NVML close: %s", exc)

    # --- polling ----------------------------------------------------------------------------------------------

    @property
    def next_poll_ns(self) -> int | None:
        """The earliest `now_ns` at which `poll` reads again (None: at the next call)."""
        return self._next_ns

    # the agent's Collector protocol (producers/agent.py)

    name = "nvml"

    def begin(self, wake: Callable[[], None]) -> None:
        """Nothing to start: open() did; polls come on a period (due_in)."""

    def look(self) -> None:
        """Nothing to find: the devices are known from open()."""

    def due_in(self) -> float | None:
        return ((self._next_ns or 0) - time.time_ns()) / 1e9 if self._on else None

    def drain(self) -> list[Records]:
        record = self.poll(time.time_ns())
        return [Records("gpu_metrics", [record])] if record is not None else []

    def end_window(self, window: Window) -> list[Records]:
        return []

    def counters(self) -> dict[str, int]:
        return {"polls": self.polls, "overruns": self.overruns, "skipped": self.skipped, "errors": self.errors}

    def poll(self, now_ns: int) -> dict | None:
        """A GpuMetrics record stamped `now_ns`, or None: off, not due yet (period), or the poll was cut short."""
        if not self._on:
            return None
        if self._next_ns is not None and now_ns < self._next_ns:
            return None
        # On the period's grid, so a caller's jitter neither drifts nor doubles polls; after a late poll, the next
        # waits for most of a utilization window (the slack absorbs a caller that sleeps exactly one period).
        self._next_ns = max((self._next_ns or now_ns) + self.period_ns, now_ns + int(0.9 * UTIL_WINDOW_S * 1e9))
        try:
            done, result = self._bounded(self._read, self.deadline_s)
        except Exception as exc:  # a bug in reading must cost one poll, not the agent
            self.errors += 1
            log.warning("NVML poll failed: %s", exc)
            return None
        if not done:
            return None
        devices, processes, last_seen = result
        self._last_seen.update(last_seen)  # only now: samples of a poll that was cut short are read again
        with self._xid_lock:
            xids, self._xids = self._xids, {}
        for dev in devices:
            dev["xid_errors"] = xids.get(dev["uuid"], [])
        self.polls += 1
        return {"node": self.node, "time_ns": now_ns, "simulated": self.simulated, "devices": devices,
                "processes": processes}

    def _call(self, dev: _Device | None, fn: Callable[..., Any], *args: Any,
              old: Callable[..., Any] | None = None) -> Any:
        """fn(handle, *args), or None when NVML cannot answer. With `old`, a driver that lacks the newer entry point
        is asked through the older one from then on. Raises _GpuLost (logged once per device) when the GPU is lost."""
        name = getattr(fn, "__name__", "")
        if old is not None and name in self._old_api:
            return self._call(dev, old, *args)
        try:
            return fn(*args) if dev is None else fn(dev.handle, *args)
        except pynvml.NVMLError as exc:
            code = exc.value
            if code == pynvml.NVML_ERROR_GPU_IS_LOST and dev is not None:
                if dev.uuid not in self._lost:
                    self._lost.add(dev.uuid)
                    log.warning("GPU %d (%s) is lost: its metrics stay empty until it answers again", dev.index,
                                dev.uuid)
                raise _GpuLost from None
            if old is not None and code in _OLD_API:
                self._old_api.add(name)
                return self._call(dev, old, *args)
            if code not in _QUIET:
                self.errors += 1
                log.debug("NVML %s: %s", name, exc)
            return None

    def _read(self) -> tuple[list[dict], list[dict], dict[str, int]]:
        """One poll's device and process records (XIDs drained into the pending list) and new last-seen stamps."""
        self._drain_xids()
        devices, processes, last_seen = [], [], {}
        for dev in self.devices:
            record = {"index": dev.index, "uuid": dev.uuid, "name": dev.name, "parent_uuid": dev.parent_uuid,
                      "identity_id": gpu_identity(self.identities, dev.uuid),
                      "gpu_util_pct": None, "mem_util_pct": None, "mem_used_bytes": None, "mem_total_bytes": None,
                      "sm_clock_mhz": None, "mem_clock_mhz": None, "power_mw": None, "power_limit_mw": None,
                      "temperature_c": None, "pcie_tx_kbps": None, "pcie_rx_kbps": None,
                      "clock_event_reasons": None, "xid_errors": []}
            devices.append(record)
            try:
                self._read_device(dev, record)
                if not dev.mig_enabled:
                    processes += self._read_processes(dev, last_seen)
            except _GpuLost:
                continue  # every further call on it would say so too
            self._lost.discard(dev.uuid)
        return devices, processes, last_seen

    def _read_device(self, dev: _Device, rec: dict) -> None:
        util = self._call(dev, pynvml.nvmlDeviceGetUtilizationRates)
        if util is not None:
            rec["gpu_util_pct"], rec["mem_util_pct"] = _int(util.gpu), _int(util.memory)
        memory = self._call(dev, self._memory_v2, old=pynvml.nvmlDeviceGetMemoryInfo)
        if memory is not None:
            rec["mem_used_bytes"], rec["mem_total_bytes"] = _int(memory.used, INT64_MAX), _int(memory.total, INT64_MAX)
        rec["sm_clock_mhz"] = _int(self._call(dev, pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_SM))
        rec["mem_clock_mhz"] = _int(self._call(dev, pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_MEM))
        rec["power_mw"] = _int(self._call(dev, pynvml.nvmlDeviceGetPowerUsage))
        rec["power_limit_mw"] = _int(self._call(dev, pynvml.nvmlDeviceGetEnforcedPowerLimit))
        rec["temperature_c"] = _int(self._call(dev, self._temperature_v, pynvml.NVML_TEMPERATURE_GPU,
                                                old=pynvml.nvmlDeviceGetTemperature))
        # Each PCIe counter is measured over 20 ms inside the driver: part of why the deadline is generous.
        rec["pcie_tx_kbps"] = _int(self._call(dev, pynvml.nvmlDeviceGetPcieThroughput,
                                               pynvml.NVML_PCIE_UTIL_TX_BYTES))
        rec["pcie_rx_kbps"] = _int(self._call(dev, pynvml.nvmlDeviceGetPcieThroughput,
                                               pynvml.NVML_PCIE_UTIL_RX_BYTES))
        rec["clock_event_reasons"] = _int(self._call(dev, pynvml.nvmlDeviceGetCurrentClocksEventReasons,
                                                      old=pynvml.nvmlDeviceGetCurrentClocksThrottleReasons),
                                          INT64_MAX)

    @staticmethod
    def _memory_v2(handle: Any) -> Any:
        return pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)

    @staticmethod
    def _temperature_v(handle: Any, sensor: int) -> Any:
        # nvidia-ml-py releases before nvmlDeviceGetTemperatureV fall back to the older call
        getter = getattr(pynvml, "nvmlDeviceGetTemperatureV", None)
        if getter is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return getter(handle, sensor)

    def _read_processes(self, dev: _Device, last_seen: dict[str, int]) -> list[dict]:
        used: dict[int, int | None] = {}
        for proc in self._call(dev, pynvml.nvmlDeviceGetComputeRunningProcesses) or []:
            memory = _int(proc.usedGpuMemory, INT64_MAX)
            # a pid listed twice (one per MIG compute instance) holds the sum
            used[proc.pid] = memory if proc.pid not in used else (used[proc.pid] or 0) + (memory or 0)
        since = self._last_seen.get(dev.uuid, 0)
        newest: dict[int, Any] = {}
        for sample in self._call(dev, pynvml.nvmlDeviceGetProcessUtilization, since) or []:
            # only samples after the last one used; of several per process, the newest
            if sample.timeStamp > since and (sample.pid not in newest
                                             or sample.timeStamp > newest[sample.pid].timeStamp):
                newest[sample.pid] = sample
        if newest:
            last_seen[dev.uuid] = max(s.timeStamp for s in newest.values())
        rows = []
        for pid in sorted(set(used) | set(newest)):
            info = read_process_info(pid, self.proc_root)
            sample = newest.get(pid)
            rows.append({"device_index": dev.index, "pid": pid, "comm": info.comm if info else "",
                         "container_id": info.container_id if info else "",
                         "identity_id": process_identity(self.identities, info),
                         "sm_util_pct": _int(sample.smUtil) if sample else None,
                         "mem_util_pct": _int(sample.memUtil) if sample else None,
                         "used_memory_bytes": used.get(pid)})
        return rows

    def _drain_xids(self) -> None:
        if self._event_set is None:
            return
        by_address = {d.address: d for d in self.devices if not d.parent_uuid}
        for _ in range(MAX_EVENTS_PER_POLL):
            try:
                event = pynvml.nvmlEventSetWait_v2(self._event_set, 0)
            except pynvml.NVMLError as exc:
                if exc.value != pynvml.NVML_ERROR_TIMEOUT:
                    self.errors += 1
                    log.debug("NVML event wait: %s", exc)
                return
            if not event.eventType & pynvml.nvmlEventTypeXidCriticalError:
                continue
            gpu = by_address.get(_address(event.device))
            if gpu is None:
                continue
            target = next((d for d in self.devices if d.parent_uuid == gpu.uuid
                           and d.gpu_instance_id == event.gpuInstanceId), gpu)
            with self._xid_lock:
                self._xids.setdefault(target.uuid, []).append(int(event.eventData))


def main(argv: list[str] | None = None) -> int:
    """Print what the collector reads, one JSON record per poll (a debugging tool; no Kafka)."""
    parser = argparse.ArgumentParser(prog="python -m producers.nvml_collector", description=main.__doc__)
    parser.add_argument("--once", action="store_true", help="one poll, then exit (same as --count 1)")
    parser.add_argument("--count", type=int, default=0, help="polls before exiting (default: until interrupted)")
    parser.add_argument("--period", type=float, default=1.0, help="seconds between polls (at least 1)")
    parser.add_argument("--node", default=os.uname().nodename, help="node name in the records")
    parser.add_argument("--format", choices=["json"], default="json", help="output format (JSON lines)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        collector = NvmlCollector(args.node, period_s=args.period)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not collector.open():
        return 1
    count = 1 if args.once else args.count
    try:
        done = 0
        while not count or done < count:
            record = collector.poll(time.time_ns())
            if record is not None:
                print(json.dumps(record), flush=True)
                done += 1
            time.sleep(max(0.0, (collector.next_poll_ns or 0) - time.time_ns()) / 1e9)
    except KeyboardInterrupt:
        pass
    finally:
        collector.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
