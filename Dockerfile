# A SkipPipe Swarm volunteer peer with CUDA (the same image runs the coordinator).
# Build:  docker build -t skippipe-peer .
# Run (reachable from other machines: publish the libp2p port and listen on it):
#   docker run --gpus all -p 31337:31337 -v skippipe-cache:/home/peer/.cache skippipe-peer \
#       --gpu 0 --host-maddrs /ip4/0.0.0.0/tcp/31337 --announce-maddrs /ip4/<this-host-public-ip>/tcp/31337 \
#       --initial-peers /ip4/<coordinator-ip>/tcp/<port>/p2p/<id>
# or, on Linux, `--network host` instead of -p (then --announce-maddrs is not needed on a public IP).
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1

# The unprivileged user, and every folder it writes (volumes included), created and owned by
# it before root is dropped: a named volume copies this ownership on first use.
RUN useradd --create-home --uid 1000 peer \
    && mkdir -p /home/peer/.cache /home/peer/checkpoints /home/peer/shared \
    && chown -R peer:peer /home/peer

WORKDIR /opt/skippipe
# Dependencies first, from pyproject.toml alone: this layer is rebuilt only when they change,
# not at every source edit. torch comes with the base image (a CUDA build that satisfies
# torch>=2.3); installing it again would pull another multi-GB wheel.
COPY pyproject.toml ./
RUN python -c "import tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; \
print('\n'.join(d for d in deps if not d.replace(' ', '').startswith('torch')))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt

# Then the source (no dependency resolution: done above).
COPY README.md ./
COPY protocol ./protocol
COPY opsweb ./opsweb
COPY coordinator ./coordinator
COPY peer ./peer
COPY modelconfig ./modelconfig
COPY tokendata ./tokendata
COPY swarmcore ./swarmcore
COPY launcher ./launcher
RUN pip install --no-deps .

USER peer
# Benchmark cache and checkpoints survive container restarts.
VOLUME ["/home/peer/.cache", "/home/peer/checkpoints"]
# libp2p listens here: publish it (-p 31337:31337) and pass --host-maddrs /ip4/0.0.0.0/tcp/31337
EXPOSE 31337
# --metrics-port 9100 --metrics-host 0.0.0.0: Prometheus /metrics and /api/status of the peer.
# The same image runs the coordinator: --entrypoint skippipe-coordinator (status page: 8321).
# Every flag can also be set as SKIPPIPE_<FLAG> (e.g. SKIPPIPE_INITIAL_PEERS) or in --config FILE.
EXPOSE 9100 8321
# exec form: skippipe-peer is PID 1 and gets `docker stop`'s SIGTERM itself (a clean leave)
ENTRYPOINT ["skippipe-peer"]
CMD ["--help"]
