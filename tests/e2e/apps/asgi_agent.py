"""An ASGI app making one LLM call per request, for ``uvicorn --workers``.

Each request answers ``<pid> ok`` or ``<pid> refused``; the LLM request
carries ``x-worker: <pid>`` so the LLM server counts per worker.
"""

import os

import openai

client = openai.AsyncOpenAI(max_retries=0)


async def app(scope, receive, send):  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    pid = os.getpid()
    try:
        await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-worker": str(pid)},
        )
        outcome = "ok"
    except Exception as exc:
        outcome = f"refused {type(exc).__name__}"
    headers = [(b"content-type", b"text/plain")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": f"{pid} {outcome}".encode()})
