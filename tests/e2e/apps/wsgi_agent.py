"""A WSGI app making one LLM call per request, for gunicorn ``--preload``.

The client is made at import, in the master (``--preload``), as apps do.
Each request answers ``<pid> ok`` or ``<pid> refused``; the LLM request
carries ``x-worker: <pid>`` so the LLM server counts per worker.
"""

import os

import openai

client = openai.OpenAI(max_retries=0)


def application(environ, start_response):  # type: ignore[no-untyped-def]
    pid = os.getpid()
    try:
        client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-worker": str(pid)},
        )
        outcome = "ok"
    except Exception as exc:
        outcome = f"refused {type(exc).__name__}"
    start_response("200 OK", [("content-type", "text/plain")])
    return [f"{pid} {outcome}".encode()]
