"""Input a request's bytes do not show: what the provider bills beyond the text sent.

The byte walk (:func:`~._admit.input_bound`) bounds the text a request
carries. A provider also bills input it expands itself:

- images, at the provider's documented maximum for their detail (their size
  is never read: a URL or a file id says nothing of it, and base64 data is
  not decoded on the hot path);
- files and documents (PDF pages are text plus page images) and audio, whose
  tokens only the provider knows, and server-side context (``previous_response_id``,
  ``conversation``, stored prompts, a code-execution ``container``, tools the
  provider runs and whose results it feeds back): bounded by the model's
  context window, since no request's input can exceed it.

:func:`openai_hidden` and :func:`anthropic_hidden` read a request body once
and return ``(extra_tokens, server_side)``; :func:`hidden_input_tokens` turns that into
the call's input bound. :func:`anthropic_hidden` also says whether the
request marks blocks to cache (``cache_control``), the only way it can be
billed at the cache-write price.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from veronica_otel._pricing import default_price_table

__all__ = [
    "ANTHROPIC_IMAGE_TOKENS",
    "DEFAULT_CONTEXT_WINDOW",
    "anthropic_hidden",
    "openai_hidden",
    "openai_image_tokens",
    "hidden_input_tokens",
]

#: Input bound for server-side context when the price table knows no context
#: window for the model: above every context window we know of (2,097,152).
DEFAULT_CONTEXT_WINDOW = 4_194_304

#: Anthropic's most tokens for one image: ``width * height / 750``, images
#: over 1.15 megapixels (or 1568 px on the long edge) scaled down first:
#: "about 1,600 tokens" (docs.anthropic.com, Vision, "Evaluate image size").
ANTHROPIC_IMAGE_TOKENS = 1_600

# OpenAI images (platform.openai.com/docs/guides/images-vision, "Calculating
# costs"). Tile models: ``base + per_tile * tiles``, the image fit in 2048 x
# 2048 then its short side scaled to 768: at most 2 x 4 = 8 tiles of 512 px;
# ``detail: low`` is the base alone. Patch models: 32 px patches, at most
# 1,536, times the model's multiplier, whatever the detail. Longest prefix wins.
_MAX_TILES = 8
_TILES: dict[str, tuple[int, int]] = {
    "gpt-4o": (85, 170),
    "chatgpt-4o": (85, 170),
    "gpt-4.1": (85, 170),
    "gpt-4.5": (85, 170),
    "gpt-4o-mini": (2_833, 5_667),
    "o1": (75, 150),
    "o3": (75, 150),
    "gpt-5": (70, 140),
    "computer-use-preview": (65, 129),
}
_PATCHES: dict[str, float] = {
    "gpt-4.1-mini": 1.62,
    "gpt-4.1-nano": 2.46,
    "gpt-5-mini": 1.62,
    "gpt-5-nano": 2.46,
    "o4-mini": 1.72,
}
_MAX_PATCHES = 1_536
#: An image for a model in neither table: the dearest of them (gpt-4o-mini, high detail).
OPENAI_IMAGE_TOKENS_UNKNOWN = 2_833 + 5_667 * _MAX_TILES

# Content part / input item types whose tokens the provider alone knows.
_OPENAI_SERVER_PARTS = frozenset(("file", "input_file", "input_audio", "audio"))
_OPENAI_IMAGE_PARTS = frozenset(("image_url", "input_image"))
# Server-side input of the Responses API: ``previous_response_id``,
# ``conversation``, and ``prompt`` when it is a mapping (a stored template;
# a legacy completion's ``prompt`` is its text).
# Tools OpenAI runs itself, feeding their results back as input (function and
# custom tools are run by the caller: their results come in a later request).
_OPENAI_CLIENT_TOOLS = frozenset(
    ("function", "custom", "local_shell", "apply_patch", "computer_use_preview")
)

# Tools Anthropic runs itself (their type is versioned: web_search_20250305, ...).
_ANTHROPIC_SERVER_TOOLS = ("web_search", "web_fetch", "code_execution", "tool_search")


def hidden_input_tokens(
    provider: str, model: str, bound: int, extra: int, server_side: bool
) -> int:
    """What to add to a byte walk's input ``bound``: ``extra`` (images and the
    like), and with ``server_side`` input, up to the model's context window."""
    if not server_side:
        return extra
    prices = default_price_table().lookup(provider, model)
    window = (prices.context_window if prices is not None else None) or DEFAULT_CONTEXT_WINDOW
    return extra + max(0, window - (bound + extra))


