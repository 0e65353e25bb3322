#!/usr/bin/env bash
# Builds the bundle that brings vLLM (the voice kind's `voice.llm_backend: vllm`) and the voice
# kind's libraries to the device machine, whose image lacks them and whose carry (64 MiB a call,
# the ~12 MB repo included) cannot take vLLM's 304 MB wheel. Runs HERE, on the dev machine (pip
# reaching the package registry, a CPython 3.12 for the resolution, xz, ~2 GB under /tmp, ~7
# minutes at nice 19 on 2 cores with VLLM_WHEEL given, most of it xz).
#
# What it holds: vllm==$VLLM_VERSION, hibari-tts==0.2.1 (TTS) and silero-vad==6.2.3 (VAD), and the
# packages of their dependency closure that the device image lacks, as pip resolves it for
# CPython 3.12, manylinux x86_64 (glibc 2.28 wheels first; llguidance's 2.31 wheel is the only
# newer one, needing GLIBC_2.30): flashinfer-python 0.6.14 (the version vLLM pins), xgrammar,
# llguidance, outlines-core, lm-format-enforcer (structured outputs: llm_vllm.py's forced
# choices), pydantic, fastapi, openai, anthropic, mcp, opentelemetry, pyzmq, msgspec,
# mistral-common, compressed-tensors, apache-tvm-ffi, nvidia-cudnn-frontend, cryptography, ...
# The image's torch 2.11.0+cu130, torchaudio, torchvision, triton 3.6.0 and numba are never
# resolved: requirement-free stub wheels of the versions vLLM pins stand in for them (so pip never
# reaches torch's nvidia-nccl pin, the failure of a plain `pip download vllm`), then are dropped.
# Dropped too: DEVICE_HAS (the image's own packages, KINDS.md "Python packages already there";
# DEVICE_PINS holds the resolution to the image's versions where they are known), what .whl/
# carries (WHL_DIR; pinned at its versions the same way), and NOT_NEEDED. Installed into one
# folder, stripped (strip_tree), tar'd, `xz -9e`, split at PART_BYTES: .vlla/ holds part 1, the sum
# of the whole and the list of parts; .vllb/, .vllc/ one part each (a part of 50 MB plus the repo
# stays under one call's 64 MiB).
#
# Built 2026-12-06: 90 wheels, 583 MB unpacked (vllm 267 MB of it, flashinfer 84 MB), 124,082,148 B
# of .tar.xz in 3 parts: .vlla 50,000,000 B (+ 119 B of sum), .vllb 50,000,000 B, .vllc 24,082,148 B.
#
# Removed from vLLM's wheel (a dense Qwen2/Llama model on an H100/H200 loads none of it), with the
# places in vLLM 0.26.0's own source that show each is optional:
# - vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so (FlashAttention-2, 305 MB): its import is guarded,
#   vllm/vllm_flash_attn/flash_attn_interface.py:13-20 (try/except ImportError -> FA2_AVAILABLE =
#   False); on SM90 vllm/v1/attention/backends/fa_utils.py:154-156 picks FA3 (_vllm_fa3_C, kept);
#   FA2 is only the fallback for ALiBi (:182-186), Blackwell (:175-180, :237-250) and FA4 with
#   VLLM_BATCH_INVARIANT (:224-231), none of which a dense Qwen2/Llama on Hopper meets.
# - vllm/_moe_C_stable_libtorch.abi3.so (MoE ops, 47 MB): imported under contextlib.suppress
#   (ImportError), vllm/platforms/cuda.py:227-228 (and interface.py:369-370); its fake-op
#   registration checks hasattr(torch.ops, "_moe_C") first, vllm/_custom_ops.py:2463.
# - vllm/third_party/deep_gemm/ (DeepGEMM: _C for five Pythons and its JIT headers, 35 MB):
#   vllm/utils/deep_gemm.py:159-193 imports it in try/except and returns None; has_deep_gemm()
#   (vllm/utils/import_utils.py:475-482) answers False through _has_module's find_spec
#   (:394-410). Used for FP8 block-quantized GEMMs and MoE only.
# - vllm/third_party/fmha_sm100/ (SM100 sparse attention, 30 MB): imported lazily by MiniMax-M3
#   alone, vllm/models/minimax_m3/nvidia/sparse_attention_msa.py:75 (inside forward) and
#   vllm/models/minimax_m3/common/indexer.py:499 ("so AMD / non-SM100 never import fmha_sm100").
# - vllm/vllm-rs (the Rust API-server frontend binary, 43 MB): looked up only when
#   VLLM_USE_RUST_FRONTEND=1, vllm/envs.py:550-580, for `vllm serve`
#   (vllm/entrypoints/cli/serve.py:259); the engine (AsyncLLM) never starts it.
# Kept: vllm/_C_stable_libtorch.abi3.so (vLLM's ops), vllm_flash_attn/_vllm_fa3_C.abi3.so
# (FLASH_ATTN on SM90), cumem_allocator, fs_io_C, spinloop, _rust_tool_parser, and
# _flashmla_C/_flashmla_extension_C/_qutlass_C (4 MB together, imported under guards);
# vllm_flash_attn/cute (FA4's Python: on SM90 only for head sizes over 256 or diff-KV sinks,
# fa_utils.py:194-222, never for Qwen2/Llama).
#
# NOT_NEEDED: packages of vLLM's requirements a dense model on SM90 never imports (the import
# sites are guarded or lazy, on paths for other models, quantizations, video or GPUs):
# - nvidia-cutlass-dsl and its four -libs-* wheels (CuTe DSL, 180 MB of wheels) and
#   quack-kernels: FA4 (vllm_flash_attn/cute), the MoE router GEMM
#   (vllm/model_executor/kernels/linear/cute_dsl/ll_bf16.py:19-31: `import cutlass` in
#   try/except), Mamba/GDN, DeepSeek-V4 and MiniMax-M3 kernels; flashinfer imports without it.
# - tokenspeed-mla and tokenspeed-triton (95 MB): MLA backends only,
#   vllm/v1/attention/backends/mla/tokenspeed_mla.py:121-127 (try/except: "not installed").
# - humming-kernels and what its [cu13] extra brings, nvidia-cuda-nvcc, -nvvm, -cccl, -crt,
#   -nvdisasm (130 MB), and pyelftools: quantized (FP4/FP8/mixed-precision) GEMMs, reached
#   through the lazy facade vllm/utils/humming.py:3-32 and has_humming()
#   (vllm/utils/import_utils.py:552-554).
# - tilelang and z3-solver (75 MB): DeepSeek-V4's mHC kernels, imported inside the functions of
#   vllm/model_executor/kernels/mhc/tilelang.py (:32, ...); tilelang_kernels.py:15-21 asks for it.
# - pynvvideocodec (43 MB) and torchcodec: video inputs, vllm/multimodal/video.py:34-39
#   (try/except) and :799 (inside a function).
# flashinfer-cubin (448 MB) is left out: its cubins are TensorRT-LLM-gen FMHA/GEMM and DeepGEMM
# kernels (Blackwell). The dense SM90 path does use FlashInfer: top-p/top-k sampling
# (VLLM_USE_FLASHINFER_SAMPLER, on by default; vllm/v1/sample/ops/topk_topp_sampler.py:44 imports
# vllm.v1.attention.backends.flashinfer, whose line 12 imports flashinfer unguarded, so
# flashinfer-python must be there), whose kernels flashinfer JIT-compiles with the image's nvcc on
# first use (cached in ~/.cache/flashinfer); VLLM_USE_FLASHINFER_SAMPLER=0 takes vLLM's own
# sampler instead.
# vLLM's pins against the image: numba==0.65.0 is not bundled (it needs numpy<2.4; the image's
# numba stays, used by vLLM only for n-gram speculative decoding, vllm/v1/spec_decode/
# ngram_proposer.py:7); mistral-common (bundled) declares numpy<2.4 on Python <= 3.12, which the
# image's numpy 2.5.2 breaks (Mistral tokenizers and Pixtral/Voxtral only); setuptools<81,
# opencv-python-headless>=4.13 and protobuf's exclusions hold only if the image's versions (not
# known here) do.
#
# Checked here (2026-12-06), with the parts joined, checked and extracted by vllm_env.sh into a
# CPython 3.12 with torch 2.11.0+cu130 from PyPI (the image's build) and the image's known
# versions: every top-level module of the bundle imports, and vllm.v1.engine.async_llm, the qwen2
# and llama models, the FLASH_ATTN and FlashInfer backends, the GPU model runner and the
# structured-output backends; with a stub libcuda.so.1, _C_stable_libtorch, _vllm_fa3_C and
# cumem_allocator load and register their ops (FA3 available, FA2 not); every NEEDED library of
# the bundle's .so files is in the bundle, torch's nvidia wheels or glibc/libstdc++, except
# libcuda.so.1 (the driver's).
#
# On the device, one call after the other, each within 30 s of the last (a warm machine keeps
# /tmp; KINDS.md), four calls:
#   call 1: carry [".whl"],  command `bash realtime/bench/gpu/vllm_env.sh` (env.sh installs
#           /tmp/site; skip this call where an earlier one on the same machine did)
#   call 2: carry [".vlla"], command `bash realtime/bench/gpu/vllm_env.sh`
#   call 3: carry [".vllb"], command `bash realtime/bench/gpu/vllm_env.sh`
#   call 4: carry [".vllc"], command `bash realtime/bench/gpu/vllm_env.sh` (extracts, imports
#           vllm and the rest) or `source realtime/bench/gpu/env.sh && source
#           realtime/bench/gpu/vllm_env.sh || exit 1; <the run>`. It has ~31 MB to spare
#           (.vllc 24.1 MB + the repo 12 MB), not enough for .whl (50 MB).
# vllm_env.sh copies each carried part to /tmp/vllpart/; once all are there it checks the sum,
# extracts them once into /tmp/site-vllm and puts that on PYTHONPATH after /tmp/site. Later calls
# on the same machine carry nothing.
# Usage, from the repo root: bash realtime/bench/gpu/vllm_bundle.sh
# (WHL_DIR: the .whl/ folder whose packages stay out, default .whl; VLLM_WHEEL: a local vllm
# wheel, saves its 304 MB download; PY: a CPython 3.12, which evaluates the requirements' markers.)
set -euo pipefail

