"""The reservation is the worst case of what the provider may bill (DESIGN G12), and no more.

Written as a user would: the real ``openai`` and ``anthropic`` SDKs against
the fake server, a cost ceiling below what the request may cost, and the
server counting what reached it. Input the provider expands on its side
(every prompt of a list, images, server-side context, tools it runs) is
reserved at its documented maximum or the model's context window, so such a
call is refused before it is sent; input is reserved at the cache-write
price only when the request marks blocks to cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import openai
import pytest

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel._pricing import default_price_table
from veronica_otel._units import nano_to_usd
from veronica_otel.instrumentors._admit import input_bound
from veronica_otel.instrumentors._hidden_input import ANTHROPIC_IMAGE_TOKENS, openai_image_tokens
from veronica_otel.instrumentors.anthropic import AnthropicInstrumentor
from veronica_otel.testing import FakeLLMServer

if TYPE_CHECKING:
    import anthropic

CHAT, COMPLETIONS, RESPONSES, MESSAGES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
)
IMAGE = "https://example.com/cat.png"
CLAUDE = "claude-haiku-4-5"


def _refused(server: FakeLLMServer, path: str, ceiling: float, call: Any) -> BudgetExceededError:
    with ExecutionContext(ExecutionConfig(max_cost_usd=ceiling)) as ctx:
        with pytest.raises(BudgetExceededError) as denied:
            call()
        assert ctx.snapshot().cost_usd == 0
    assert server.count(path) == 0
    assert denied.value.reason == "cost"
    return denied.value


# -- openai ------------------------------------------------------------------------------


def test_every_prompt_of_a_legacy_list_is_reserved(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    # 20 prompts x 500 tokens each at $2/M output is $0.02: not under $0.005.
    prompts = [f"Write story {i}." for i in range(20)]
    _refused(
        server,
        COMPLETIONS,
        0.005,
        lambda: client.completions.create(
            model="gpt-3.5-turbo-instruct", prompt=prompts, max_tokens=500
        ),
    )
    with ExecutionContext(ExecutionConfig(max_cost_usd=0.005)):  # one of them fits
        client.completions.create(
            model="gpt-3.5-turbo-instruct", prompt=prompts[:1], max_tokens=500
        )
    assert server.count(COMPLETIONS) == 1


def test_a_prompt_list_times_best_of_is_the_clamp_s_divisor(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    prompts = ["Say a.", "Say b.", "Say c."]
    prices = default_price_table().lookup("openai", "gpt-3.5-turbo-instruct")
    assert prices is not None
    with ExecutionContext(ExecutionConfig(max_cost_usd=0.01)):
        client.completions.create(model="gpt-3.5-turbo-instruct", prompt=prompts, best_of=2)
    bound = input_bound([prompts], 1)
    affordable = min(prices.max_output_tokens_for(10**7, bound), prices.output_limit(bound))
    assert server.requests[-1].body["max_tokens"] == affordable // 6


@pytest.mark.parametrize("detail", ["auto", "high", None])
def test_an_image_is_reserved_at_its_most_tokens(
    client: openai.OpenAI, server: FakeLLMServer, detail: str | None
) -> None:
    image: dict[str, Any] = {"url": IMAGE} if detail is None else {"url": IMAGE, "detail": detail}
    messages: Any = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": image},
            ],
        }
    ]
    # gpt-4o-mini bills an image up to 2,833 + 8 x 5,667 tokens: $0.0072 at $0.15/M.
    assert openai_image_tokens("gpt-4o-mini", detail) == 48_169
    _refused(
        server,
        CHAT,
        0.001,
        lambda: client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, max_completion_tokens=10
        ),
    )


def test_a_low_detail_image_costs_its_base_tokens(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    messages: Any = [
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": IMAGE, "detail": "low"}}],
        }
    ]
    with ExecutionContext(ExecutionConfig(max_cost_usd=0.001)):  # 2,833 tokens: $0.00043
        client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, max_completion_tokens=10
        )
    assert server.count(CHAT) == 1


def test_an_input_image_of_the_responses_api_is_reserved(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    content: Any = [{"type": "input_image", "image_url": IMAGE, "detail": "high"}]
    _refused(
        server,
        RESPONSES,
        0.001,
        lambda: client.responses.create(
            model="gpt-4o-mini", input=[{"role": "user", "content": content}], max_output_tokens=16
        ),
    )


@pytest.mark.parametrize(
    "server_side",
    [
        {"previous_response_id": "resp_123"},
        {"conversation": "conv_123"},
        {"prompt": {"id": "pmpt_123", "version": "2"}},
        {"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]},
        {"tools": [{"type": "web_search"}]},
    ],
    ids=["previous_response_id", "conversation", "prompt", "file_search", "web_search"],
)
def test_server_side_input_is_reserved_at_the_context_window(
    client: openai.OpenAI, server: FakeLLMServer, server_side: dict[str, Any]
) -> None:
    # gpt-4o-mini's 128k window at $0.15/M is $0.0192: not under $0.001.
    _refused(
        server,
        RESPONSES,
        0.001,
        lambda: client.responses.create(
            model="gpt-4o-mini", input="Go on.", max_output_tokens=16, **server_side
        ),
    )


def test_a_file_in_a_chat_is_reserved_at_the_context_window(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    messages: Any = [
        {"role": "user", "content": [{"type": "file", "file": {"file_id": "file-123"}}]}
    ]
    _refused(
        server,
        CHAT,
        0.001,
        lambda: client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, max_completion_tokens=10
        ),
    )


def test_text_and_function_tools_are_not_server_side(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    tool: Any = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    with ExecutionContext(ExecutionConfig(max_cost_usd=0.001)):
        client.responses.create(model="gpt-4o-mini", input="Hi", tools=[tool], max_output_tokens=16)
    assert server.count(RESPONSES) == 1


# -- anthropic ---------------------------------------------------------------------------


@pytest.fixture
def claude(server: FakeLLMServer) -> Iterator[anthropic.Anthropic]:
    import anthropic

    instrumentor = AnthropicInstrumentor()
    instrumentor.instrument()
    try:
        with anthropic.Anthropic(
            base_url=server.anthropic_base_url, api_key="t", max_retries=0
        ) as client:
            yield client
    finally:
        instrumentor.uninstrument()


def _image_message() -> Any:
    source = {"type": "url", "url": IMAGE}
    return [{"role": "user", "content": [{"type": "image", "source": source}]}]


def test_an_anthropic_image_is_reserved_at_its_most_tokens(
    claude: anthropic.Anthropic, server: FakeLLMServer
) -> None:
    # 1,600 tokens at $1/M is $0.0016: not under $0.001.
    assert ANTHROPIC_IMAGE_TOKENS == 1_600
    _refused(
        server,
        MESSAGES,
        0.001,
        lambda: claude.messages.create(model=CLAUDE, messages=_image_message(), max_tokens=10),
    )


@pytest.mark.parametrize(
    "extra",
    [
        {"container": "container_123"},
        {"tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3}]},
        {"tools": [{"type": "code_execution_20250825", "name": "code_execution"}]},
        {"mcp_servers": [{"type": "url", "url": "https://mcp.example.com", "name": "m"}]},
    ],
    ids=["container", "web_search", "code_execution", "mcp_servers"],
)
def test_anthropic_server_side_input_is_reserved_at_the_context_window(
    claude: anthropic.Anthropic, server: FakeLLMServer, extra: dict[str, Any]
) -> None:
    messages: Any = [{"role": "user", "content": "Go on."}]
    _refused(
        server,
        MESSAGES,
        0.01,
        lambda: claude.messages.create(
            model=CLAUDE, messages=messages, max_tokens=10, extra_body=extra
        ),
    )


def test_a_pdf_document_is_reserved_at_the_context_window(
    claude: anthropic.Anthropic, server: FakeLLMServer
) -> None:
    document = {"type": "document", "source": {"type": "url", "url": "https://e.com/a.pdf"}}
    messages: Any = [{"role": "user", "content": [document]}]
    _refused(
        server,
        MESSAGES,
        0.01,
        lambda: claude.messages.create(model=CLAUDE, messages=messages, max_tokens=10),
    )


def test_cache_write_price_only_where_the_request_marks_blocks_to_cache(
    claude: anthropic.Anthropic, server: FakeLLMServer
) -> None:
    prices = default_price_table().lookup("anthropic", CLAUDE)
    assert prices is not None
    text = "Read this carefully. " * 100
    marked: Any = [
        {
            "role": "user",
            "content": [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}],
        }
    ]
    plain: Any = [{"role": "user", "content": [{"type": "text", "text": text}]}]
    marked_bound, plain_bound = input_bound([marked], 1), input_bound([plain], 1)
    as_marked = prices.max_cost_nano(marked_bound, 10)
    as_plain = prices.max_cost_nano(marked_bound, 10, cache_writes=False)
    assert as_plain < as_marked
    ceiling = nano_to_usd(as_plain + (as_marked - as_plain) // 2)  # between the two
    assert prices.max_cost_nano(plain_bound, 10, cache_writes=False) <= as_plain
    _refused(
        server,
        MESSAGES,
        ceiling,
        lambda: claude.messages.create(model=CLAUDE, messages=marked, max_tokens=10),
    )
    with ExecutionContext(ExecutionConfig(max_cost_usd=ceiling)):
        claude.messages.create(model=CLAUDE, messages=plain, max_tokens=10)
    assert server.count(MESSAGES) == 1
