"""What a Slurm job's environment says that its cgroup path does not: the array job and task, the account and the
user (and the job and step where the cgroup plugin is off). Read from /proc/PID/environ by the identity resolver's
background thread, never on the sampling path; user names from the uid through NSS (pwd), which may ask LDAP.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass

# environment variable -> SlurmEnv field
VARIABLES = {b"SLURM_JOB_ID": "job_id", b"SLURM_STEP_ID": "step", b"SLURM_ARRAY_JOB_ID": "array_job_id",
             b"SLURM_ARRAY_TASK_ID": "array_task_id", b"SLURM_JOB_ACCOUNT": "account", b"SLURM_JOB_USER": "user",
             b"SLURM_JOB_UID": "uid"}
MAX_ENVIRON = 1 << 20  # a process's environment beyond this is not read further: the SLURM_ ones come early


@dataclass(frozen=True)
class SlurmEnv:
    job_id: str = ""
    step: str = ""
    array_job_id: str = ""
    array_task_id: str = ""
    account: str = ""
    user: str = ""
    uid: str = ""

    def __bool__(self) -> bool:
        return any(vars(self).values())


def parse_environ(data: bytes) -> SlurmEnv:
    """The SLURM_* fields of /proc/PID/environ contents (NUL-separated NAME=value); values not UTF-8 are dropped."""
    found: dict[str, str] = {}
    for entry in data.split(b"\0"):
        name, eq, value = entry.partition(b"=")
        field = VARIABLES.get(name) if eq else None
        if field is None:
            continue
        try:
            found[field] = value.decode()
        except UnicodeDecodeError:
            continue
    return SlurmEnv(**found)


def read_slurm_env(pid: int) -> SlurmEnv:
    """The Slurm environment of `pid`; empty when it is gone, not permitted, or has none."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return parse_environ(f.read(MAX_ENVIRON))
    except OSError:
        return SlurmEnv()


def process_uid(pid: int) -> int | None:
    """The real uid of `pid` (the owner of /proc/PID), None when it is gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def user_name(uid: int) -> str:
    """The login name of `uid`, else the number as text (a uid unknown to this node's NSS)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)