VLLM_VERSION=0.26.0
PART_BYTES=50000000
EXTRA=(hibari-tts==0.2.1 silero-vad==6.2.3)
# Stand-ins for the image's torch family, at the versions vLLM 0.26.0 pins (torch 2.11.0 is the
# image's own), and its numba (vLLM pins 0.65.0, whose numpy<2.4 the image's numpy 2.5.2 breaks)
STUBS=(torch==2.11.0 torchaudio==2.11.0 torchvision==0.26.0 triton==3.6.0 numba==0.65.0)
# The image's versions, where KINDS.md or an earlier bundle read them: the resolution keeps to them
DEVICE_PINS="transformers==5.17.0 tokenizers==0.23.2 safetensors==0.8.0 huggingface-hub==1.33.0
onnxruntime==1.30.0 sentencepiece==0.2.2 tiktoken==0.14.0 grpcio==1.84.0"
# The device image's packages (KINDS.md, "Python packages already there", as of 2026-11-17).
DEVICE_HAS="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops
equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch
grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig
interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13
nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray
xxhash yarl zipp"
# What a dense model on SM90 never imports (the header says where vLLM guards each)
NOT_NEEDED="nvidia-cutlass-dsl nvidia-cutlass-dsl-libs-base nvidia-cutlass-dsl-libs-core
nvidia-cutlass-dsl-libs-cu12 nvidia-cutlass-dsl-libs-cu13 quack-kernels tokenspeed-mla
tokenspeed-triton humming-kernels nvidia-cuda-nvcc nvidia-nvvm nvidia-cuda-cccl nvidia-cuda-crt
nvidia-cuda-nvdisasm pyelftools tilelang z3-solver pynvvideocodec torchcodec"
# manylinux_2_28 first: pip takes the first platform a package has a wheel for
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64
    --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64)

