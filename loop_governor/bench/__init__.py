"""The chaos benchmark: baseline vs framework built-ins vs governed, on virtual time.

``loop-governor bench`` runs the seeds' incidents (a 40-minute rate limit, a missing
document, invalid arguments, expiring credentials, a 30-minute outage, a 17-tool
workflow, a batch that crashes at step 18, five concurrent tasks on a flaky service) and
faults of the model call itself (a 429 storm on one API key, an exhausted quota, a 529
burst) through real LangChain ``create_agent`` agents and real crewAI crews, driven by
scripted model policies (obedient, stubborn, and one calibrated on recorded agent runs
by ``loop-governor bench calibrate``), plus a jitter ablation of the governor's backoff.
It is a simulation: it measures the system around a model, not a real model.
``--model PROVIDER:NAME`` puts a real OpenAI-compatible chat model in place of the
scripted policies ([`loop_governor.bench.real_model`][loop_governor.bench.real_model]). Framework imports happen only
when the benchmark runs.
"""