def openai_image_tokens(model: str, detail: object) -> int:
    """Most tokens one image costs on ``model`` at ``detail`` (size unknown)."""
    name = model.strip().lower()
    best, tiles = "", None
    for prefix, cost in _TILES.items():
        if name.startswith(prefix) and len(prefix) > len(best):
            best, tiles = prefix, cost
    patches = None
    for prefix, multiplier in _PATCHES.items():
        if name.startswith(prefix) and len(prefix) > len(best):
            best, patches = prefix, multiplier
    if patches is not None:
        return -(-_MAX_PATCHES * int(patches * 100) // 100)
    if tiles is None:
        return OPENAI_IMAGE_TOKENS_UNKNOWN
    base, per_tile = tiles
    return base if detail == "low" else base + per_tile * _MAX_TILES


def openai_hidden(body: Mapping[str, Any], model: str) -> tuple[int, bool]:
    """Images and server-side input of a chat, Responses or completions body."""
    get = body.get
    prompt = get("prompt")  # a legacy completion's text, or a Responses prompt template
    server_side = (
        get("previous_response_id") is not None
        or get("conversation") is not None
        or (prompt is not None and type(prompt) is not str and _is_mapping(prompt))
    )
    tools = get("tools")
    if tools and type(tools) is list and not server_side:
        for tool in tools:
            if _is_mapping(tool) and tool.get("type", "function") not in _OPENAI_CLIENT_TOOLS:
                server_side = True
                break
    extra = 0
    for items in (get("messages"), get("input")):
        if type(items) is not list:
            continue  # absent, or a string: text only
        for item in items:
            if type(item) is dict:
                content = item.get("content")
                if type(content) is str:
                    continue  # the common message: text only, nothing to look for
            elif not _is_mapping(item):
                continue
            else:
                content = item.get("content")
            for part in content if type(content) is list else (item,):  # Responses: bare items
                kind = part.get("type") if _is_mapping(part) else None
                if kind in _OPENAI_IMAGE_PARTS:
                    image = part.get("image_url")
                    detail = part.get("detail")
                    if _is_mapping(image):  # chat: {"image_url": {"url", "detail"}}
                        detail = image.get("detail")
                    extra += openai_image_tokens(model, detail)
                elif kind in _OPENAI_SERVER_PARTS or kind == "item_reference":
                    server_side = True
    return extra, server_side


def anthropic_hidden(body: Mapping[str, Any]) -> tuple[int, bool, bool]:
    """Images, server-side input and cache marks of a Messages body:
    ``(extra_tokens, server_side, cache_writes)``."""
    server_side = body.get("container") is not None or body.get("mcp_servers") is not None
    cache = "cache_control" in body  # automatic caching of the whole prompt
    tools = body.get("tools")
    if tools and type(tools) is list:
        for tool in tools:
            if not _is_mapping(tool):
                continue
            kind = tool.get("type")
            if type(kind) is str and kind.startswith(_ANTHROPIC_SERVER_TOOLS):
                server_side = True
            if "cache_control" in tool:
                cache = True
    found = None  # made for the first list of blocks (text-only messages have none)
    system = body.get("system")
    if type(system) is list:
        found = _Found()
        _anthropic_blocks(system, found)
    messages = body.get("messages")
    if type(messages) is list:
        for message in messages:
            if type(message) is dict or _is_mapping(message):
                content = message.get("content")
                if type(content) is list:  # else a string: text only
                    if found is None:
                        found = _Found()
                    _anthropic_blocks(content, found)
    if found is None:
        return 0, server_side, cache
    return found.images * ANTHROPIC_IMAGE_TOKENS, server_side or found.server, cache or found.cache


class _Found:
    __slots__ = ("cache", "images", "server")

    def __init__(self) -> None:
        self.images = 0
        self.server = False
        self.cache = False


def _anthropic_blocks(blocks: object, found: _Found) -> None:
    if type(blocks) is not list:
        return  # a string: text only
    for block in blocks:
        if not _is_mapping(block):
            continue
        if "cache_control" in block:
            found.cache = True
        kind = block.get("type")
        if kind == "image":
            found.images += 1
        elif kind == "document":
            source = block.get("source")
            # Plain text and content blocks are walked; a PDF, URL or file is not.
            if not (_is_mapping(source) and source.get("type") in ("text", "content")):
                found.server = True
            elif source.get("type") == "content":
                _anthropic_blocks(source.get("content"), found)
        elif kind in ("container_upload", "mcp_tool_result") or (
            type(kind) is str and kind.startswith("server_tool")
        ):
            found.server = True
        content = block.get("content")
        if type(content) is list:  # tool_result and search_result blocks nest blocks
            _anthropic_blocks(content, found)


def _is_mapping(value: object) -> bool:
    return type(value) is dict or isinstance(value, Mapping)
