"""The CUDA-specific code path, run on the CPU: bf16 autocast with fp32 master weights, the wire
dtype, host-buffer moves, device errors (torch.cuda monkeypatched), the memory reservation and
the CLI's exit 2. The tests marked `gpu` repeat the essentials on a real GPU."""
import pytest
import torch

from peer import cli
from peer.compute import device as devices
from peer.compute import precision
from peer.compute.host_buffers import DeviceIO
from peer.compute.model import get_config
from peer.compute.runner import StageRunner
from peer.compute.stages import build_stage

CFG = get_config("tiny")
B, T = 2, 16
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def runners(dev="cpu", autocast=torch.bfloat16, wire="auto"):
    prec = precision.resolve(dev, wire, autocast=autocast is not None)
    mk = lambda s: StageRunner(build_stage(CFG, s, 2, 0), max_stash=4, device=dev,  # noqa: E731
                               autocast_dtype=prec.autocast, io=DeviceIO(dev, prec))
    return mk(0), mk(1), prec


def one_microbatch(r0, r1, seed=0):
    """Origin forward -> stage 1 -> head loss -> back, as the worker chains them."""
    g = torch.Generator().manual_seed(seed)
    tok = torch.randint(0, 256, (B, T), generator=g)
    h0 = r0.forward_origin((0, 0), tok)
    h1 = r1.forward((0, 0), h0)
    loss, gh = r0.head_loss((0, 0), h1, torch.roll(tok, 1, 1))
    gin = r1.backward((0, 0), gh)
    r0.backward_origin((0, 0), gin)
    return h0, h1, gh, gin, loss


def test_precision_defaults_keep_cpu_fp32_and_use_bf16_on_cuda():
    cpu, gpu = precision.resolve("cpu"), precision.resolve("cuda:0")
    assert (cpu.autocast, cpu.wire, cpu.grad_wire) == (None, torch.float32, torch.float32)
    assert (gpu.autocast, gpu.wire, gpu.grad_wire) == (torch.bfloat16,) * 3
    half = precision.resolve("cuda:0", "float16")
    assert (half.wire, half.grad_wire) == (torch.float16, torch.float32)  # fp16 grads would underflow
    with pytest.raises(ValueError, match="wire dtype"):
        precision.resolve("cpu", "int8")


def test_bf16_autocast_path_on_cpu_keeps_fp32_master_weights_and_sends_bf16():
    r0, r1, _ = runners()
    before = r1.parameter_vector().clone()
    h0, h1, gh, gin, loss = one_microbatch(r0, r1)
    assert h0.dtype == h1.dtype == gh.dtype == gin.dtype == torch.bfloat16
    assert h0.device.type == "cpu" and torch.isfinite(torch.tensor(loss))
    for r in (r0, r1):
        assert all(p.dtype == torch.float32 for p in r.module.parameters())
        assert all(p.grad.dtype == torch.float32 for p in r.module.parameters() if p.grad is not None)
        assert r.step().skipped is False
        for state in r.optimizer.state.values():
            assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32
    assert not torch.equal(before, r1.parameter_vector())


def test_bf16_path_tracks_fp32_loss_and_gradient():
    r0, r1, _ = runners()
    f0, f1, _ = runners(autocast=None)
    *_, gin, loss = one_microbatch(r0, r1)
    *_, gin32, loss32 = one_microbatch(f0, f1)
    assert gin32.dtype == torch.float32
    assert abs(loss - loss32) < 0.05 * abs(loss32)
    cos = torch.nn.functional.cosine_similarity(gin.float().flatten(), gin32.flatten(), dim=0)
    assert cos > 0.95
    g, g32 = r1.grad_vector(), f1.grad_vector()
    assert torch.nn.functional.cosine_similarity(g, g32, dim=0) > 0.95


def test_fp16_wire_compresses_activations_but_not_grads_and_falls_back_on_overflow():
    r0, r1, prec = runners(autocast=None, wire="float16")
    h0, h1, gh, gin, _ = one_microbatch(r0, r1)
    assert h0.dtype == h1.dtype == torch.float16 and gh.dtype == gin.dtype == torch.float32
    big = torch.full((2, 3), 1e6)
    assert precision.to_wire(big, torch.float16).dtype == torch.float32   # would be Inf as fp16
    assert precision.to_wire(torch.ones(2), torch.float16).dtype == torch.float16
    assert precision.to_wire(torch.arange(3), torch.float16).dtype == torch.int64


