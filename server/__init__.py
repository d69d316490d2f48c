"""The OpenAI-compatible HTTP server (FastAPI): protocol models, K3 chat rendering, reasoning and
tool-call parsing, streaming, metrics. (Filled in by the server issue.)"""
