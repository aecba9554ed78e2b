"""The chaos benchmark: baseline vs framework built-ins vs governed, on virtual time.

``loop-governor bench`` runs the seeds' incidents (a 40-minute rate limit, a missing
document, invalid arguments, expiring credentials, a 30-minute outage, a 17-tool
workflow, a batch that crashes at step 18, five concurrent tasks on a flaky service)
through real LangChain ``create_agent`` agents and real crewAI crews, driven by a
scripted model policy. It is a simulation: it measures the system around a model,
not a real model. Framework imports happen only when the benchmark runs.
"""
