"""`atomk31 bench`: the engine's and the server's benchmarks.

- serve: an HTTP client for any OpenAI-compatible server, as `vllm bench serve` (serve.py,
  serve_client.py, serve_metrics.py);
- latency: prefill time and decode step time in process, beside the roofline of each step
  (latency.py, roofline.py, ceilings.py, synthetic_context.py; --profile: op_profile.py);
- throughput: offline requests/s and tokens/s (throughput.py).
commands.py holds the flags; offline_report.py the tables and result files.
"""