cd "$(dirname "$0")/../../.."
WHL_DIR="${WHL_DIR:-.whl}"
# pip evaluates requirement markers (python_version > "3.11": vLLM's setuptools and six) with the
# interpreter it runs on, whatever --python-version says: resolve with a 3.12
PY="${PY:-python3.12}"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
    PY="$(compgen -G "$(pyenv root 2>/dev/null || echo /nonexistent)/versions/3.12*/bin/python3.12" | tail -1 || true)"
fi
if [ -z "$PY" ] || ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
    echo "vllm_bundle.sh: no CPython 3.12 found (PY=...)" >&2
    exit 1
fi
if ! compgen -G "$WHL_DIR/*.whl" >/dev/null; then
    echo "vllm_bundle.sh: no wheels in $WHL_DIR (the .whl/ of docs/benchmarks.md; WHL_DIR=... names it)" >&2
    exit 1
fi
# shellcheck source=realtime/bench/gpu/bundle_lib.sh
source realtime/bench/gpu/bundle_lib.sh
bundle_workdir vllm_bundle

# Removes what a dense model on SM90 never loads (the header says why each may go), the voice
# kind's unused Silero exports (models/voice/vad.py reads silero_vad.onnx alone), tests and caches.
strip_tree() {
    local site="$1"
    rm -f "$site"/vllm/vllm_flash_attn/_vllm_fa2_C*.so "$site"/vllm/_moe_C*.so "$site/vllm/vllm-rs"
    rm -rf "$site/vllm/third_party/deep_gemm" "$site/vllm/third_party/fmha_sm100" "${site:?}/bin"
    find "$site/silero_vad/data" -type f ! -name silero_vad.onnx ! -name __init__.py -delete
    find "$site" -depth -type d \( -name tests -o -name __pycache__ \) -exec rm -rf {} +
    find "$site" -name '*.pyi' -delete
}