def test_runner_with_io_still_rejects_bad_inputs():
    _, r1, _ = runners()
    with pytest.raises(ValueError, match="dtype"):
        r1.forward((0, 1), torch.zeros(B, T, CFG.dim, dtype=torch.float64))
    with pytest.raises(ValueError, match="NaN"):
        r1.forward((0, 2), torch.full((B, T, CFG.dim), float("nan"), dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="shape"):
        r1.forward((0, 3), torch.zeros(B, T, CFG.dim + 1, dtype=torch.bfloat16))
    assert r1.stashed == 0


def test_host_buffers_are_a_no_op_on_cpu():
    io = DeviceIO("cpu", precision.resolve("cpu"))
    assert not io.pinned
    t = torch.randn(2, 3)
    assert io.to_compute(t) is t and io.to_host(t) is not None and torch.equal(io.to_host(t), t)
    assert io.to_compute(t.bfloat16()).dtype == torch.float32
    assert io.to_compute("junk") == "junk"     # left for the runner's check to reject


def fake_cuda(monkeypatch, count=1, free=40 * devices.GIB, total=80 * devices.GIB, error=None):
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "Fake H200")

    def mem_get_info(i):
        if error:
            raise RuntimeError(error)
        return free, total
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)


@pytest.mark.parametrize("setup, index, message", [
    (dict(count=0), 0, "no CUDA GPU is visible"),
    (dict(count=2), 2, "has 2 CUDA device.*0..1"),
    (dict(free=100 * 1024 ** 2), 0, "busy: only 0.10 GiB"),
    (dict(error="CUDA error: all CUDA-capable devices are busy or unavailable"), 0, "busy .exclusive"),
])
def test_device_errors(monkeypatch, setup, index, message):
    fake_cuda(monkeypatch, **setup)
    with pytest.raises(devices.DeviceError, match=message):
        devices.check_device(f"cuda:{index}", isolated=False)


