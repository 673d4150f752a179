# A SkipPipe Swarm volunteer peer with CUDA.
# Build:  docker build -t skippipe-peer .
# Run:    docker run --gpus all -v skippipe-cache:/home/peer/.cache skippipe-peer \
#             --gpu 0 --initial-peers /ip4/<coordinator-ip>/tcp/<port>/p2p/<id>
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN useradd --create-home --uid 1000 peer
WORKDIR /opt/skippipe
COPY pyproject.toml README.md ./
COPY protocol ./protocol
COPY opsweb ./opsweb
COPY coordinator ./coordinator
COPY peer ./peer
# The base image already has a CUDA build of torch inside the pinned range; keep it.
RUN pip install --no-deps . && pip install hivemind==1.1.12 msgpack uvloop multiaddr numpy

# /home/peer/shared: where a compose coordinator leaves its --maddrs-file for the peers
RUN mkdir -p /home/peer/shared && chown peer:peer /home/peer/shared
USER peer
# Benchmark cache and checkpoints survive container restarts.
VOLUME ["/home/peer/.cache", "/home/peer/checkpoints"]
# libp2p listens here; publish it (-p 31337:31337) and pass --host-maddrs /ip4/0.0.0.0/tcp/31337
EXPOSE 31337
# --metrics-port 9100 --metrics-host 0.0.0.0: Prometheus /metrics and /api/status of the peer.
# The same image runs the coordinator: --entrypoint skippipe-coordinator (status page: 8321).
# Every flag can also be set as SKIPPIPE_<FLAG> (e.g. SKIPPIPE_INITIAL_PEERS) or in --config FILE.
EXPOSE 9100 8321
ENTRYPOINT ["skippipe-peer"]
CMD ["--help"]
