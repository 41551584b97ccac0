"""Billable endpoints other than chat, through the real ``openai`` and ``anthropic``
SDKs against FakeLLMServer: a tripped chain sends none of them, a cost ceiling
refuses one it cannot price before it is sent (saying how to price it), a
priced one is charged per unit, a job billed later reserves its bound, and the
free ones stay untouched.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import openai
import pytest

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel.instrumentors.anthropic import AnthropicInstrumentor
from veronica_otel.policy_file import PolicyFile
from veronica_otel.testing import FakeLLMServer

if TYPE_CHECKING:
    import anthropic

pytestmark = [
    pytest.mark.filterwarnings("ignore:The Assistants API is deprecated"),
    pytest.mark.filterwarnings("ignore:The Sora API is scheduled"),
]
_Call = Callable[[Any], Any]
_AUDIO = ("speech.mp3", io.BytesIO(b"ID3 fake audio"), "audio/mpeg")
_IMAGE = ("cat.png", io.BytesIO(b"\x89PNG fake"), "image/png")

# Every endpoint the issue saw pass a tripped chain, as a user calls it.
OPENAI_CALLS: dict[str, _Call] = {
    "images.generate": lambda c: c.images.generate(model="dall-e-3", prompt="a cat"),
    "images.edit": lambda c: c.images.edit(model="dall-e-2", image=_IMAGE, prompt="a hat"),
    "audio.speech.create": lambda c: c.audio.speech.create(
        model="tts-1", voice="alloy", input="Hello there."
    ),
    "audio.transcriptions.create": lambda c: c.audio.transcriptions.create(
        model="whisper-1", file=_AUDIO
    ),
    "batches.create": lambda c: c.batches.create(
        input_file_id="file-1", endpoint="/v1/chat/completions", completion_window="24h"
    ),
    "responses.compact": lambda c: c.responses.compact(model="gpt-4o", previous_response_id="r1"),
    "beta.threads.runs.create": lambda c: c.beta.threads.runs.create(
        thread_id="thread_1", assistant_id="asst_1"
    ),
    "videos.create": lambda c: c.videos.create(prompt="a cat", model="sora-2"),
    "fine_tuning.jobs.create": lambda c: c.fine_tuning.jobs.create(
        model="gpt-4o-mini-2024-07-18", training_file="file-1"
    ),
}
_BATCH_REQUEST = {
    "custom_id": "one",
    "params": {
        "model": "claude-3-5-haiku-20241022",
        "max_tokens": 1000,
        "messages": [{"role": "user", "content": "Hello"}],
    },
}
ANTHROPIC_CALLS: dict[str, _Call] = {
    "messages.batches.create": lambda c: c.messages.batches.create(requests=[_BATCH_REQUEST]),
    "beta.messages.batches.create": lambda c: c.beta.messages.batches.create(
        requests=[_BATCH_REQUEST]
    ),
}


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


def _sent(server: FakeLLMServer) -> int:
    return int(server.stats()["total"])


def _trip_on_steps(client: openai.OpenAI) -> ExecutionContext:
    ctx = ExecutionContext(ExecutionConfig(max_steps=1))
    with ctx:
        client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
        )
        with pytest.raises(BudgetExceededError):
            client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
            )
    return ctx


@pytest.mark.parametrize("name", sorted(OPENAI_CALLS))
def test_a_tripped_chain_sends_no_openai_endpoint(
    name: str, client: openai.OpenAI, server: FakeLLMServer
) -> None:
    ctx = _trip_on_steps(client)
    before = _sent(server)
    with ctx, pytest.raises(BudgetExceededError) as caught:
        OPENAI_CALLS[name](client)
    assert caught.value.trip.reason == "steps"
    assert _sent(server) == before


@pytest.mark.parametrize("name", sorted(ANTHROPIC_CALLS))
def test_a_tripped_chain_sends_no_anthropic_batch(
    name: str, claude: anthropic.Anthropic, client: openai.OpenAI, server: FakeLLMServer
) -> None:
    ctx = _trip_on_steps(client)
    before = _sent(server)
    with ctx, pytest.raises(BudgetExceededError):
        ANTHROPIC_CALLS[name](claude)
    assert _sent(server) == before


@pytest.mark.parametrize(
    "name",
    [
        "images.edit",  # a dall-e-2 edit has a list price: not refused (sent, below)
        "audio.transcriptions.create",
        "batches.create",
        "responses.compact",
        "beta.threads.runs.create",
        "fine_tuning.jobs.create",
    ],
)
def test_a_cost_ceiling_refuses_what_it_cannot_price_before_sending(
    name: str, client: openai.OpenAI, server: FakeLLMServer
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=5.0)) as ctx:
        try:
            OPENAI_CALLS[name](client)
        except BudgetExceededError as exc:
            assert exc.trip.reason == "cost" and not exc.trip.sticky
            assert "[prices." in exc.trip.message and "per_request" in exc.trip.message
            assert _sent(server) == 0
            assert ctx.snapshot().steps == 0
        except openai.NotFoundError:  # priced (dall-e-2 list price), sent; a 404 bills nothing
            assert name == "images.edit"
            assert _sent(server) == 1
            assert ctx.snapshot().steps == 1
        else:
            pytest.fail(f"{name} was neither refused nor sent")


def test_an_image_model_with_no_price_is_refused_naming_per_image(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    with (
        ExecutionContext(ExecutionConfig(max_cost_usd=5.0)),
        pytest.raises(BudgetExceededError) as caught,
    ):
        client.images.generate(model="gpt-image-1", prompt="a cat")
    detail = caught.value.trip.message
    assert '[prices."openai:gpt-image-1"] per_image' in detail
    assert _sent(server) == 0


def test_a_priced_image_call_charges_per_image_and_size(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        result = client.images.generate(
            model="dall-e-3", prompt="a cat", n=1, size="1792x1024", quality="hd"
        )
        assert len(result.data or []) == 1
        client.images.generate(model="dall-e-2", prompt="a cat", n=3, size="256x256")
    snapshot = ctx.snapshot()
    assert snapshot.steps == 2
    assert snapshot.cost_usd == pytest.approx(0.12 + 3 * 0.016)
    assert _sent(server) == 2


def test_a_user_priced_image_model_ignores_its_token_usage(
    client: openai.OpenAI, server: FakeLLMServer, tmp_path: Path
) -> None:
    """gpt-image-1 reports tokens; the call is charged per image as priced."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[prices."openai:gpt-image-1"]\nper_image = 0.25\n')
    table = PolicyFile(policy).price_table()
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0), price_table=table) as ctx:
        client.images.generate(model="gpt-image-1", prompt="a cat", n=2)
        with pytest.raises(BudgetExceededError):  # 2 x 0.25 more would pass 1.0
            client.images.generate(model="gpt-image-1", prompt="a cat", n=3)
    assert ctx.snapshot().cost_usd == pytest.approx(0.50)
    assert _sent(server) == 1