# 1. Stubs: requirement-free wheels; a local version (+stub) ranks above the index's own
mkdir -p "$WORK/stubs"
"$PY" - "$WORK/stubs" "${STUBS[@]}" <<'EOF'
import pathlib, sys, zipfile
out = pathlib.Path(sys.argv[1])
for spec in sys.argv[2:]:
    name, version = spec.split("==")
    dist, info = name.replace("-", "_"), f"{name.replace('-', '_')}-{version}+stub.dist-info"
    with zipfile.ZipFile(out / f"{dist}-{version}+stub-py3-none-any.whl", "w") as z:
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}+stub\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
EOF
# 2. Constraints: what .whl/ carries at its versions, the image's known versions for the rest
skip=" ${DEVICE_HAS//$'\n'/ } ${NOT_NEEDED//$'\n'/ } "
: >"$WORK/constraints.txt"
for wheel in "$WHL_DIR"/*.whl; do
    name="$(project "$wheel")"
    skip+="$name "
    echo "$name==$(basename "$wheel" | cut -d- -f2)" >>"$WORK/constraints.txt"
done
for pin in $DEVICE_PINS; do
    grep -q "^${pin%%==*}==" "$WORK/constraints.txt" || echo "$pin" >>"$WORK/constraints.txt"
done
# 3. Resolve (metadata only), then fetch only what is bundled
vllm_req="vllm==$VLLM_VERSION"
[ -n "${VLLM_WHEEL:-}" ] && vllm_req="$VLLM_WHEEL"
nice -n 19 "$PY" -m pip install -q --dry-run --ignore-installed --report "$WORK/report.json" \
    "${TARGET[@]}" --target "$WORK/dry" --find-links "$WORK/stubs" -c "$WORK/constraints.txt" \
    "$vllm_req" "${EXTRA[@]}" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
"$PY" - "$WORK/report.json" "$skip" >"$WORK/bundled.txt" <<'EOF'
import json, re, sys
skip = set(sys.argv[2].split())
for item in json.load(open(sys.argv[1]))["install"]:
    name = re.sub(r"[-_.]+", "-", item["metadata"]["name"]).lower()
    version = item["metadata"]["version"]
    if name not in skip and "+stub" not in version:
        print(f"{name}=={version}")
EOF
mkdir -p "$WORK/wheels"
if [ -n "${VLLM_WHEEL:-}" ]; then
    cp "$VLLM_WHEEL" "$WORK/wheels/"
    sed -i '/^vllm==/d' "$WORK/bundled.txt"
fi
nice -n 19 "$PY" -m pip download -q --no-deps "${TARGET[@]}" -d "$WORK/wheels" -r "$WORK/bundled.txt" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
for wheel in "$WORK"/wheels/*.whl; do
    echo "bundled: $(basename "$wheel")"
done
nice -n 19 "$PY" -m pip install -q --root-user-action=ignore --no-index --no-deps --no-compile \
    --no-cache-dir "${TARGET[@]}" --target "$WORK/site" "$WORK"/wheels/*.whl \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
strip_tree "$WORK/site"
du -sb "$WORK/site"

tar cf - -C "$WORK/site" --sort=name --owner=0 --group=0 --numeric-owner . |
    nice -n 19 xz -9e -T2 >"$WORK/vll.tar.xz"
rm -rf .vll[a-z]
mkdir -p .vlla
split -b "$PART_BYTES" -a 2 "$WORK/vll.tar.xz" "$WORK/vll.tar.xz."
(cd "$WORK" && sha256sum vll.tar.xz && ls vll.tar.xz.a?) >.vlla/vll.tar.xz.sha256
letters=(a b c d e f g h i j)
i=0
for part in "$WORK"/vll.tar.xz.a?; do
    mkdir -p ".vll${letters[i]}"
    mv "$part" ".vll${letters[i]}/"
    i=$((i + 1))
done
ls -l .vll[a-z]
