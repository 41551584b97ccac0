"""Start-up code: what runs before the app does, on top of the kernel.

``distro``: the ``veronica`` OpenTelemetry distro, configurator, instrumentor
and pre-instrument entry points (zero-code containment). ``policy_file``: the
declarative policy file and the process default chain that follows it
(public as :mod:`veronica_otel.policy_file`). ``_autostart``: what the
``veronica_otel_zero_code.pth`` start-up file calls.

Like the CLI, this sits on top: it imports the kernel, the instrumentors and
the exporters; the kernel never imports it. Importing this package imports
nothing, so the start-up file stays cheap.
"""
