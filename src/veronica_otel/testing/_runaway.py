"""The runaway model: a reply that always asks for another tool call.

An agent framework's loop ends when the model answers without a tool call.
A runaway model never does: every reply calls one of the tools the request
declares, with arguments built from its schema, so the loop runs until
something outside the model stops it (the framework's own cap, or ours).

The declared tools are read from any wire format the server speaks: OpenAI
chat (``tools[].function``), OpenAI Responses (``tools[]`` of type
``function``), Anthropic (``tools[]`` with ``input_schema``), Gemini
(``tools[].functionDeclarations``) and Bedrock Converse
(``toolConfig.tools[].toolSpec``). Tools that end a run by being called (a
framework's ``final_result`` / ``final_answer`` output tool) are called only
when nothing else is declared. A request that declares no tool gets the
ordinary reply: there is nothing to call.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ._common import ScriptedReply, ScriptedToolCall
from ._schema import dummy_from_schema

__all__ = ["RUNAWAY_HEADER", "declared_tools", "runaway_reply", "wants_runaway"]

RUNAWAY_HEADER = "x-fake-runaway"
"""Request header that turns the runaway model on (``1``) or off (``0``) for one request."""

_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"0", "false", "no", "off"})
_FINISHING = ("final_result", "final_answer")


def wants_runaway(default: bool, headers: Mapping[str, str]) -> bool:
    """Whether this request gets the runaway reply: its header, else the server's setting."""
    value = headers.get(RUNAWAY_HEADER, "").strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    return default


def _schema(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {"type": "object"}


def _function_tools(body: Mapping[str, Any]) -> Iterator[tuple[Any, Mapping[str, Any]]]:
    tools = body.get("tools")
    bedrock = body.get("toolConfig")
    if isinstance(bedrock, Mapping):
        tools = bedrock.get("tools")
    if not isinstance(tools, list):
        return
    for tool in tools:
        if not isinstance(tool, Mapping):
            continue
        function, spec = tool.get("function"), tool.get("toolSpec")
        declarations = tool.get("functionDeclarations") or tool.get("function_declarations")
        if isinstance(function, Mapping):  # OpenAI chat
            yield function.get("name"), _schema(function.get("parameters"))
        elif isinstance(spec, Mapping):  # Bedrock Converse
            schema = spec.get("inputSchema")
            yield (
                spec.get("name"),
                _schema(schema.get("json") if isinstance(schema, Mapping) else None),
            )
        elif isinstance(declarations, list):  # Gemini
            for item in declarations:
                if isinstance(item, Mapping):
                    schema = (
                        item.get("parametersJsonSchema")
                        or item.get("parameters_json_schema")  # as google-genai sends it
                        or item.get("parameters")
                    )
                    yield item.get("name"), _schema(schema)
        elif "input_schema" in tool:  # Anthropic (custom tools; server tools have none)
            yield tool.get("name"), _schema(tool["input_schema"])
        elif tool.get("type") == "function":  # OpenAI Responses
            yield tool.get("name"), _schema(tool.get("parameters"))


def declared_tools(body: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The function tools a request declares, in order: ``(name, JSON schema)``."""
    return [
        (name, schema) for name, schema in _function_tools(body) if isinstance(name, str) and name
    ]


def runaway_reply(body: Mapping[str, Any]) -> ScriptedReply | None:
    """A reply calling the first declared tool that does not end the run (None: no tool)."""
    tools = declared_tools(body)
    if not tools:
        return None
    going_on = [tool for tool in tools if not tool[0].startswith(_FINISHING)]
    name, schema = (going_on or tools)[0]
    arguments = dummy_from_schema(schema)
    if not isinstance(arguments, Mapping):
        arguments = {}
    return ScriptedReply(tool_calls=(ScriptedToolCall(name, arguments),))