def test_cpu_only_torch_and_good_gpu(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(devices.DeviceError, match="CPU-only build"):
        devices.check_device("cuda:0")                    # fails before any child process
    fake_cuda(monkeypatch)
    assert devices.check_device("cuda:0", 10 * devices.GIB, isolated=False)["name"] == "Fake H200"
    with pytest.raises(devices.DeviceError, match="more than GPU 0 has"):
        devices.check_device("cuda:0", 100 * devices.GIB, isolated=False)
    with pytest.raises(devices.DeviceError, match="use it with --gpu"):
        devices.check_device("cpu", devices.GIB)


def test_parse_device_and_vram():
    assert str(devices.parse_device(3, "cpu")) == "cuda:3"
    assert str(devices.parse_device(None, "cuda")) == "cuda:0"
    for bad in ("tpu", "cuda:x", "gpu0"):
        with pytest.raises(devices.DeviceError):
            devices.parse_device(None, bad)
    assert devices.parse_vram("12") == devices.parse_vram("12GB") == devices.parse_vram("12GiB") == 12 * devices.GIB
    assert devices.parse_vram("800MB") == 800 * 1024 ** 2
    for bad in ("", "0", "-1", "12TB", "lots"):
        with pytest.raises(ValueError):
            devices.parse_vram(bad)


def test_stage_budget_grows_with_stash_and_shrinks_with_bf16():
    cfg = get_config("500m")
    b = lambda n, ac: devices.stage_budget(cfg, 4, False, 4, 1024, n, ac)  # noqa: E731
    assert b(8, False) > b(8, True) > b(1, True)
    assert b(0, True) == devices.count_parameters(cfg, 4, with_embed_head=False) * 16
    assert devices.reserve(torch.device("cpu"), 10 ** 15) == 0          # CPU: nothing to hold


def test_reserve_refuses_a_budget_over_the_cap(monkeypatch):
    fake_cuda(monkeypatch, free=40 * devices.GIB)
    with pytest.raises(devices.DeviceError, match="--max-vram allows 8.00 GiB"):
        devices.reserve(torch.device("cuda:0"), 9 * devices.GIB, max_vram=8 * devices.GIB)
    with pytest.raises(devices.DeviceError, match="only 40.00 GiB is free"):
        devices.reserve(torch.device("cuda:0"), 41 * devices.GIB)


@pytest.mark.parametrize("argv, message", [
    (["--gpu", "0"], "CPU-only build"),
    (["--gpu", "-1"], "index is >= 0"),
    (["--device", "tpu"], "expected cpu, cuda, cuda:N or mps"),
    (["--device", "mps"], "torch reports no MPS device here"),
    (["--device", "cpu", "--max-vram", "4GB"], "use it with --gpu"),
])
def test_cli_exits_2_with_one_line(monkeypatch, capsys, argv, message):
    monkeypatch.setattr(torch.version, "cuda", None)
    assert cli.main([*argv, "--initial-peers", "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWS4Lu25p9TxgZAhwHZLN4x3kUmptgqzJLyoiFP89cXYE4"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_cli_wire_choices_match_precision():
    assert cli.WIRE_CHOICES == precision.WIRE_CHOICES
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(["--initial-peers", "/ip4/127.0.0.1/tcp/1", "--max-vram", "lots"])
    assert exc.value.code == 2


def test_mps_where_torch_reports_it(monkeypatch):
    """macOS arm64: --device mps is taken where torch has MPS (refused above where it has not)."""
    monkeypatch.setattr(devices, "mps_available", lambda: True)
    assert devices.parse_device(None, "mps") == torch.device("mps")
    assert devices.check_device("mps") is None   # nothing to probe or reserve apart from the CPU's memory


@pytest.mark.gpu
@needs_cuda
def test_gpu_microbatch_bf16_pinned_and_reserved():
    dev = "cuda:0"
    r0, r1, _ = runners(dev)
    assert r0.io.pinned
    h0, h1, gh, gin, loss = one_microbatch(r0, r1)
    assert h0.device.type == "cpu" and h0.is_pinned() and h0.dtype == torch.bfloat16
    assert gin.dtype == torch.bfloat16 and torch.isfinite(torch.tensor(loss))
    assert next(r1.module.parameters()).is_cuda and not r1.step().skipped
    assert devices.check_device(dev)["total"] > 0
    assert devices.reserve(torch.device(dev), 256 * 1024 ** 2) > 0
    assert torch.cuda.memory_reserved(0) >= 256 * 1024 ** 2     # freed, but kept by the allocator


@pytest.mark.gpu
@needs_cuda
def test_gpu_out_of_range_index():
    with pytest.raises(devices.DeviceError, match="valid indices"):
        devices.check_device(f"cuda:{torch.cuda.device_count()}")


@pytest.mark.parametrize("wire, expect", [("auto", torch.float32), ("bfloat16", torch.bfloat16)])
def test_runtime_factory_wires_precision_into_runners(tmp_path, wire, expect):
    from peer.config import PeerConfig
    from peer.runtime import RuntimeFactory
    from protocol.messages import RunSpec
    spec = RunSpec(run="t", model="tiny", num_stages=2, skip_ratio=0.0, microbatch_samples=B, seq_len=T)
    rt = RuntimeFactory(spec, PeerConfig(initial_peers=("x",), benchmark=False, wire_dtype=wire,
                                         cache_dir=tmp_path))
    assert rt.reserved_bytes == 0 and rt.precision.autocast is None     # CPU: fp32 compute as before
    r1 = rt.make_runner(1)
    out = r1.forward((0, 0), torch.randn(B, T, CFG.dim))
    assert out.dtype == expect and r1.backward((0, 0), torch.ones(B, T, CFG.dim)).dtype == expect


def test_isolated_probe_reports_through_a_child_process():
    """The CLI inspects the GPU in a child (CUDA must not start before the DHT forks): its
    verdict comes back as the same DeviceError."""
    if torch.version.cuda is None:
        with pytest.raises(devices.DeviceError, match="CPU-only build"):
            devices._probe_isolated(0)
    else:
        with pytest.raises(devices.DeviceError, match="CUDA device|no CUDA GPU"):
            devices._probe_isolated(10 ** 6)


@pytest.mark.parametrize("share_dtype,bytes_per_param", [("float32", 4), ("float16", 2), ("int8", 1 + 4 / 64)])
def test_advertised_parameter_bytes_are_what_each_stage_really_shares(tmp_path, share_dtype, bytes_per_param):
    """The planner prices replica averaging from the advert: per layer, plus stage 0's extras,
    in the bytes a share carries per parameter (--share-dtype)."""
    from peer.config import PeerConfig
    from peer.runtime import RuntimeFactory
    from protocol.messages import RunSpec
    spec = RunSpec(run="t", model="tiny", num_stages=3, skip_ratio=0.0, microbatch_samples=B, seq_len=T)
    rt = RuntimeFactory(spec, PeerConfig(initial_peers=("x",), benchmark=False, cache_dir=tmp_path,
                                         share_dtype=share_dtype))
    ad = rt.advert("peer", ())
    layers = CFG.n_layers // 3
    for stage in range(3):
        params = sum(p.numel() for p in rt.make_runner(stage).module.parameters()) * bytes_per_param
        expected = ad.param_bytes_per_layer * layers + (ad.stage0_extra_param_bytes if stage == 0 else 0)
        assert params == pytest.approx(expected, abs=layers + 1), stage     # whole bytes per layer
