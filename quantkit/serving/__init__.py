"""Serving engines as quantkit drives them: an OpenAI-compatible endpoint (client.py), vLLM's
server started and stopped by quantkit (vllm.py), and the process tree kept in check around it
(processes.py, watchdog.py). Nothing here imports an engine: it lives in its own environment and
is spoken to over HTTP on 127.0.0.1."""
