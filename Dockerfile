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
COPY coordinator ./coordinator
COPY peer ./peer
# The base image already has a CUDA build of torch inside the pinned range; keep it.
RUN pip install --no-deps . && pip install hivemind==1.1.12 msgpack uvloop multiaddr numpy

USER peer
# Benchmark cache and checkpoints survive container restarts.
VOLUME ["/home/peer/.cache", "/home/peer/checkpoints"]
# libp2p listens here; publish it (-p 31337:31337) and pass --host-maddrs /ip4/0.0.0.0/tcp/31337
EXPOSE 31337
ENTRYPOINT ["skippipe-peer"]
CMD ["--help"]