def test_speech_and_video_are_priced_per_character_and_second(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        client.videos.create(prompt="a cat", model="sora-2", seconds="8")
    assert ctx.snapshot().cost_usd == pytest.approx(0.80)
    text = "x" * 1000
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        audio = client.audio.speech.create(model="tts-1-hd", voice="alloy", input=text)
        assert audio.read()
    assert ctx.snapshot().cost_usd == pytest.approx(1000 * 30e-6)
    assert _sent(server) == 2


def test_a_job_reserves_its_configured_bound(
    client: openai.OpenAI, server: FakeLLMServer, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[prices."openai:batches"]\nper_request = 2.5\n'
        '[prices."openai:fine_tuning.jobs"]\nper_request = 4.0\n'
    )
    table = PolicyFile(policy).price_table()
    with ExecutionContext(ExecutionConfig(max_cost_usd=5.0), price_table=table) as ctx:
        OPENAI_CALLS["batches.create"](client)
        with pytest.raises(BudgetExceededError):  # 2.5 spent: a 4.0 job does not fit
            OPENAI_CALLS["fine_tuning.jobs.create"](client)
    assert ctx.snapshot().cost_usd == pytest.approx(2.5)
    assert server.stats()["routes"] == {"/v1/batches": 1}


def test_an_anthropic_message_batch_is_priced_from_its_requests_at_the_batch_rate(
    claude: anthropic.Anthropic, server: FakeLLMServer
) -> None:
    # claude-3-5-haiku: $0.80 / $4 per Mtok standard; a batch bills half.
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        claude.messages.batches.create(requests=[_BATCH_REQUEST] * 10)
    cost = ctx.snapshot().cost_usd
    output_worst = 10 * 1000 * 4.0 / 1e6 / 2  # and a little input, rounded up to a cent
    assert cost == pytest.approx(output_worst + 0.01)
    assert _sent(server) == 1


def test_without_a_cost_ceiling_an_unpriced_endpoint_counts_a_step(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=2)) as ctx:
        OPENAI_CALLS["batches.create"](client)
        OPENAI_CALLS["fine_tuning.jobs.create"](client)
        with pytest.raises(BudgetExceededError):
            OPENAI_CALLS["videos.create"](client)
    assert ctx.snapshot().steps == 2
    assert _sent(server) == 2


