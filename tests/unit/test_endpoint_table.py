"""Every POST endpoint of the installed Stainless SDKs is in the endpoint table.

The test walks each client's resource tree as a user reaches it
(``client.images``, ``client.beta.threads.runs``, ...), reads the path every
public method posts to, and requires the path to be classified: billed per
token (the SDK's own reader), per unit, bounded, or free. A billable endpoint
added by the next SDK release fails here instead of passing uncounted.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Iterator
from typing import Any

import pytest

from veronica_otel.instrumentors._endpoints import (
    ANTHROPIC,
    FREE,
    OPENAI,
    REQUEST,
    TOKENS,
    classify,
)

# self._post("/path", ...) or self._post(path_template("/path/{id}", ...), ...)
_POST = re.compile(r"\._post\(\s*(?:path_template\(\s*)?f?\"([^\"]+)\"")


def _resources(root: Any, base: type, seen: set[type]) -> Iterator[tuple[str, Any]]:
    """Every resource reachable from ``root`` through its cached properties."""
    for name in sorted(dir(type(root))):
        if name.startswith(("_", "with_")):
            continue
        attribute = inspect.getattr_static(type(root), name, None)
        if not isinstance(attribute, functools.cached_property):
            continue
        value = getattr(root, name)
        if not isinstance(value, base) or type(value) in seen:
            continue
        seen.add(type(value))
        yield name, value
        for path, child in _resources(value, base, seen):
            yield f"{name}.{path}", child


Methods = list[tuple[str, str, str]]


def _methods(client: Any, base: type) -> Methods:
    """(``images``, ``generate``, its source) for every method of every resource."""
    return [
        (path, name, inspect.getsource(method))
        for path, resource in _resources(client, base, set())
        for name, method in inspect.getmembers(type(resource), inspect.isfunction)
    ]


# Each SDK's tree is walked (and every method's source read) once per process;
# the tests only read what the walk found.


@functools.cache
def _openai_methods() -> Methods:
    import openai
    from openai._resource import SyncAPIResource

    return _methods(openai.OpenAI(api_key="t", base_url="http://127.0.0.1:9"), SyncAPIResource)


@functools.cache
def _anthropic_methods() -> Methods:
    import anthropic
    from anthropic._resource import SyncAPIResource

    client = anthropic.Anthropic(api_key="t", base_url="http://127.0.0.1:9")
    return _methods(client, SyncAPIResource)


@functools.cache
def _groq_methods() -> Methods:
    groq = pytest.importorskip("groq")
    from groq._resource import SyncAPIResource

    return _methods(groq.Groq(api_key="t", base_url="http://127.0.0.1:9"), SyncAPIResource)


def _posts(methods: Methods) -> dict[str, str]:
    """Path template -> the first public method (``images.generate``) posting to it."""
    found: dict[str, str] = {}
    for path, name, source in methods:
        if name.startswith("_"):
            continue
        for template in _POST.findall(source):
            found.setdefault(template.split("?", 1)[0], f"{path}.{name}")
    return found


def _openai_posts() -> dict[str, str]:
    return _posts(_openai_methods())


def _anthropic_posts() -> dict[str, str]:
    return _posts(_anthropic_methods())


def _groq_posts() -> dict[str, str]:
    return _posts(_groq_methods())


def _unlisted(table: Any, posts: dict[str, str]) -> list[str]:
    missing = []
    for template, method in sorted(posts.items()):
        if template in table.templates or any(p in template for p in table.admin):
            continue
        if template.startswith("/openai/v1/") and template[10:] in table.templates:
            continue  # Groq's prefix
        missing.append(f"{method}: POST {template}")
    return missing


@pytest.mark.parametrize(
    ("table", "walk", "at_least"),
    [(OPENAI, _openai_posts, 100), (ANTHROPIC, _anthropic_posts, 50), (OPENAI, _groq_posts, 5)],
    ids=["openai", "anthropic", "groq"],
)
def test_every_post_endpoint_of_the_installed_sdk_is_classified(
    table: Any, walk: Any, at_least: int
) -> None:
    posts = walk()
    assert len(posts) >= at_least, "the walk found too few endpoints: the SDK layout changed"
    assert _unlisted(table, posts) == [], (
        "new POST endpoints: add each to instrumentors/_endpoints.py as billed per "
        "token, per unit, bounded (REQUEST) or free"
    )


def test_the_walk_reaches_the_endpoints_the_issue_saw_pass() -> None:
    posts = _openai_posts()
    for template, method in [
        ("/images/generations", "images.generate"),
        ("/images/edits", "images.edit"),
        ("/audio/speech", "audio.speech.create"),
        ("/audio/transcriptions", "audio.transcriptions.create"),
        ("/batches", "batches.create"),
        ("/responses/compact", "responses.compact"),
        ("/threads/{thread_id}/runs", "beta.threads.runs.create"),
        ("/videos", "videos.create"),
        ("/fine_tuning/jobs", "fine_tuning.jobs.create"),
    ]:
        assert template in posts, method
        assert classify(OPENAI, template).billed not in (FREE, TOKENS), method
    anthropic_posts = _anthropic_posts()
    assert classify(ANTHROPIC, "/v1/messages/batches").billed == REQUEST
    assert "/v1/messages/batches" in anthropic_posts


def test_every_public_method_posts_only_through_paths_we_read() -> None:
    """A method that posts without a literal path would escape the walk above."""
    unread = [
        f"{path}.{name}"
        for path, name, source in _openai_methods()
        if "._post(" in source and not _POST.search(source)
    ]
    assert unread == []


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/v1/images/generations", "images.generate"),
        ("/openai/deployments/my-dalle/images/generations", "images.generate"),  # Azure
        ("/openai/v1/audio/speech", "audio.speech.create"),  # Groq
        ("/v1/threads/thread_1/runs", "beta.threads.runs"),
        ("/v1/threads/runs", "beta.threads.runs"),
        ("/v1/threads/thread_1/runs/run_1/submit_tool_outputs", "beta.threads.runs"),
        ("/v1/threads/thread_1/runs/run_1/cancel", "/threads/{thread_id}/runs/{run_id}/cancel"),
        ("/v1/vector_stores/vs_1/file_batches", "/vector_stores/{vector_store_id}/file_batches"),
        ("/v1/batches", "batches"),
        ("/v1/batches/batch_1/cancel", "/batches/{batch_id}/cancel"),
    ],
)
def test_urls_are_classified_by_their_template(path: str, name: str) -> None:
    assert classify(OPENAI, path).name == name


def test_a_post_in_no_table_is_bounded_under_its_path() -> None:
    endpoint = classify(OPENAI, "/v1/holograms")
    assert endpoint.billed == REQUEST
    assert endpoint.name == "POST /v1/holograms"
    assert classify(OPENAI, "/v1/organization/projects/p1/users").billed == FREE
