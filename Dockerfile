# The fleetprof image: the node agent and the processors (infra/k8s runs it as `fleetprof agent` and
# `fleetprof process STAGE`). Build from the checkout: docker build -t fleetprof .
#
# Debian bookworm gives Python 3.11 and bcc (python3-bpfcc) from one distribution, as infra/setup.sh uses them on a
# host. bcc compiles the agent's BPF programs with its own LLVM at start-up, against the node's kernel headers that
# the DaemonSet mounts. gcc and the Python headers build the compiled Avro codec (schemas/avro_fast.py) once, here:
# the processors' pods run as a user who cannot write the install, and without it they decode through fastavro,
# several times slower. NVML comes from the NVIDIA container runtime (libnvidia-ml.so.1), not the image.
# The image runs as root because the agent must; the processors' pods set runAsUser 10001.
FROM debian:bookworm-slim

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-bpfcc ca-certificates \
      gcc libc6-dev libpython3-dev \
 && rm -rf /var/lib/apt/lists/*

# the venv sees Debian's bcc through a folder that holds only a `bcc` link (producers/cpu_sampler.py looks there),
# not through all of dist-packages, whose other packages could shadow the venv's
RUN python3 -m venv /opt/fleetprof \
 && mkdir /opt/fleetprof/bcc-path \
 && ln -s /usr/lib/python3/dist-packages/bcc /opt/fleetprof/bcc-path/bcc

# fleetprof/sql is a link to sql/: both go in, and the wheel carries the SQL files themselves
COPY pyproject.toml README.md /src/
COPY sql /src/sql
COPY schemas /src/schemas
COPY fleetprof /src/fleetprof
COPY processors /src/processors
COPY producers /src/producers
# the simulated fleet of `fleetprof loadgen`, for load tests against a deployment
COPY simulate /src/simulate
RUN /opt/fleetprof/bin/pip install --no-cache-dir /src \
 && rm -rf /src \
 && cd / && /opt/fleetprof/bin/python -c "from schemas import avro_fast; import sys; sys.exit(avro_fast.unavailable())"

ENV PATH=/opt/fleetprof/bin:$PATH \
    PYTHONUNBUFFERED=1
ENTRYPOINT ["fleetprof"]
CMD ["--help"]