def test_free_endpoints_stay_free(client: openai.OpenAI, server: FakeLLMServer) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=0.000001, max_steps=1)) as ctx:
        client.models.list()
        client.files.create(file=("a.jsonl", io.BytesIO(b"{}"), "text/plain"), purpose="batch")
        with pytest.raises(openai.NotFoundError):
            client.batches.cancel("batch_1")
    assert ctx.snapshot().steps == 0
    assert _sent(server) == 3


def test_async_clients_are_contained_alike(server: FakeLLMServer, client: openai.OpenAI) -> None:
    async def main() -> None:
        async with openai.AsyncOpenAI(
            base_url=server.openai_base_url, api_key="t", max_retries=0
        ) as aclient:
            with ExecutionContext(ExecutionConfig(max_cost_usd=5.0)):
                await aclient.images.generate(model="dall-e-2", prompt="a cat", n=2)
                with pytest.raises(BudgetExceededError):
                    await aclient.batches.create(
                        input_file_id="f", endpoint="/v1/chat/completions", completion_window="24h"
                    )

    asyncio.run(main())
    assert server.stats()["routes"] == {"/v1/images/generations": 1}


def _batch_file(lines: int, max_tokens: int | None) -> bytes:
    body: dict[str, Any] = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    row = {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": body}
    return b"\n".join(json.dumps({**row, "custom_id": f"c{i}"}).encode() for i in range(lines))


def test_a_batch_whose_file_was_uploaded_here_reserves_its_lines_at_the_batch_rate(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    """gpt-4o-mini: $0.15 / $0.60 per Mtok; 100 lines of 1000 output tokens at half
    price is $0.03 of output, plus a little input, rounded up to a cent."""
    content = _batch_file(100, 1000)
    uploaded = client.files.create(
        file=("batch.jsonl", io.BytesIO(content), "application/jsonl"), purpose="batch"
    )
    assert uploaded.bytes == len(content)  # read on the way, rewound for the SDK
    with ExecutionContext(ExecutionConfig(max_cost_usd=0.05)) as ctx:
        client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        with pytest.raises(BudgetExceededError):  # a second one no longer fits
            client.batches.create(
                input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
    assert ctx.snapshot().cost_usd == pytest.approx(0.04)
    with ExecutionContext(ExecutionConfig(max_cost_usd=5.0)), pytest.raises(BudgetExceededError):
        client.batches.create(  # a file not uploaded here: unbounded, refused
            input_file_id="file-elsewhere", endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert server.stats()["routes"] == {"/v1/files": 1, "/v1/batches": 1}


def test_an_adapters_unpriced_endpoint_is_admitted_at_its_configured_bound(
    server: FakeLLMServer, tmp_path: Path
) -> None:
    """A Gemini batch (priced=False in its adapter) is refused naming the key that
    bounds it; with the bound configured it is sent, and costs the bound."""
    from google import genai

    from veronica_otel.instrumentors.google_genai import GoogleGenAIInstrumentor

    instrumentor = GoogleGenAIInstrumentor()
    instrumentor.instrument()
    try:
        gemini = genai.Client(
            api_key="t", http_options=genai.types.HttpOptions(base_url=server.base_url)
        )
        src: Any = [{"contents": [{"parts": [{"text": "hi"}], "role": "user"}]}]
        with (
            ExecutionContext(ExecutionConfig(max_cost_usd=5.0)),
            pytest.raises(BudgetExceededError) as caught,
        ):
            gemini.batches.create(model="gemini-2.0-flash", src=src)
        assert '[prices."gcp.gemini:batchGenerateContent"] per_request' in caught.value.trip.message
        assert _sent(server) == 0
        policy = tmp_path / "policy.toml"
        policy.write_text('[prices."gcp.gemini:batchGenerateContent"]\nper_request = 1.5\n')
        table = PolicyFile(policy).price_table()
        with ExecutionContext(ExecutionConfig(max_cost_usd=2.0), price_table=table) as ctx:
            gemini.batches.create(model="gemini-2.0-flash", src=src)
            with pytest.raises(BudgetExceededError):  # a second 1.5 does not fit in 2.0
                gemini.batches.create(model="gemini-2.0-flash", src=src)
        assert ctx.snapshot().cost_usd == pytest.approx(1.5)
        assert _sent(server) == 1
    finally:
        instrumentor.uninstrument()


def test_an_azure_deployment_is_not_taken_for_the_default_image_model(
    server: FakeLLMServer, client: openai.OpenAI
) -> None:
    """With the deployment in the client, the body names no model: not dall-e-2's price."""
    azure = openai.AzureOpenAI(
        azure_endpoint=server.base_url,
        azure_deployment="my-dalle-3",
        api_key="t",
        api_version="2024-10-21",
        max_retries=0,
    )
    with (
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)),
        pytest.raises(BudgetExceededError, match="per_image"),
    ):
        azure.images.generate(prompt="a cat")
    assert _sent(server) == 0
