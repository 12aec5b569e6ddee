"""The workload identity of each process and GPU on this node, resolved from the cgroup path, the kubelet's pod list,
its pod-resources API and Slurm jobs' environment, and cached.

identify() and gpu_owner() are dict lookups on what the background thread last fetched: they never wait on the
network, a lock the thread holds, or a file. What they cannot know yet they ask the thread for (a container id the
kubelet has not reported: a refresh, coalesced, at most every `min_refresh_s`; a Slurm job's environment; a uid's
name) and answer with what they know now; the next call after the thread's answer gets the better identity (a new
id: the records sent before keep theirs). The kubelet down, slow, refusing the token or answering nonsense leaves
container ids only (kind container), one log line per change of its state, and counters.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from producers.cgroup_identity import CgroupIdentity, parse_cgroup_path
from producers.kubelet_pods import KubeletClient, KubeletError, Pod, PodSnapshot
from producers.pod_resources import GpuHolder, PodResourcesClient, PodResourcesError
from producers.process_info import ProcessInfo
from producers.slurm_env import SlurmEnv, process_uid, read_slurm_env, user_name
from producers.workload_identity import NO_IDENTITY, Identity

log = logging.getLogger("fleetprof.agent")

DEFAULT_POD_LABELS = ("app.kubernetes.io/name", "job-name", "team")
MIN_REFRESH_S = 5.0  # an unknown container id asks for a refresh at most this often
UNKNOWN_TRIES = 3  # refreshes one unknown container id may ask for (a pod's pause container is never listed)
MAX_ENTRIES = 1 << 16  # each cache is emptied past this (pids come and go; the cgroups of a node stay fewer)


class IdentityResolver:
    """The agent's identities; start() the background thread, close() it. `kubelet` / `pod_resources` None: off."""

    def __init__(self, node: str, kubelet: KubeletClient | None = None,
                 pod_resources: PodResourcesClient | None = None, pod_labels: tuple[str, ...] = DEFAULT_POD_LABELS,
                 team_label: str = "team", refresh_s: float = 60.0, min_refresh_s: float = MIN_REFRESH_S,
                 pod_resources_period_s: float = 10.0, max_label_len: int = 64, simulated: bool = False,
                 slurm_env: Callable[[int], SlurmEnv] = read_slurm_env, uid_of: Callable[[int], int | None] =
                 process_uid, name_of_uid: Callable[[int], str] = user_name,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.node = node
        self.kubelet = kubelet
        self.pod_resources = pod_resources
        self.pod_labels = tuple(pod_labels)
        self.team_label = team_label
        self.refresh_s = refresh_s
        self.min_refresh_s = min_refresh_s
        self.pod_resources_period_s = pod_resources_period_s
        self.max_label_len = max_label_len
        self.simulated = simulated
        self._slurm_env, self._uid_of, self._name_of_uid, self._clock = slurm_env, uid_of, name_of_uid, clock
        # written by the thread only (replaced whole, or one key stored), read by identify()
        self._pods: PodSnapshot | None = None
        self._gpus: dict[str, GpuHolder] = {}
        self._env: dict[object, SlurmEnv] = {}
        self._generation = 0  # moves when any of the above changed: cached ids older than it are worked out again
        # written by identify() only
        self._parsed: dict[str, CgroupIdentity] = {}
        self._ids: dict[object, tuple[int, int]] = {}  # cache key -> (generation, identity id)
        self._identities: dict[int, tuple[Identity, int]] = {}  # id -> (identity, first seen, ns since the epoch)
        self._unknown: dict[str, int] = {}  # container id -> refreshes it asked for
        self._env_asked: set[object] = set()
        # from identify() to the thread
        self._env_wanted: deque[tuple[object, int, int | None]] = deque()
        self._refresh_wanted = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._users: dict[int, str] = {}
        self._kubelet_state: str | None = None
        self._pod_resources_state: str | None = None
        self._last_attempt = float("-inf")
        self._next_refresh = float("-inf")
        self._next_poll = float("-inf")
        self._counts: dict[str, int] = {"kubelet_refreshes_ok": 0, "kubelet_refreshes_failed": 0,
                                        "label_values_cut": 0, "unknown_containers": 0, "pod_resources_polls_ok": 0,
                                        "pod_resources_polls_failed": 0, "slurm_env_reads": 0}
        self.refresh_attempts = 0  # kubelet fetches tried (tests check the refresh policy by it)

    # --- the sampling side: lookups only -------------------------------------------------------------------------

    def identify(self, info: ProcessInfo) -> int:
        """The id of the process's identity (see the module's docstring); never blocks."""
        path = info.cgroup
        parsed = self._parsed.get(path)
        if parsed is None:
            if len(self._parsed) > MAX_ENTRIES:
                self._parsed = {}
            parsed = self._parsed[path] = parse_cgroup_path(path)
        key: object = (path, info.pid) if self._env_per_pid(parsed) else path
        generation = self._generation
        hit = self._ids.get(key)
        if hit is not None and hit[0] == generation:
            return hit[1]
        identity = self._build(info.pid, parsed, key)
        if len(self._ids) > MAX_ENTRIES:
            self._ids = {}
        self._ids[key] = (generation, self._remember(identity))
        return identity.identity_id

    def gpu_owner(self, uuid: str) -> int:
        """The id of the pod (container) that holds GPU or MIG `uuid`, NO_IDENTITY when none does or it is unknown."""
        holder = self._gpus.get(uuid)
        if holder is None:
            return NO_IDENTITY
        key = ("gpu", uuid)
        generation = self._generation
        hit = self._ids.get(key)
        if hit is not None and hit[0] == generation:
            return hit[1]
        pod = self._pods.by_name.get((holder.namespace, holder.pod)) if self._pods is not None else None
        if pod is not None:
            runtime, cid = next(((r, c) for n, r, c in pod.containers if n == holder.container), ("", ""))
            identity = self._pod_identity(pod, holder.container, runtime, cid)
        else:
            identity = Identity("pod", container_name=holder.container, pod_name=holder.pod,
                                namespace=holder.namespace)
        self._ids[key] = (generation, self._remember(identity))
        return identity.identity_id

    def record(self, identity_id: int) -> dict | None:
        """The WorkloadIdentity record of an id identify() or gpu_owner() returned, None for any other."""
        found = self._identities.get(identity_id)
        if found is None:
            return None
        identity, seen_ns = found
        return identity.record(self.node, seen_ns, self.simulated)

    def _remember(self, identity: Identity) -> int:
        iid = identity.identity_id
        if iid not in self._identities:
            self._identities[iid] = (identity, time.time_ns())
        return iid

    @staticmethod
    def _env_per_pid(parsed: CgroupIdentity) -> bool:
        # Slurm without its cgroup plugin leaves tasks in slurmd's unit: only each process's environment tells
        return not parsed.slurm_job_id and parsed.systemd_unit.startswith(("slurmd", "slurmstepd"))

    def _build(self, pid: int, parsed: CgroupIdentity, key: object) -> Identity:
        pods = self._pods
        if parsed.container_id:
            cid = parsed.container_id
            known = pods.by_container.get(cid) if pods is not None else None
            if known is not None:
                return self._pod_identity(known.pod, known.name, known.runtime or parsed.container_runtime, cid)
            self._ask_for(cid)
            pod = pods.by_uid.get(parsed.pod_uid) if pods is not None and parsed.pod_uid else None
            if pod is not None:  # listed before this container: the pod's uid in the path still names it
                return self._pod_identity(pod, "", parsed.container_runtime, cid)
            return Identity("container", container_runtime=parsed.container_runtime, container_id=cid,
                            pod_uid=parsed.pod_uid)
        if parsed.pod_uid:
            pod = pods.by_uid.get(parsed.pod_uid) if pods is not None else None
            return self._pod_identity(pod, "", "", "") if pod is not None else Identity("pod", pod_uid=parsed.pod_uid)
        if parsed.slurm_job_id or self._env_per_pid(parsed):
            env = self._env.get(key)
            if env is None and key not in self._env_asked:
                if len(self._env_asked) > MAX_ENTRIES:
                    self._env_asked = set()
                self._env_asked.add(key)
                self._env_wanted.append((key, pid, parsed.slurm_uid))
                self._wake.set()
            env = env or SlurmEnv()
            job = parsed.slurm_job_id or env.job_id
            if job:
                return Identity("slurm", slurm_job_id=job, slurm_step=parsed.slurm_step or env.step,
                                slurm_user=env.user, slurm_array_job_id=env.array_job_id,
                                slurm_array_task_id=env.array_task_id, slurm_account=env.account, team=env.account)
        if parsed.systemd_unit:
            return Identity("systemd", systemd_unit=parsed.systemd_unit)
        return Identity("host")

    def _pod_identity(self, pod: Pod, container: str, runtime: str, cid: str) -> Identity:
        labels = dict(pod.labels)
        return Identity("pod", container_runtime=runtime, container_id=cid, container_name=container,
                        pod_name=pod.name, namespace=pod.namespace, pod_uid=pod.uid,
                        labels=tuple((k, v) for k, v in pod.labels if k in self.pod_labels),
                        team=labels.get(self.team_label, ""))

    def _ask_for(self, cid: str) -> None:
        """An unknown container id: count it once, and ask the thread for a refresh (a few times at most)."""
        if self.kubelet is None:
            return
        tries = self._unknown.get(cid, 0)
        if not tries:
            self._counts["unknown_containers"] += 1
            if len(self._unknown) > MAX_ENTRIES:
                self._unknown = {}
        if tries < UNKNOWN_TRIES:
            self._unknown[cid] = tries + 1
            self._refresh_wanted = True
            self._wake.set()

    # --- the background thread -----------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="fleetprof-identities", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        for client in (self.kubelet, self.pod_resources):
            if client is not None:
                client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()  # before the work: a request made during it wakes the wait below
            self.step()
            self._wake.wait(self._next_due() - self._clock())

    def step(self) -> None:
        """Whatever is due now: a kubelet refresh, a pod-resources poll, the environments asked for."""
        now = self._clock()
        if self.kubelet is not None and (now >= self._next_refresh or (
                self._refresh_wanted and now >= self._last_attempt + self.min_refresh_s)):
            self._refresh_wanted = False
            self._refresh_kubelet()
        if self.pod_resources is not None and self._clock() >= self._next_poll:
            self._poll_pod_resources()
        self._read_envs()

    def _next_due(self) -> float:
        due = [self._clock() + 3600.0]
        if self.kubelet is not None:
            due.append(self._next_refresh)
            if self._refresh_wanted:
                due.append(self._last_attempt + self.min_refresh_s)
        if self.pod_resources is not None:
            due.append(self._next_poll)
        return min(due)

    def _refresh_kubelet(self) -> None:
        assert self.kubelet is not None
        self.refresh_attempts += 1
        self._last_attempt = self._clock()
        self._next_refresh = self._last_attempt + self.refresh_s
        allowed = tuple(dict.fromkeys((*self.pod_labels, self.team_label)))
        try:
            pods = self.kubelet.fetch(allowed, self.max_label_len)
        except KubeletError as exc:
            self._counts["kubelet_refreshes_failed"] += 1
            name = f"kubelet_refreshes_failed_{exc.reason}"
            self._counts[name] = self._counts.get(name, 0) + 1
            self._kubelet_changed(exc.reason, exc.detail)
            return
        self._counts["kubelet_refreshes_ok"] += 1
        self._counts["label_values_cut"] += pods.labels_cut
        self._pods = pods
        self._generation += 1
        self._kubelet_changed("ok", f"{len(pods)} pods")

    def _kubelet_changed(self, state: str, detail: str) -> None:
        before, self._kubelet_state = self._kubelet_state, state
        if state == before:
            return
        where = self.kubelet.url if self.kubelet is not None else ""
        if state != "ok":
            log.warning("kubelet at %s: %s (%s); identities carry container ids only until it answers, retrying "
                        "every %g s", where, state.replace("_", " "), detail, self.refresh_s)
        elif before is None:
            log.info("kubelet at %s: %s", where, detail)
        else:
            log.warning("kubelet at %s answers again: %s", where, detail)

    def _poll_pod_resources(self) -> None:
        assert self.pod_resources is not None
        self._next_poll = self._clock() + self.pod_resources_period_s
        try:
            gpus = self.pod_resources.list()
        except PodResourcesError as exc:
            self._counts["pod_resources_polls_failed"] += 1
            state, detail = exc.reason, str(exc)
        else:
            self._counts["pod_resources_polls_ok"] += 1
            state, detail = "ok", f"{len(gpus)} GPUs assigned to pods"
            if gpus != self._gpus:
                self._gpus = gpus
                self._generation += 1
        before, self._pod_resources_state = self._pod_resources_state, state
        if state != before:
            where = self.pod_resources.socket_path
            if state != "ok":
                log.warning("kubelet pod-resources at %s: %s; GPUs are not attributed to pods until it answers",
                            where, detail)
            else:
                log.log(logging.INFO if before is None else logging.WARNING, "kubelet pod-resources at %s: %s",
                        where, detail)

    def _read_envs(self) -> None:
        read = False
        while self._env_wanted:
            key, pid, uid = self._env_wanted.popleft()
            env = self._slurm_env(pid)
            self._counts["slurm_env_reads"] += 1
            if not env.user and (env.job_id or isinstance(key, str)):
                if uid is None:
                    uid = int(env.uid) if env.uid.isdigit() else self._uid_of(pid)
                if uid is not None:
                    env = SlurmEnv(**{**vars(env), "user": self._user(uid)})
            if len(self._env) > MAX_ENTRIES:
                self._env = {}
            self._env[key] = env  # one store: identify() only reads single keys
            read = True
        if read:
            self._generation += 1

    def _user(self, uid: int) -> str:
        name = self._users.get(uid)
        if name is None:
            name = self._users[uid] = self._name_of_uid(uid)
        return name

    # --- what it counted -----------------------------------------------------------------------------------------

    def counters(self) -> dict[str, int]:
        return {**self._counts, "identities": len(self._identities),
                "kubelet_pods": len(self._pods) if self._pods is not None else 0, "gpus_held": len(self._gpus)}
