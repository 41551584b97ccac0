"""Span, event, metric and baggage names: written once, read by both sides.

The instrumentors and the kernel set these on spans, events and metric points;
the exporters (execution graph, Jaeger query) read them back; the baggage
entries one service's outbound guard writes, the next one's middleware reads. One table keeps
the two sides from drifting apart. ``gen_ai.*`` names follow OpenTelemetry's
GenAI semantic conventions (as its own instrumentors spell them);
``veronica.*`` names are ours. The values are a wire format: dashboards and
queries depend on them, so a value never changes.

Plain module constants: a hot-path read is one global lookup.
"""

from __future__ import annotations

# -- OpenTelemetry GenAI semantic conventions ---------------------------------
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_SYSTEM = "gen_ai.system"  # the older name of the provider, still read by some backends
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_OUTPUT_TYPE = "gen_ai.output.type"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
GEN_AI_REQUEST_TOP_K = "gen_ai.request.top_k"
GEN_AI_REQUEST_STOP_SEQUENCES = "gen_ai.request.stop_sequences"
GEN_AI_REQUEST_SEED = "gen_ai.request.seed"
GEN_AI_REQUEST_PRESENCE_PENALTY = "gen_ai.request.presence_penalty"
GEN_AI_REQUEST_FREQUENCY_PENALTY = "gen_ai.request.frequency_penalty"
GEN_AI_REQUEST_CHOICE_COUNT = "gen_ai.request.choice.count"
GEN_AI_REQUEST_ENCODING_FORMATS = "gen_ai.request.encoding_formats"
GEN_AI_EMBEDDINGS_DIMENSION_COUNT = "gen_ai.embeddings.dimension.count"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
# OpenLLMetry's name for the operation, read from spans other instrumentors made.
LLM_REQUEST_TYPE = "llm.request.type"

# -- a chain and a call ---------------------------------------------------------
CHAIN_ID = "veronica.chain.id"
DEPTH = "veronica.depth"
DECISION = "veronica.decision"  # "ALLOW" or "HALT"
AGENT = "veronica.agent"  # the agent whose own limit tripped, or who made the call
POOL = "veronica.pool"
COST_USD = "veronica.cost_usd"
STEPS = "veronica.steps"
RETRIES = "veronica.retries"
TOKENS = "veronica.tokens"
RESERVED_USD = "veronica.reserved_usd"
REMAINING_COST_USD = "veronica.remaining.cost_usd"
REMAINING_STEPS = "veronica.remaining.steps"
CLAMPED_MAX_TOKENS = "veronica.clamped.max_tokens"
FALLBACK_MODEL = "veronica.fallback_model"
BOUND_USD = "veronica.bound_usd"  # a bounded call: the bound reserved
UNPRICED = "veronica.unpriced"  # how to price a call that was refused unpriced
SIGNATURE = "veronica.signature"
BEDROCK_OPERATION = "veronica.bedrock.operation"

# -- trips and overrides (span events) ------------------------------------------
TRIP_EVENT = "veronica.trip"
TRIP_REASON = "veronica.trip.reason"
TRIP_LIMIT = "veronica.trip.limit"
TRIP_OBSERVED = "veronica.trip.observed"
TRIP_RETRY_AFTER_S = "veronica.trip.retry_after_s"
OVERRIDE_EVENT = "veronica.override"
OVERRIDE_APPLIED_EVENT = "veronica.override.applied"
OVERRIDE_REASON = "veronica.override.reason"
OVERRIDE_DURATION_S = "veronica.override.duration_s"
OVERRIDE_ADD_USD = "veronica.override.add_usd"
OVERRIDE_ADD_STEPS = "veronica.override.add_steps"

# -- metric point attributes ------------------------------------------------------
KIND = "veronica.kind"
OUTCOME = "veronica.outcome"
GRANT_REASON = "veronica.grant.reason"

# -- W3C baggage entries: what one service sends the next -----------------------
BAGGAGE_PREFIX = "veronica."  # every entry of ours starts so (stripped where not allowed)
BAGGAGE_CHAIN = "veronica.chain"
BAGGAGE_DEPTH = "veronica.depth"
BAGGAGE_GRANT = "veronica.grant"
