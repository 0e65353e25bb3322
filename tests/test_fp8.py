"""``models.fp8``: FP8 matmuls against high-precision Linears, layer conversion, the config keys.

Error bound used throughout: a product's relative (Frobenius) error against float64 <= 6 % on
random Gaussian data (e4m3's 3 mantissa bits on both operands give ~3.5 %; module docstring).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.testing import CompileCounter

from models.fp8 import E4M3_MAX, FP8, Fp8Linear, _check_device, convert_linears
from realtime.config import ConfigError, config_from_mapping

REL_ERR = 0.06


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.detach().double() - ref.detach()).norm() / ref.detach().norm())


def _reference(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    bias = None if linear.bias is None else linear.bias.double()
    return F.linear(x.double(), linear.weight.double(), bias)


def _random_linear(k: int, n: int, bias: bool, dtype: torch.dtype, device: str = "cpu") -> nn.Linear:
    linear = nn.Linear(k, n, bias=bias, device=device)
    with torch.no_grad():
        linear.weight.normal_(0, k**-0.5)
        if bias:
            linear.bias.normal_()
    return linear.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_fp8_linear_matches_the_linear_within_the_stated_error(dtype, bias):
    torch.manual_seed(0)
    linear = _random_linear(256, 96, bias, dtype)
    fp8 = Fp8Linear.from_linear(linear)
    x = torch.randn(3, 40, 256, dtype=dtype)  # leading dims kept, rows flattened inside
    with torch.no_grad():
        y = fp8(x)
    assert y.shape == (3, 40, 96) and y.dtype == dtype
    assert fp8.weight_fp8.dtype == FP8 and fp8.weight_scale.shape == (1, 96)
    err = _rel(y, _reference(linear, x))
    assert 0.005 < err < REL_ERR  # really quantized, and within the bound


def test_weights_quantize_per_output_channel_within_e4m3_rounding():
    torch.manual_seed(1)
    linear = _random_linear(64, 32, False, torch.float32)
    with torch.no_grad():
        linear.weight[3] *= 1000.0  # one loud channel must not cost the others their precision
    fp8 = Fp8Linear.from_linear(linear)
    w, dq = linear.weight.detach(), fp8.dequantized_weight(torch.float32)
    scale = fp8.weight_scale.t()
    assert torch.allclose(w.abs().amax(1, keepdim=True), scale * E4M3_MAX)
    # normals round within 2^-4 relative, subnormals within half the smallest step (2^-10 scale)
    bound = torch.maximum(w.abs() * 2**-4, scale * 2**-10)
    assert bool(((dq - w).abs() <= bound * (1 + 1e-6)).all())


def test_zero_rows_and_zero_inputs_give_zeros_not_nan():
    fp8 = Fp8Linear.from_linear(_random_linear(32, 16, True, torch.float32))
    x = torch.randn(4, 32)
    x[1] = 0.0
    with torch.no_grad():
        y = fp8(x)
    assert not y.isnan().any()
    assert torch.equal(y[1], fp8.bias)


def test_under_autograd_the_dequantized_weight_carries_the_gradient():
    """RTC's guided flow steps differentiate through the expert: the FP8 layer must not break that."""
    torch.manual_seed(2)
    linear = _random_linear(48, 32, True, torch.float32)
    fp8 = Fp8Linear.from_linear(linear)
    x = torch.randn(5, 48, requires_grad=True)
    fp8(x).square().sum().backward()
    x2 = x.detach().clone().requires_grad_(True)
    F.linear(x2, fp8.dequantized_weight(torch.float32), fp8.bias).square().sum().backward()
    assert torch.allclose(x.grad, x2.grad, rtol=1e-5, atol=1e-6)


def test_dims_not_multiples_of_16_are_refused():
    with pytest.raises(ValueError, match="multiples of 16"):
        Fp8Linear.from_linear(nn.Linear(40, 32))


