import importlib.util
import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "thorough", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# The live SGLang tests need sglang (and torch), which the suite does not install:
# `make test-sglang` runs them in the venv bench/peers/setup.sh builds. Not collected
# here rather than skipped, so the main run reports no skips.
collect_ignore = [] if importlib.util.find_spec("sglang") else ["adapters/test_sglang_live.py", "kit/test_kit_sglang_live.py"]
# The same for vLLM (`make test-vllm`).
if not importlib.util.find_spec("vllm"):
    collect_ignore += ["events/test_vllm_live.py", "kit/test_kit_vllm_live.py", "router/test_router_state_vllm.py"]