def test_gpus_before_sm89_are_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ValueError, match="compute capability >= 8.9"):
        _check_device(torch.device("cuda", 0))


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.big = nn.Linear(64, 128)
        self.odd = nn.Linear(60, 32)  # 60: not a multiple of 16
        self.small = nn.Linear(16, 16)  # below min_features=32
        self.modulation = nn.Linear(64, 64)  # skipped by name
        self.deep = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Sequential(nn.Linear(64, 32)))
        self.conv = nn.Conv2d(16, 16, 3)


def test_convert_linears_counts_and_leaves_the_right_layers_alone():
    net = _Net()
    assert convert_linears(net, min_features=32, skip=("modulation",)) == 3
    assert isinstance(net.big, Fp8Linear)
    assert isinstance(net.deep[0], Fp8Linear) and isinstance(net.deep[2][0], Fp8Linear)
    assert all(type(m) is nn.Linear for m in (net.odd, net.small, net.modulation))
    assert isinstance(net.conv, nn.Conv2d)
    assert convert_linears(net, min_features=32) == 1  # idempotent but for what skip kept: modulation


def test_traces_into_one_graph_for_torch_compile():
    """No graph break (the activation scale stays on the device), same output as eager."""
    torch.manual_seed(3)
    fp8 = Fp8Linear.from_linear(_random_linear(64, 32, True, torch.float32))
    counter = CompileCounter()
    compiled = torch.compile(fp8, backend=counter)
    x = torch.randn(8, 64)
    with torch.no_grad():
        assert torch.equal(compiled(x), fp8(x))
    assert counter.frame_count == 1


@pytest.mark.parametrize("section", ["robot"])
def test_fp8_config_keys_round_trip_and_reject_non_bools(section):
    assert getattr(config_from_mapping({}), section).fp8 is False
    assert getattr(config_from_mapping({section: {"fp8": True}}), section).fp8 is True
    for bad in ("yes", 1):
        with pytest.raises(ConfigError, match=f"{section}.fp8"):
            config_from_mapping({section: {"fp8": bad}})


# -- GPU (sm89+; the H200 is sm90) -------------------------------------------------------------


def _fp8_gpu() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


needs_fp8_gpu = pytest.mark.skipif(not _fp8_gpu(), reason="needs a CUDA device of compute capability >= 8.9")


@pytest.mark.gpu
@needs_fp8_gpu
@pytest.mark.parametrize(
    ("rows", "k", "n"),
    [(4680, 1536, 4608), (4680, 8960, 1536), (400, 1024, 8192), (1, 2048, 2560)],  # Wan qkv/MLP, pi0 expert
)
def test_cuda_row_wise_fp8_matmul_within_the_stated_error(rows, k, n):
    _check_cuda(rows, k, n, torch.bfloat16)


@pytest.mark.gpu
@needs_fp8_gpu
def test_cuda_float32_activations_work_too():
    """pi0-tiny and world-tiny run float32 on CUDA by default: FP8 must accept their activations."""
    _check_cuda(100, 64, 192, torch.float32)


def _check_cuda(rows: int, k: int, n: int, dtype: torch.dtype) -> None:
    torch.manual_seed(4)
    linear = _random_linear(k, n, True, dtype, device="cuda")
    fp8 = Fp8Linear.from_linear(linear)
    x = torch.randn(rows, k, device="cuda", dtype=dtype)
    with torch.no_grad():
        y = fp8(x)
    assert y.dtype == dtype and y.shape == (rows, n)
    assert _rel(y, _reference(linear, x)) < REL_ERR


@pytest.mark.gpu
@needs_fp8_gpu
def test_cuda_graph_capture_and_replay_of_an_fp8_linear():
    torch.manual_seed(5)
    fp8 = Fp8Linear.from_linear(_random_linear(1024, 512, True, torch.bfloat16, device="cuda"))
    static_x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fp8(static_x)  # warm up off the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = fp8(static_x)
        fresh = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16) * 3
        static_x.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        # the activation scale was recomputed in the replay (a stale one would clip the 3x input)
        torch.testing.assert_close(static_y, fp8(fresh), rtol=1e-2, atol=1e-2)
